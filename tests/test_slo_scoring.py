"""SLO grammar, constraint values and objectives."""

from __future__ import annotations

import math

import pytest

from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.metrics import RequestRecord, summarize_run
from prefill_tuner.objectives.scoring import ERRORS, judge, latency_objectives
from prefill_tuner.objectives.slo import format_seconds, parse_slo, parse_slos


@pytest.mark.parametrize(
    ("text", "metric", "stat", "limit"),
    [
        ("p99_tpot=50ms", "tpot", "p99", 0.05),
        ("p95_ttft=2s", "ttft", "p95", 2.0),
        ("p99.9_itl=800us", "itl", "p99.9", 0.0008),
        ("mean_e2el=1.5s", "e2el", "mean", 1.5),
        ("MAX_TTFT=3S", "ttft", "max", 3.0),
        (" p50_tpot = 20ms ", "tpot", "p50", 0.02),
    ],
)
def test_slo_grammar(text: str, metric: str, stat: str, limit: float) -> None:
    slo = parse_slo(text)
    assert (slo.metric, slo.statistic) == (metric, stat)
    assert slo.limit_s == pytest.approx(limit)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("p99_tpot", "expected STAT_METRIC=VALUEUNIT"),
        ("p99_tpot=50", "expected"),
        ("p99_latency=50ms", "unknown metric"),
        ("p98_tpot=50ms", "unknown statistic"),
        ("p99_tpot=50min", "unknown unit"),
        ("p99_tpot=0ms", "positive"),
        ("p99_tpot=1..2ms", "positive"),
    ],
)
def test_bad_slos_are_one_line_errors(text: str, words: str) -> None:
    with pytest.raises(TunerError, match=words) as info:
        parse_slo(text)
    assert "\n" not in str(info.value)


def test_repeated_statistic_is_refused() -> None:
    with pytest.raises(TunerError, match="more than once"):
        parse_slos(["p99_tpot=50ms", "p99_tpot=40ms"])


def test_format_seconds() -> None:
    assert [format_seconds(v) for v in (2.0, 0.05, 0.0005)] == ["2s", "50ms", "500us"]


def _metrics(failed: int = 0):
    records = [
        RequestRecord(str(i), 0.0, [0.1 * (i + 1), 0.1 * (i + 1) + 0.01], 2) for i in range(10)
    ]
    records += [RequestRecord(f"f{i}", 0.0, [], 2, error="boom") for i in range(failed)]
    return summarize_run(records)


def test_constraints_are_relative_excess_and_failures_violate() -> None:
    slos = parse_slos(["p99_ttft=2s", "max_tpot=5ms"])
    verdict = judge(_metrics(), slos)
    assert verdict.constraints["p99_ttft"] == pytest.approx((0.991 - 2) / 2)
    assert verdict.constraints["max_tpot"] == pytest.approx((0.01 - 0.005) / 0.005)
    assert verdict.constraints[ERRORS] == 0.0
    assert not verdict.feasible and verdict.binding == "max_tpot"
    assert verdict.slacks["p99_ttft"] == pytest.approx(0.5045)
    failing = judge(_metrics(failed=1), parse_slos(["p99_ttft=2s"]))
    assert not failing.feasible and failing.constraints[ERRORS] == pytest.approx(1 / 11)
    allowed = judge(_metrics(failed=1), parse_slos(["p99_ttft=2s"]), error_budget=0.1)
    assert allowed.feasible


def test_nothing_measured_is_violated() -> None:
    metrics = summarize_run([RequestRecord("x", 0.0, [], 2, error="rejected")])
    verdict = judge(metrics, parse_slos(["p99_ttft=2s"]))
    assert verdict.constraints["p99_ttft"] > 0 and math.isfinite(verdict.constraints["p99_ttft"])


def test_latency_objectives_always_include_the_chunked_prefill_trade_off() -> None:
    names = [o.name for o in latency_objectives(parse_slos(["p95_itl=30ms", "p99_tpot=50ms"]))]
    assert names == ["p99_ttft", "p99_tpot", "p95_itl"]
