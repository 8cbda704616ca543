"""What the study needs from an engine, whichever it is (simulator or real vLLM)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from objectives.metrics import RunMetrics
from search_spaces.space import EngineCapabilities
from tuner.trace.model import Trace


@dataclass
class EngineRun:
    """The outcome of replaying a trace on one engine configuration."""

    metrics: RunMetrics | None
    """``None`` when the engine could not run at all (failed start, rejected config)."""
    resolved_config: dict[str, Any]
    """Every setting the engine used, defaults included."""
    version: str
    failure: str | None = None
    """Why the run failed (a start failure, a crash, a stall), if it did."""
    details: dict[str, Any] = field(default_factory=dict)
    """Engine-specific extras worth storing (peak KV use, preemptions, prefix hits)."""


class TrialEngine(Protocol):
    """An engine the study can run trials on."""

    capabilities: EngineCapabilities
    name: str

    def validate_fixed(self, fixed: dict[str, Any]) -> None:
        """Raise :class:`TunerError` for a ``--set`` the engine cannot take."""
        ...

    def default_settings(self) -> dict[str, Any]:
        """The knob values the engine uses when none are given (the study's baseline)."""
        ...

    def max_model_len(self, fixed: dict[str, Any]) -> int:
        """The context length trials run with, given the user's fixed settings."""
        ...

    def run(self, trace: Trace, settings: dict[str, Any]) -> EngineRun:
        """Replay the trace with these settings."""
        ...
