"""Engines that run a trial: the simulator of vLLM's scheduler (``sim``) and, later, real vLLM."""
