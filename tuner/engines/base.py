"""What the study needs from an engine, whichever it is (simulator or real vLLM)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.metrics import RequestRecord, RunMetrics
from prefill_tuner.search_spaces.space import EngineCapabilities
from prefill_tuner.trace.model import Trace

if TYPE_CHECKING:
    from prefill_tuner.engines.sim.cost_model import StepModel


@dataclass(frozen=True)
class CutShort:
    """A replay stopped early because its SLO verdict could no longer change."""

    reason: str
    """Which SLO was already certain to be missed, and by how much."""
    at_s: float
    """Replay time when it was stopped."""
    schedule_s: float
    """The trace's last arrival: the full replay would have run at least this long."""
    lower_bounds: dict[str, float]
    """Statistic (``p99_ttft``) → a lower bound of the value the full replay would have had."""
    unfinished: int
    """Requests stopped before they finished (left out of the error count)."""

    @property
    def saved_s(self) -> float:
        """Engine time saved, at least (the drain after the last arrival is not counted)."""
        return max(self.schedule_s - self.at_s, 0.0)


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
    cut_short: CutShort | None = None
    """Set when the early-abort rule stopped the replay (the run is then infeasible)."""
    log_path: str | None = None
    """The server's log of this run (a real engine; kept when the server failed to start)."""
    startup_s: float | None = None
    """Seconds the server took to become healthy (a real engine)."""
    records: list[RequestRecord] | None = field(default=None, repr=False)
    """Every request's send and token times (a real engine; for calibration, never stored)."""
    overhead_s: dict[str, float] = field(default_factory=dict)
    """Where a real trial's time went: ``resolve``, ``start-up``, ``replay``, ``teardown``."""


class TrialEngine(Protocol):
    """An engine the study can run trials on."""

    capabilities: EngineCapabilities
    name: str
    server_args: tuple[str, ...]
    """The user's own server arguments, secrets redacted: serve lines include them."""
    version: str
    """What every trial records as the engine's version (``vllm --version``)."""
    about: tuple[str, ...]
    """Lines a study's header prints: what the engine's numbers can be trusted for (the
    simulator's profile, estimated or calibrated)."""
    deterministic: bool
    """The same trace and settings always give the same run (the simulator): one measurement
    of a setting is enough, and a study's trials must all come from one version."""
    starts_servers: bool
    """Each run starts a server (a real engine): minutes a trial, a log each; screening and
    ``tune verify`` are for such an engine."""
    live_knobs: tuple[str, ...]
    """The knobs its servers take while running: trials that change only these keep the
    last trial's server (a real engine's, :mod:`prefill_tuner.engines.real.live`); ``()``:
    none (the simulator starts no server)."""

    @property
    def profile(self) -> StepModel | None:
        """The step-time profile the engine's runs follow (the simulator's); ``None`` for a
        real server (a study may keep a stand-in profile for it: screening's, or given)."""
        ...

    def validate_fixed(self, fixed: dict[str, Any]) -> dict[str, Any]:
        """The ``--set`` values as the engine takes them (``0`` for a boolean: ``False``);
        :class:`TunerError` for one it cannot take."""
        ...

    def default_settings(self) -> dict[str, Any]:
        """The knob values the engine uses when none are given (the study's baseline)."""
        ...

    def max_model_len(self, fixed: dict[str, Any]) -> int:
        """The context length trials run with, given the user's fixed settings."""
        ...

    def run(
        self,
        trace: Trace,
        settings: dict[str, Any],
        early_abort: EarlyAbortRule | None = None,
        *,
        label: str | None = None,
        max_concurrency: int | None = None,
    ) -> EngineRun:
        """Replay the trace with these settings; an engine may stop early (and say so in
        :attr:`EngineRun.cut_short`) once ``early_abort`` finds the verdict certain.
        ``label`` names the run's files (``STUDY-trial-0003``), if the engine writes any.
        ``max_concurrency``: the client keeps at most that many requests in flight, each
        waiting one sent when a slot frees, in arrival order, and timed from its send (the
        trace's shaping, :attr:`ShapeOptions.max_concurrency`); ``None``: each request is sent
        at its arrival."""
        ...

    def close(self) -> None:
        """Stop what the engine keeps running between trials (a real engine's config helper
        process); the engine is not used after. Every command closes its engine when it ends,
        however it ends (``with contextlib.closing(engine)``)."""
        ...
