"""Judging one engine run: its verdict against the SLOs, its objective values, and (for
capacity studies) the highest rate multiplier at which it still meets every SLO."""

from __future__ import annotations

import math
from typing import Any

from prefill_tuner.engines.base import EngineRun, TrialEngine
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.scoring import (
    ERRORS,
    UNMEASURED,
    Verdict,
    bounded_statistic,
    judge,
)
from prefill_tuner.objectives.scoring import statistic as run_statistic
from prefill_tuner.objectives.slo import Slo
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.shaping import scale_rate


def objective_value(run: EngineRun, name: str) -> float:
    """A run's statistic; for a run cut short, at least the lower bound it was cut on."""
    if run.metrics is None:
        return math.nan
    measured = run_statistic(run.metrics, name)
    if run.cut_short is None:
        return measured
    return bounded_statistic(measured, run.cut_short.lower_bounds.get(name))


def verdict_of(run: EngineRun, slos: tuple[Slo, ...], error_budget: float) -> Verdict:
    """How a run fared against the SLOs; a run that failed never passes."""
    if run.metrics is None:
        constraints = {slo.name: UNMEASURED for slo in slos}
        constraints[ERRORS] = 1.0
        return Verdict(constraints=constraints, slacks={slo.name: -UNMEASURED for slo in slos})
    cut = run.cut_short
    verdict = judge(
        run.metrics,
        slos,
        error_budget,
        lower_bounds=cut.lower_bounds if cut else None,
        cut_short=cut.unfinished if cut else 0,
    )
    if run.failure and verdict.constraints[ERRORS] <= 0:
        verdict.constraints[ERRORS] = 1.0  # a failed engine never passes
    return verdict


def capacity_search(
    engine: TrialEngine,
    trace: Trace,
    settings: dict[str, Any],
    slos: tuple[Slo, ...],
    error_budget: float,
    tolerance: float,
    abort_rule: EarlyAbortRule | None = None,
    bounds: tuple[float, float] = (1 / 64, 64.0),
    label: str | None = None,
    max_concurrency: int | None = None,
) -> tuple[EngineRun, Verdict, float]:
    """The highest rate multiplier of ``trace`` at which every SLO holds, by doubling or
    halving from 1× to bracket it, then bisecting (geometrically) until ``hi / lo − 1 ≤
    tolerance``. Returns the run and verdict at that multiplier; 0 when even the lowest bound
    fails (then the run and verdict at the lowest bound). ``max_concurrency``: the client's
    limit every run replays under (the rate scales the arrivals, not the limit)."""

    def evaluate(multiplier: float) -> tuple[EngineRun, Verdict]:
        run = engine.run(
            scale_rate(trace, multiplier),
            settings,
            abort_rule,
            label=label,
            max_concurrency=max_concurrency,
        )
        return run, verdict_of(run, slos, error_budget)

    low_bound, high_bound = bounds
    multiplier = 1.0
    run, verdict = evaluate(multiplier)
    if verdict.feasible:
        good, good_run, good_verdict = multiplier, run, verdict
        bad = None
        while good < high_bound:
            candidate = min(good * 2, high_bound)
            run, verdict = evaluate(candidate)
            if not verdict.feasible:
                bad = candidate
                break
            good, good_run, good_verdict = candidate, run, verdict
        if bad is None:
            return good_run, good_verdict, good
    else:
        bad = multiplier
        while True:
            candidate = bad / 2
            if candidate < low_bound:
                return run, verdict, 0.0
            run, verdict = evaluate(candidate)
            if verdict.feasible:
                good, good_run, good_verdict = candidate, run, verdict
                break
            bad = candidate
    while bad / good - 1 > tolerance:
        middle = math.sqrt(good * bad)
        run, verdict = evaluate(middle)
        if verdict.feasible:
            good, good_run, good_verdict = middle, run, verdict
        else:
            bad = middle
    return good_run, good_verdict, good
