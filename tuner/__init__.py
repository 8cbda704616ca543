"""Auto-tuner for vLLM's chunked-prefill scheduler configuration.

The `tune` command line lives in :mod:`tuner.cli`; traces in :mod:`tuner.trace`.
"""

__version__ = "0.1.0"
