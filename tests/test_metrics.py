"""Metric definitions (docs/metrics.md), shared by every engine."""

from __future__ import annotations

import numpy as np
import pytest

from prefill_tuner.objectives.metrics import RequestRecord, summarize_run
from prefill_tuner.objectives.percentiles import percentile, summarize


def test_definitions_match_vllm_bench() -> None:
    records = [
        RequestRecord("a", sent_s=0.0, token_times_s=[0.5, 0.6, 0.8], expected_tokens=3),
        RequestRecord("b", sent_s=1.0, token_times_s=[1.2, 1.3], expected_tokens=2),
        RequestRecord("c", sent_s=1.0, token_times_s=[2.0], expected_tokens=1),
    ]
    metrics = summarize_run(records)
    assert metrics.ttft_s["mean"] == pytest.approx((0.5 + 0.2 + 1.0) / 3)
    assert metrics.e2el_s["max"] == pytest.approx(1.0)
    # TPOT per request: a (0.8-0.5)/2, b (0.3-0.2)/1; c has one token and is left out.
    assert metrics.tpot_s["mean"] == pytest.approx((0.15 + 0.1) / 2)
    assert metrics.single_token_requests == 1
    # ITL pools every gap: 0.1, 0.2 (a) and 0.1 (b).
    assert metrics.itl_s["max"] == pytest.approx(0.2)
    assert metrics.itl_s["p50"] == pytest.approx(0.1)
    assert (metrics.completed, metrics.failed, metrics.output_tokens) == (3, 0, 6)
    assert metrics.duration_s == pytest.approx(2.0)
    assert metrics.request_throughput == pytest.approx(1.5)


def test_itl_times_chunks_as_vllm_bench_does() -> None:
    """``vllm bench serve`` records one ITL per streamed chunk: two tokens that arrived in one
    chunk (one arrival time) add no gap of 0, and TPOT still counts tokens."""
    records = [
        RequestRecord("a", sent_s=0.0, token_times_s=[0.5, 0.6, 0.6, 0.9], expected_tokens=4),
        RequestRecord("b", sent_s=0.0, token_times_s=[0.2, 0.2], expected_tokens=2),
    ]
    metrics = summarize_run(records)
    assert metrics.itl_s["max"] == pytest.approx(0.3)
    assert metrics.itl_s["p50"] == pytest.approx(0.2)  # the gaps 0.1 and 0.3 (a); none (b)
    assert metrics.tpot_s["mean"] == pytest.approx((0.4 / 3 + 0.0) / 2)


def test_failed_and_unfinished_requests_count_against_the_run() -> None:
    records = [
        RequestRecord("ok", 0.0, [0.1, 0.2], 2),
        RequestRecord("short", 0.0, [0.1], 5),
        RequestRecord("error", 0.0, [], 5, error="rejected: too long"),
    ]
    metrics = summarize_run(records)
    assert (metrics.completed, metrics.failed) == (1, 2)
    assert metrics.failure_reasons == {
        "unfinished (fewer tokens than expected)": 1,
        "rejected: too long": 1,
    }
    assert metrics.ttft_s["max"] == pytest.approx(0.1)  # latency only over completed ones


def test_percentiles_are_numpy_linear() -> None:
    values = np.arange(1, 101, dtype=float)
    assert percentile(values, 99) == pytest.approx(99.01)
    summary = summarize(values, (50.0, 99.9))
    assert set(summary) == {"mean", "p50", "p99.9", "max"}
    assert summary["p99.9"] == pytest.approx(np.percentile(values, 99.9))
    assert np.isnan(summarize([])["p50"]) and np.isnan(percentile([], 50))
