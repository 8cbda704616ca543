"""The early-abort rule is sound (it only stops runs that every future would fail, and its
bounds are below the final values) and useful (it stops hopeless runs early)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefill_tuner.objectives.early_abort import EarlyAbortRule, Snapshot
from prefill_tuner.objectives.metrics import RequestRecord, summarize_run
from prefill_tuner.objectives.scoring import judge, statistic
from prefill_tuner.objectives.slo import Slo

FAILED = "HTTP 500: boom"


@st.composite
def outcomes(draw: st.DrawFn) -> list[tuple[RequestRecord, float]]:
    """Finished runs: each request's final record and, for a failed one, when it failed."""
    runs = []
    for index in range(draw(st.integers(1, 25))):
        sent = draw(st.floats(0, 10))
        expected = draw(st.integers(1, 6))
        first = sent + draw(st.floats(0, 5))
        times = list(np.cumsum([first] + [draw(st.floats(0, 2)) for _ in range(expected - 1)]))
        failure = math.inf
        error = None
        if draw(st.booleans()) and draw(st.booleans()):
            kept = draw(st.integers(0, expected - 1))
            times = times[:kept]
            failure = (times[-1] if times else sent) + draw(st.floats(0, 3))
            error = FAILED
        runs.append((RequestRecord(str(index), sent, times, expected, error), failure))
    return runs


def snapshot_at(now: float, runs: list[tuple[RequestRecord, float]]) -> Snapshot:
    """What a replay of ``runs`` had seen at ``now``."""
    sent, first, last, tokens, failed = [], [], [], [], []
    for record, failure in runs:
        arrived = [t for t in record.token_times_s if t <= now]
        sent.append(record.sent_s if record.sent_s <= now else math.nan)
        first.append(arrived[0] if arrived else math.nan)
        last.append(arrived[-1] if arrived else math.nan)
        tokens.append(len(arrived))
        failed.append(failure <= now)
    return Snapshot(
        now_s=now,
        sent_s=np.array(sent),
        first_token_s=np.array(first),
        last_token_s=np.array(last),
        tokens=np.array(tokens),
        expected=np.array([record.expected_tokens for record, _ in runs]),
        failed=np.array(failed),
    )


slos_strategy = st.lists(
    st.builds(
        Slo,
        metric=st.sampled_from(["ttft", "tpot", "e2el"]),
        statistic=st.sampled_from(["p50", "p90", "p99", "p99.9", "mean", "max"]),
        limit_s=st.floats(0.05, 6),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda slo: slo.name,
)


SLOW_THEN_FAILED = [
    (RequestRecord("slow", 0.0, [], 3, FAILED), 6.0),  # no token by 5 s, fails at 6 s
    (RequestRecord("fast", 0.0, [0.1, 0.2, 0.3], 3), math.inf),
]


@settings(max_examples=400, deadline=None)
@given(
    runs=outcomes(),
    slos=slos_strategy,
    budget=st.sampled_from([0.0, 0.1, 0.3, 0.5]),
    now=st.floats(0, 25),
)
@example(SLOW_THEN_FAILED, [Slo("ttft", "max", 1.0)], 0.5, 5.0)  # budget lets "slow" fail
def test_an_abort_is_never_wrong(runs, slos, budget: float, now: float) -> None:
    rule = EarlyAbortRule(tuple(slos), budget)
    certainty = rule.check(snapshot_at(now, runs))
    final = summarize_run([record for record, _ in runs])
    if certainty is not None:
        assert not judge(final, slos, budget).feasible, certainty.reason
    allowed = math.floor(budget * len(runs) + 1e-9)
    if final.failed <= allowed:
        failed_now = sum(failure <= now for _, failure in runs)
        bounds = rule.lower_bounds(snapshot_at(now, runs), droppable=max(allowed - failed_now, 0))
        for name, bound in bounds.items():
            value = statistic(final, name)
            if not (math.isnan(bound) or math.isnan(value)):
                assert bound <= value + 1e-9, name


def test_a_hopeless_run_is_stopped_early_with_its_reason() -> None:
    # Ten requests sent at 0..9 s; the first six still have no token at 10 s.
    count = 10
    snapshot = Snapshot(
        now_s=10.0,
        sent_s=np.arange(count, dtype=float),
        first_token_s=np.array([math.nan] * 6 + [6.1, 7.1, 8.1, 9.1]),
        last_token_s=np.array([math.nan] * 6 + [6.1, 7.1, 8.1, 9.1]),
        tokens=np.array([0] * 6 + [1] * 4),
        expected=np.full(count, 8),
        failed=np.zeros(count, dtype=bool),
    )
    rule = EarlyAbortRule((Slo("ttft", "p90", 2.0),))
    certainty = rule.check(snapshot)
    assert certainty is not None and certainty.reason.startswith("p90_ttft ≥ ")
    # The six waiting requests have waited 10, 9, ..., 5 s; the other four had 0.1 s.
    expected = np.percentile([10, 9, 8, 7, 6, 5, 0.1, 0.1, 0.1, 0.1], 90)
    assert certainty.lower_bounds["p90_ttft"] == pytest.approx(expected)
    # With a limit the bounds do not reach yet, the run goes on.
    assert EarlyAbortRule((Slo("ttft", "p90", 20.0),)).check(snapshot) is None


def test_failures_past_the_error_budget_stop_the_run() -> None:
    count = 20
    failed = np.zeros(count, dtype=bool)
    failed[:3] = True
    snapshot = Snapshot(
        now_s=1.0,
        sent_s=np.zeros(count),
        first_token_s=np.full(count, math.nan),
        last_token_s=np.full(count, math.nan),
        tokens=np.zeros(count, dtype=int),
        expected=np.full(count, 4),
        failed=failed,
    )
    slos = (Slo("ttft", "p99", 60.0),)
    assert EarlyAbortRule(slos, error_budget=0.1).check(snapshot) is not None  # 3 > 2 allowed
    assert EarlyAbortRule(slos, error_budget=0.15).check(snapshot) is None  # 3 allowed
