"""SLOs, metric definitions and percentiles: how a run is measured and judged.

One implementation for every engine (simulator or real vLLM): see docs/metrics.md.
"""
