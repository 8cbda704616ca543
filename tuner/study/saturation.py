"""Whether the recommended setting leaves the server saturated at the study's load: a TTFT no
SLO guards that is made of queueing, not of the requests' own work.

With only a TPOT SLO the optimiser is free to let requests queue for their first token: a
setting whose p99 TTFT is 33 s meets the SLOs, and its load headroom ("up to 2×") says nothing
about the queue, since no SLO watches it. The trace then needs a TTFT SLO (so the tuner trades
for it) or more replicas (``tune plan``).

**Criterion.** A request's TTFT is the time it waits in the queue plus its own prefill. What a
request takes *alone* on an idle engine is known without running anything: the per-request
floor of :func:`~prefill_tuner.study.infeasibility.latency_floor` (its uncached prompt
prefilled in one step, plus the front end's latency), the same bound ``tune plan`` counts
replicas with. An un-SLO'd TTFT objective (``p99_ttft``, or one class's) is **saturated** when
the recommended trial measured at least :data:`QUEUEING` times the same statistic of those
floors: at least nine tenths of what its requests waited was the queue. Why ten: for the
textbook single queue (M/M/1) every quantile of the time in the system is ``1 / (1 − ρ)``
times the same quantile of the service time, so a ratio of ten is a server busy 90% of the
time, where queues grow long on every burst; the bundled sample's recommendation measures 2.6×
(a server that keeps up), the Qwen3-32B example's 14× (a queue that builds for minutes).

Only TTFT is judged: a queue delays a request's first token; TPOT and ITL are measured after
it. A class-less TTFT that every traffic class has an SLO on is left to those SLOs (as the
recommendation rule leaves it: :func:`~prefill_tuner.study.recommend.left_to_classes`).
Nothing is said when the study's trace is not on this machine unchanged, or no step-time
profile is known (a real server's study without one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from prefill_tuner.engines.sim.cost_model import StepModel, profile_from_record
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.slo import Slo, format_seconds, parse_slos, split_name
from prefill_tuner.storage.batched import optuna_storage
from prefill_tuner.storage.models import TrialRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.infeasibility import latency_floor
from prefill_tuner.study.recommend import left_to_classes, traffic_classes
from prefill_tuner.study.screening import stand_in
from prefill_tuner.study.summary import StudySummary, study_trace
from prefill_tuner.trace.model import Trace

QUEUEING = 10.0
"""An un-SLO'd TTFT at least this many times its requests' own (alone) is saturated: see the
module's docs."""


@dataclass(frozen=True)
class Saturation:
    """One un-SLO'd TTFT objective of the recommendation that is mostly queueing."""

    objective: str
    """``p99_ttft`` or ``p99_ttft[interactive]``."""
    measured_s: float
    """The recommended trial's value."""
    alone_s: float
    """The same statistic of its requests, each alone on an idle engine."""

    @property
    def ratio(self) -> float:
        return self.measured_s / self.alone_s

    def line(self) -> str:
        """The warning and what to do, in one line."""
        return (
            f"warning: the server is saturated at this load: {self.objective} "
            f"{format_seconds(self.measured_s)} is {self.ratio:.0f}× what its requests take "
            f"alone ({format_seconds(self.alone_s)}): they wait in a queue, and no SLO guards "
            f"it (the load headroom above is the SLOs' only). Add an SLO on it "
            f"(--slo {self.objective}=LIMIT) so the tuner trades for it, or find the replicas "
            "this load needs with tune plan"
        )


def saturation(
    summary: StudySummary,
    trace: Trace,
    profile: StepModel,
    max_concurrency: int | None = None,
) -> list[Saturation]:
    """The recommendation's saturated un-SLO'd TTFT objectives (see the module's docs)."""
    trial = summary.recommended
    if trial is None:
        return []
    limits = {slo.name: slo.limit_s for slo in parse_slos(list(summary.study.slos))}
    classes = traffic_classes([t for t in (summary.baseline, trial) if t is not None])
    found = []
    for name in summary.objectives:
        slo = _unguarded_ttft(name, limits, classes)
        measured = trial.objectives.get(name)
        if slo is None or measured is None or not math.isfinite(measured):
            continue
        floors = latency_floor(trace, profile, (slo,), max_concurrency=max_concurrency)
        alone = floors[0].alone_s if floors else 0.0
        if alone > 0 and measured >= QUEUEING * alone:
            found.append(Saturation(name, measured, alone))
    return found


def _unguarded_ttft(name: str, limits: dict[str, float], classes: Sequence[str]) -> Slo | None:
    """Objective ``name`` as an SLO without a limit, if it is a TTFT no SLO guards."""
    try:
        statistic, metric, traffic_class = split_name(name)
    except ValueError:
        return None  # the load a capacity study carries
    if metric != "ttft" or name in limits or left_to_classes(name, classes, limits):
        return None
    return Slo(metric, statistic, math.inf, traffic_class)


def stored_saturation(
    store: TunerStore, summary: StudySummary, trace: Trace | None = None
) -> list[Saturation]:
    """:func:`saturation` of a stored study: its trace (``trace`` when the caller has it, else
    the stored one when this machine has it unchanged) and its step-time profile (the
    recommended trial's, when simulated; else the simulator standing in for the real server);
    none when either is missing."""
    trial = summary.recommended
    if trial is None or not _has_unguarded_ttft(summary):
        return []
    if trace is None:
        trace, _ = study_trace(summary.study)
    profile = _profile(store, summary, trial)
    if trace is None or profile is None:
        return []
    limit = (summary.study.shaping or {}).get("max_concurrency")
    return saturation(summary, trace, profile, limit)


def _has_unguarded_ttft(summary: StudySummary) -> bool:
    limits = {slo.name: slo.limit_s for slo in parse_slos(list(summary.study.slos))}
    return any(_unguarded_ttft(name, limits, ()) is not None for name in summary.objectives)


def _profile(store: TunerStore, summary: StudySummary, trial: TrialRecord) -> StepModel | None:
    stored = (trial.resolved_config or {}).get("profile")
    try:
        if stored is not None:
            return profile_from_record(stored)
        study = optuna.load_study(study_name=summary.study.name, storage=optuna_storage(store.url))
        engine = stand_in(store, study)
    except (TunerError, KeyError, ValueError):
        return None
    return engine.profile if engine is not None else None
