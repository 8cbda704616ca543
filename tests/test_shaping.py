"""Shaping: each operation's contract, and invariants over random traces (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from prefill_tuner.errors import TraceError
from prefill_tuner.trace import ShapeOptions, Trace, read_trace, shape
from prefill_tuner.trace.model import Request
from prefill_tuner.trace.shaping import clip, dequantize, detect_quantum, head, limit_length, window
from tests.conftest import MOONCAKE, requests_strategy


def counted(trace: Trace, action: str) -> int:
    return sum(a.count for a in trace.adjustments if a.action == action)


@given(requests_strategy(), st.floats(0, 5e4), st.floats(1e-3, 5e4))
def test_window_keeps_exactly_the_requests_inside_and_rebases(
    requests: tuple[Request, ...], start: float, duration: float
) -> None:
    trace = Trace(requests)
    shaped = window(trace, start, duration)
    inside = [r for r in requests if start <= r.arrival_s < start + duration]
    assert [r.id for r in shaped.requests] == [r.id for r in inside]
    assert all(0 <= r.arrival_s < duration + 1e-6 for r in shaped.requests)
    assert len(shaped) + counted(shaped, "dropped") == len(requests)


@given(requests_strategy(), st.floats(0.01, 100))
def test_rate_scaling_divides_every_arrival(requests: tuple[Request, ...], factor: float) -> None:
    shaped = shape(Trace(requests), ShapeOptions(rate_scale=factor))
    assert len(shaped) == len(requests)
    for before, after in zip(requests, shaped.requests, strict=True):
        assert after.arrival_s == pytest.approx(before.arrival_s / factor)
        assert (after.prompt_tokens, after.output_tokens) == (
            before.prompt_tokens,
            before.output_tokens,
        )


@given(requests_strategy(), st.integers(2, 300_000), st.sampled_from(["clip", "drop"]))
def test_length_limit_makes_every_request_fit_and_counts_it(
    requests: tuple[Request, ...], max_len: int, policy: str
) -> None:
    shaped = limit_length(Trace(requests), max_len, policy)  # type: ignore[arg-type]
    too_long = [r for r in requests if r.prompt_tokens + r.output_tokens > max_len]
    assert all(r.prompt_tokens + r.output_tokens <= max_len for r in shaped.requests)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in shaped.requests)
    if policy == "clip":
        assert len(shaped) == len(requests)
        assert counted(shaped, "clipped") == len(too_long)
    else:
        assert len(shaped) == len(requests) - len(too_long)
        assert counted(shaped, "dropped") == len(too_long)
    for request in shaped.requests:
        if request.prefix_blocks:
            assert len(request.prefix_blocks) <= -(
                -request.prompt_tokens // request.prefix_block_size
            )


def test_clip_keeps_output_and_leading_blocks() -> None:
    request = Request("a", 0.0, 2000, 100, (1, 2, 3, 4), 512)
    clipped = clip(request, 1124)
    assert (clipped.prompt_tokens, clipped.output_tokens) == (1024, 100)
    assert clipped.prefix_blocks == (1, 2)
    tiny = clip(Request("b", 0.0, 50, 5000, (), None), 100)
    assert (tiny.prompt_tokens, tiny.output_tokens) == (1, 99)


@given(requests_strategy(), st.floats(0.001, 10), st.integers(0, 2**32))
def test_dequantize_stays_inside_each_quantum_and_sorted(
    requests: tuple[Request, ...], quantum: float, seed: int
) -> None:
    shaped = dequantize(Trace(requests), quantum, seed=seed)
    original = {r.id: r.arrival_s for r in requests}
    arrivals = [r.arrival_s for r in shaped.requests]
    assert arrivals == sorted(arrivals)
    assert sorted(original) == sorted(r.id for r in shaped.requests)
    for request in shaped.requests:
        assert original[request.id] <= request.arrival_s < original[request.id] + quantum + 1e-9
    assert shaped == dequantize(Trace(requests), quantum, seed=seed)  # seeded


def test_dequantize_auto_on_mooncake() -> None:
    trace = read_trace(MOONCAKE)
    assert detect_quantum(trace) == pytest.approx(3.0, abs=0.01)
    spread = shape(trace, ShapeOptions(dequantize_s="auto", jitter_seed=7))
    assert len({r.arrival_s for r in spread.requests}) == len(trace)
    assert counted(spread, "jittered") == len(trace)


@given(requests_strategy(), st.integers(1, 40))
def test_head_keeps_the_earliest(requests: tuple[Request, ...], n: int) -> None:
    shaped = head(Trace(requests), n)
    assert shaped.requests == requests[:n]
    assert counted(shaped, "dropped") == max(0, len(requests) - n)


def test_shape_applies_in_order_and_refuses_an_empty_result() -> None:
    trace = read_trace(MOONCAKE)
    options = ShapeOptions(
        start_s=60, duration_s=120, rate_scale=0.5, max_model_len=32768, max_requests=100
    )
    shaped = shape(trace, options)
    assert len(shaped) == 100
    assert all(r.arrival_s < 240 for r in shaped.requests)  # 120 s window stretched twofold
    assert all(r.prompt_tokens + r.output_tokens <= 32768 for r in shaped.requests)
    with pytest.raises(TraceError, match="no requests"):
        shape(trace, ShapeOptions(start_s=1e6))


@pytest.mark.parametrize(
    "bad",
    [
        {"rate_scale": 0},
        {"duration_s": -1},
        {"dequantize_s": -1.0},
        {"dequantize_s": math.inf},
        {"over_length": "trim"},
        {"max_model_len": 1},
        {"surprise": 1},
    ],
)
def test_shape_options_validate(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ShapeOptions(**bad)  # type: ignore[arg-type]
