"""Which Pareto-optimal trial to recommend, by a rule that protects every objective the study
measured, not only those an SLO guards.

Each objective becomes a ratio where 1 is the bar: an SLO'd statistic against its limit
(0.5 = half the limit), any other against the engine's defaults (the baseline trial; 1.2 =
20% worse than the defaults). The recommendation is the trial whose *worst* ratio is smallest.
So with only a TPOT SLO, a setting that buys TPOT headroom nobody asked for by doubling TTFT
(ratio 2) loses to one that keeps TTFT at the defaults' level (ratio ≤ 1) whenever such a
setting is on the front; with every objective SLO'd it is the setting furthest inside all SLOs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from prefill_tuner.storage.models import TrialRecord

RULE = (
    "smallest worst ratio over every objective: an SLO'd one against its limit, any other "
    "against the engine defaults (the baseline); ties go to the next worst ratio, then the "
    "earlier trial"
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
    """What each objective is measured against: its SLO limit; else the baseline's value when
    the baseline ran (a failed one has none); else the best value on the front."""
    measured = baseline is not None and baseline.status != "failed"
    result: dict[str, float] = {}
    for name in objectives:
        if name in limits:
            result[name] = limits[name]
            continue
        value = baseline.objectives.get(name) if measured and baseline else None
        if value is None or not math.isfinite(value) or value <= 0:
            values = [t.objectives.get(name) for t in pareto]
            finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
            value = min(finite) if finite else None
        if value is not None:
            result[name] = value
    return result


def ratios(
    trial: TrialRecord,
    objectives: Sequence[str],
    directions: Sequence[str],
    reference: Mapping[str, float],
) -> dict[str, float]:
    """Objective → its ratio to the bar (≤ 1 is at least as good as the bar)."""
    result: dict[str, float] = {}
    for name, direction in zip(objectives, directions, strict=True):
        value, bar = trial.objectives.get(name), reference.get(name)
        if value is None or bar is None or not math.isfinite(value):
            continue
        if direction == "minimize":
            result[name] = value / bar
        else:
            result[name] = bar / value if value > 0 else math.inf
    return result


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
        key=lambda trial: rank_key(trial, objectives, directions, reference),
        default=None,
    )


def rank_key(
    trial: TrialRecord,
    objectives: Sequence[str],
    directions: Sequence[str],
    reference: Mapping[str, float],
) -> tuple[float, ...]:
    """:data:`RULE`'s order: the worst ratio first, then the next worst, then the earlier
    trial (smaller is better)."""
    values = ratios(trial, objectives, directions, reference).values()
    worst_first = sorted((round(v, PRECISION) for v in values), reverse=True)
    return (*worst_first, trial.trial_number)
