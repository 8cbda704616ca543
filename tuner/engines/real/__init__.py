"""The real engine: a vLLM server per trial (launcher, replay), and questions answered by vLLM's own
code in its own Python (``tuner/engines/vllm_args.py``)."""
