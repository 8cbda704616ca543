"""Malformed input of any kind ends in the project's clear, located error, never a crash."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prefill_tuner.errors import TraceError
from prefill_tuner.trace import read_trace

from tests.conftest import AZURE, BURSTGPT, MOONCAKE

SEEDS = {
    "jsonl": b"".join(MOONCAKE.read_bytes().splitlines(keepends=True)[:4]),
    "azure": b"".join(AZURE.read_bytes().splitlines(keepends=True)[:4]),
    "burstgpt": b"".join(BURSTGPT.read_bytes().splitlines(keepends=True)[:4]),
}
FORMATS = [None, "jsonl", "azure", "burstgpt"]
NASTY = st.sampled_from(
    [
        b"",
        b"\n",
        b"\r\n",
        b",",
        b'"',
        b"{",
        b"}",
        b"[",
        b"-1",
        b"1e999",
        b"NaN",
        b"1.5",
        b"\x00",
        b"\xff",
        b"\xe2\x82",
        b"true",
        b"null",
        b"2023-13-45 25:61:61.1234567",
        b'"hash_ids": [-1]',
        b'"timestamp": "x"',
        b"9" * 400,
        b"9" * 5000,
        b"-" + b"9" * 5000,
        b"[" * 5000,
    ]
)


def outcome(data: bytes, format: str | None) -> None:
    """Read ``data``: a trace or a TraceError, and the error message is one line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.trace"
        path.write_bytes(data)
        try:
            read_trace(path, format)
        except TraceError as error:
            assert "\n" not in str(error)
            assert str(error).startswith(str(path)), str(error)


@settings(max_examples=150)
@given(st.binary(max_size=300), st.sampled_from(FORMATS))
def test_random_bytes(data: bytes, format: str | None) -> None:
    outcome(data, format)


@settings(max_examples=300)
@given(
    st.sampled_from(sorted(SEEDS)),
    st.integers(0, 400),
    st.integers(0, 40),
    st.one_of(NASTY, st.binary(max_size=20)),
    st.sampled_from(FORMATS),
)
def test_mutated_valid_files(
    kind: str, at: int, cut: int, insert: bytes, format: str | None
) -> None:
    seed = SEEDS[kind]
    at = at % (len(seed) + 1)
    outcome(seed[:at] + insert + seed[at + cut :], format)
