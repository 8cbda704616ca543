"""``tune diagnose``: read a run as an expert would (the symptom table of chunked-prefill
tuning: spikes, prefill starvation, KV thrashing, admission stalls, fragmented steps)."""

from prefill_tuner.diagnosis.detectors import DETECTORS, Finding, diagnose
from prefill_tuner.diagnosis.view import RunView, StepView, logged_view, simulated_view

__all__ = [
    "DETECTORS",
    "Finding",
    "RunView",
    "StepView",
    "diagnose",
    "logged_view",
    "simulated_view",
]
