"""Judging a run against the SLOs: constraint values for Optuna, slacks, and objectives.

Constraint values follow Optuna's convention: ≤ 0 means met. Each SLO's value is its relative
excess, ``(measured − limit) / limit``; failures get their own constraint, ``errors``: the
share of requests that failed minus the allowed error budget, so a run that loses requests
never looks good unless the user allows it (docs/metrics.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefill_tuner.objectives.metrics import RunMetrics
from prefill_tuner.objectives.slo import Slo, statistic_value

ERRORS = "errors"
"""Name of the failed-requests constraint."""
UNMEASURED = 1e3
"""Constraint value for a statistic that could not be measured (no completed request)."""


@dataclass(frozen=True, slots=True)
class Objective:
    """A statistic the study optimises."""

    name: str
    """``p99_ttft``, or ``rate_multiplier`` in capacity mode."""
    direction: str
    """``minimize`` or ``maximize``."""


def latency_objectives(slos: Sequence[Slo]) -> tuple[Objective, ...]:
    """p99 TTFT and p99 TPOT (the trade-off chunked prefill controls), then every other SLO'd
    statistic, all minimised."""
    names = ["p99_ttft", "p99_tpot"]
    names += [slo.name for slo in slos if slo.name not in names]
    return tuple(Objective(name, "minimize") for name in names)


def statistic(metrics: RunMetrics, name: str) -> float:
    """``p99_ttft`` → the run's p99 TTFT in seconds; ``p99_ttft[interactive]`` → that of the
    class's requests (NaN when the class has no completed request)."""
    return statistic_value(metrics, name)


@dataclass(frozen=True)
class Verdict:
    """How a run fared against the SLOs."""

    constraints: dict[str, float]
    """Name → Optuna constraint value (≤ 0 met), one per SLO plus ``errors``."""
    slacks: dict[str, float]
    """SLO name → relative headroom (0.2 = 20% under the limit; negative = violated)."""

    @property
    def feasible(self) -> bool:
        return all(value <= 0 for value in self.constraints.values())

    @property
    def binding(self) -> str:
        """The constraint closest to (or furthest past) its limit."""
        return max(self.constraints, key=lambda name: self.constraints[name])

    @property
    def min_slack(self) -> float:
        return min(self.slacks.values(), default=math.inf)


def judge(
    metrics: RunMetrics,
    slos: Sequence[Slo],
    error_budget: float = 0.0,
    lower_bounds: Mapping[str, float] | None = None,
    cut_short: int = 0,
) -> Verdict:
    """Constraint values and slacks of one run.

    A run cut short by the early-abort rule passes ``lower_bounds`` (statistic → a lower
    bound of its final value; each SLO is judged on the larger of bound and measurement) and
    ``cut_short``, the requests it never let finish (not failures of the engine)."""
    constraints: dict[str, float] = {}
    slacks: dict[str, float] = {}
    for slo in slos:
        value = bounded_statistic(slo.value(metrics), (lower_bounds or {}).get(slo.name))
        excess = UNMEASURED if math.isnan(value) else (value - slo.limit_s) / slo.limit_s
        constraints[slo.name] = min(excess, UNMEASURED)
        slacks[slo.name] = -constraints[slo.name]
    failed = metrics.failed - cut_short
    failed_share = failed / metrics.requests if metrics.requests else 1.0
    constraints[ERRORS] = failed_share - error_budget
    return Verdict(constraints=constraints, slacks=slacks)


def bounded_statistic(measured: float, lower_bound: float | None) -> float:
    """The larger of a measured statistic and a lower bound of its final value (either may be
    missing: NaN or None)."""
    candidates = [v for v in (measured, lower_bound) if v is not None and not math.isnan(v)]
    return max(candidates) if candidates else math.nan
