"""The scheduler knobs the tuner searches: ranges, per-version availability, validity rules
mirrored from vLLM, and rendering to ``vllm serve`` flags."""
