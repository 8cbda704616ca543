"""Which Pareto-optimal trial to recommend, by a rule that protects every objective the study
measured, not only those an SLO guards.

Each objective becomes a ratio where 1 is the bar: an SLO'd statistic against its limit
(0.5 = half the limit), any other against the engine's defaults (the baseline trial; 1.2 =
20% worse than the defaults). The recommendation is the trial whose *worst* ratio is smallest.
So with only a TPOT SLO, a setting that buys TPOT headroom nobody asked for by doubling TTFT
(ratio 2) loses to one that keeps TTFT at the defaults' level (ratio ≤ 1) whenever such a
setting is on the front; with every objective SLO'd it is the setting furthest inside all SLOs.

A class-less statistic that every traffic class has an SLO on (and every request has a class)
is left to those SLOs: with ``p99_ttft[interactive]=300ms`` and ``p99_ttft[longdoc]=2s`` the
user allowed documents to wait up to 2 s, and the whole trace's p99 TTFT, which the documents
decide, held to the defaults' level would undo that trade (it picked the setting with the least
room for the chats).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from prefill_tuner.storage.models import TrialRecord

RULE = (
    "smallest worst ratio over every objective: an SLO'd one against its limit, any other "
    "against the engine defaults (the baseline), unless every traffic class has an SLO on it; "
    "ties go to the next worst ratio, then the earlier trial"
)
"""The rule, as every output that names a recommendation states it."""

PRECISION = 2
"""Ratios are compared to the percent: finer differences are measurement noise."""


def references(
    objectives: Sequence[str],
    pareto: Sequence[TrialRecord],
    baseline: TrialRecord | None,
    limits: Mapping[str, float],
) -> dict[str, float]:
    """What each objective is measured against: its SLO limit; else nothing when each traffic
    class has its own SLO on it (:func:`left_to_classes`); else the baseline's value when the
    baseline ran (a failed one has none); else the best value on the front."""
    measured = baseline is not None and baseline.status != "failed"
    classes = traffic_classes([t for t in (baseline, *pareto) if t is not None])
    result: dict[str, float] = {}
    for name in objectives:
        if name in limits:
            result[name] = limits[name]
            continue
        if left_to_classes(name, classes, limits):
            continue
        value = baseline.objectives.get(name) if measured and baseline else None
        if value is None or not math.isfinite(value) or value <= 0:
            values = [t.objectives.get(name) for t in pareto]
            finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
            value = min(finite) if finite else None
        if value is not None:
            result[name] = value
    return result


def traffic_classes(trials: Sequence[TrialRecord]) -> tuple[str, ...]:
    """The trace's traffic classes, from a trial that measured them; empty when some request
    has no class (the class SLOs then leave those requests unprotected)."""
    for trial in trials:
        metrics = trial.metrics or {}
        by_class = metrics.get("by_class") or {}
        if by_class and metrics.get("requests") is not None:
            classed = sum(int(own.get("requests") or 0) for own in by_class.values())
            return tuple(sorted(by_class)) if classed == metrics["requests"] else ()
    return ()


def left_to_classes(name: str, classes: Sequence[str], limits: Mapping[str, float]) -> bool:
    """Whether class-less objective ``name`` (``p99_ttft``) has an SLO in every one of the
    trace's ``classes`` (``p99_ttft[interactive]``, ...): those limits say how much of it each
    class may have, so it gets no bar of its own."""
    return bool(classes) and all(f"{name}[{cls}]" in limits for cls in classes)


def ratios(
    trial: TrialRecord,
    objectives: Sequence[str],
    directions: Sequence[str],
    reference: Mapping[str, float],
    windowed: Collection[str] = (),
) -> dict[str, float]:
    """Objective → its ratio to the bar (≤ 1 is at least as good as the bar). For the
    objectives in ``windowed`` (the SLO'd ones), the worst of the whole trace's value and
    every judge window's (:mod:`prefill_tuner.study.windows`)."""
    result: dict[str, float] = {}
    for name, direction in zip(objectives, directions, strict=True):
        value, bar = trial.objectives.get(name), reference.get(name)
        if name in windowed and value is not None and direction == "minimize":
            value = max([value, *window_values(trial, name)])
        if value is None or bar is None or not math.isfinite(value):
            continue
        if direction == "minimize":
            result[name] = value / bar
        else:
            result[name] = bar / value if value > 0 else math.inf
    return result


def window_values(trial: TrialRecord, name: str) -> list[float]:
    """What each judge window measured of objective ``name`` (finite values only)."""
    windows = ((trial.metrics or {}).get("details") or {}).get("windows") or {}
    values = [(own.get("objectives") or {}).get(name) for own in windows.values()]
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def recommend(
    pareto: Sequence[TrialRecord],
    baseline: TrialRecord | None,
    objectives: Sequence[str],
    directions: Sequence[str],
    limits: Mapping[str, float],
) -> TrialRecord | None:
    """The trial :data:`RULE` picks from the Pareto front (``None`` when it is empty)."""
    reference = references(objectives, pareto, baseline, limits)
    return min(
        pareto,
        key=lambda trial: rank_key(trial, objectives, directions, reference, tuple(limits)),
        default=None,
    )


def rank_key(
    trial: TrialRecord,
    objectives: Sequence[str],
    directions: Sequence[str],
    reference: Mapping[str, float],
    windowed: Collection[str] = (),
) -> tuple[float, ...]:
    """:data:`RULE`'s order: the worst ratio first, then the next worst, then the earlier
    trial (smaller is better)."""
    values = ratios(trial, objectives, directions, reference, windowed).values()
    worst_first = sorted((round(v, PRECISION) for v in values), reverse=True)
    return (*worst_first, trial.trial_number)
