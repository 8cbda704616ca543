"""Fitting the simulator's step-time profile to a real vLLM server (``tune calibrate``)."""
