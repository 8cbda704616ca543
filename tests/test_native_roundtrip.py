"""The native format round-trips every request; conversions from other formats lose nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from prefill_tuner.trace import read_trace
from prefill_tuner.trace.model import Request
from prefill_tuner.trace.native import native_lines, write_native
from tests.conftest import AZURE, BURSTGPT, MOONCAKE, requests_strategy


def roundtrip(requests: tuple[Request, ...], directory: Path) -> tuple[Request, ...]:
    path = directory / "t.jsonl"
    write_native(requests, path)
    return read_trace(path).requests


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests_strategy())
def test_native_roundtrip_preserves_requests(requests: tuple[Request, ...]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        back = roundtrip(requests, Path(tmp))
        assert len(back) == len(requests)
        for before, after in zip(requests, back, strict=True):
            assert after.arrival_s == pytest.approx(before.arrival_s, abs=1e-6)  # µs precision
            assert (
                after.id,
                after.prompt_tokens,
                after.output_tokens,
                after.prefix_blocks,
                after.prefix_block_size,
                after.traffic_class,
            ) == (
                before.id,
                before.prompt_tokens,
                before.output_tokens,
                before.prefix_blocks,
                before.prefix_block_size,
                before.traffic_class,
            )
        # Once written, the bytes are a fixed point.
        assert list(native_lines(back)) == list(native_lines(roundtrip(back, Path(tmp))))


@pytest.mark.parametrize("source", [MOONCAKE, AZURE, BURSTGPT], ids=lambda p: p.name)
def test_conversion_of_bundled_traces_is_exact(source: Path, tmp_path: Path) -> None:
    original = read_trace(source)
    back = roundtrip(original.requests, tmp_path)
    assert [(r.id, r.prompt_tokens, r.output_tokens, r.prefix_blocks) for r in back] == [
        (r.id, r.prompt_tokens, r.output_tokens, r.prefix_blocks) for r in original.requests
    ]
    assert (
        max(abs(a.arrival_s - b.arrival_s) for a, b in zip(back, original.requests, strict=True))
        <= 5e-7
    )


def test_mooncake_lines_stay_mooncake() -> None:
    """Tools that read only Mooncake's fields see the same values they would in the original."""
    first = next(native_lines(read_trace(MOONCAKE).requests))
    assert first.startswith(
        '{"id": "0", "timestamp": 0, "input_length": 6758, '
        '"output_length": 500, "hash_ids": [0, 1, 2'
    )
    assert "block_size" not in first
