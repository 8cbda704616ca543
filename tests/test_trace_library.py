"""The bundled slices are the published ones, and our readers reproduce their published numbers.

Expected values are those docs/traces.md records (rounded as printed there).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from prefill_tuner.trace import read_trace
from prefill_tuner.trace.stats import trace_stats
from tests.conftest import AZURE, BURSTGPT, MOONCAKE

SHA256 = {
    AZURE: "633d22f7f0eccb681096ed4ede197083ac674f373174aad34a7a1a7b81b63954",
    MOONCAKE: "ab71efeba81ff533d3874e39b243e448d3cd2d5e8c8191de53aad7a5bb2d029c",
    BURSTGPT: "7865fda5dac50938a84dfccb06c405e2f5202969ecfbd671c8399de00f4335f0",
}


@pytest.mark.parametrize("path", list(SHA256), ids=lambda p: Path(p).name)
def test_bundled_slices_are_byte_identical_to_the_published_ones(path: Path) -> None:
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256[path]
    assert read_trace(path).source.sha256 == SHA256[path]


def _close(value: float, printed: float, unit: float) -> bool:
    """``value`` rounds to ``printed`` at the precision it was printed with."""
    return abs(value - printed) <= unit / 2 + 1e-9


def test_mooncake_slice_statistics() -> None:
    trace = read_trace(MOONCAKE)
    stats = trace_stats(trace)
    assert trace.source.format == "jsonl"
    assert stats.requests == 3658
    assert trace.adjustments == ()
    assert _close(stats.duration_s, 1200, 1)
    assert _close(stats.mean_rate, 3.05, 0.01)
    assert _close(stats.index_of_dispersion, 7.1, 0.1)
    assert stats.max_per_second == 19
    for key, printed in {"p50": 7888, "p90": 29091, "p99": 94862, "max": 123192}.items():
        assert _close(stats.prompt_tokens[key], printed, 1), key  # p50 is 7,888.5
    assert _close(stats.prompt_tokens["mean"], 13403, 1)
    for key, printed in {"p50": 358, "p90": 606, "p99": 1161, "max": 2000}.items():
        assert _close(stats.output_tokens[key], printed, 1), key  # p50 is 358.5
    # SOURCES.md prints the output mean as 349; it is 1,274,811 / 3,658 = 348.4995.
    assert stats.output_tokens["mean"] == pytest.approx(348.4995, abs=1e-4)
    assert _close(stats.prompt_tokens_per_s / 1000, 40.9, 0.1)
    assert _close(stats.output_tokens_per_s / 1000, 1.06, 0.01)
    assert stats.prefix_reuse is not None and _close(stats.prefix_reuse * 100, 31.8, 0.1)
    assert all(r.prefix_block_size == 512 for r in trace.requests)
    assert all(len(r.prefix_blocks) == -(-r.prompt_tokens // 512) for r in trace.requests)


def test_azure_slice_statistics() -> None:
    trace = read_trace(AZURE)
    stats = trace_stats(trace)
    assert trace.source.format == "azure"
    assert stats.requests == 5985
    assert trace.adjustments == ()
    assert trace.requests[0].arrival_s == 0.0
    # 18:15:46.6805900 → 18:15:50.9951690 exactly, in 100 ns ticks.
    assert trace.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-12)
    assert _close(stats.duration_s, 1199.7, 0.1)
    assert _close(stats.mean_rate, 4.99, 0.01)
    assert _close(stats.index_of_dispersion, 1.16, 0.01)
    assert stats.max_per_second == 15
    expected_prompt = {"p50": 1042, "p90": 2375, "p99": 4107, "max": 14050, "mean": 1150}
    for key, printed in expected_prompt.items():
        assert _close(stats.prompt_tokens[key], printed, 1), key
    expected_output = {"p50": 202, "p90": 429, "p99": 625, "max": 1000, "mean": 253}
    for key, printed in expected_output.items():
        assert _close(stats.output_tokens[key], printed, 1), key
    assert _close(stats.prompt_tokens_per_s / 1000, 5.7, 0.1)
    assert _close(stats.output_tokens_per_s / 1000, 1.26, 0.01)
    assert stats.prefix_reuse is None


def test_burstgpt_slice_drops_and_counts_failed_requests() -> None:
    trace = read_trace(BURSTGPT)
    assert trace.source.format == "burstgpt"
    assert len(trace) == 400 - 17
    assert [(a.action, a.count) for a in trace.adjustments] == [("dropped", 17)]
    assert "0 response tokens" in trace.adjustments[0].reason
    # Arrivals re-based to the first row (Timestamp 5 s); the last row is at 37,274 s.
    assert trace.requests[0].arrival_s == 0.0
    assert trace.requests[-1].arrival_s == 37269.0
    assert trace.requests[-1].id == "399"


def test_stats_command_prints_the_published_numbers(tune) -> None:
    code, out, err = tune("trace", "stats", str(MOONCAKE))
    assert code == 0, err
    for text in (
        "3,658",
        "3.05 req/s",
        "7.11",
        "7,888",
        "29,091",
        "94,862",
        "123,192",
        "1,161",
        "40.9k prompt tok/s",
        "31.8%",
    ):
        assert text in out, text
    code, out, err = tune("trace", "stats", str(AZURE))
    assert code == 0, err
    for text in ("5,985", "4.99 req/s", "1.16", "1,042", "2,375", "4,107", "14,050", "625"):
        assert text in out, text
