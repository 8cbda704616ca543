"""Helpers of the worker tests: a tiny trace, a study created with ``--create-only``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefill_tuner.trace.native import write_native
from prefill_tuner.trace.synth import parse_mix, synthesize

SLOS = ("--slo", "p99_tpot=50ms", "--slo", "p99_ttft=2s")
STUDY = "shared"


def tiny_trace(directory: Path) -> Path:
    """Twenty requests: a simulated trial takes milliseconds."""
    path = directory / "tiny.jsonl"
    trace = synthesize(parse_mix("interactive=0.7,2048x64=0.3"), 8.0, count=20, seed=1)
    write_native(trace.requests, path)
    return path


def create_study(
    tune: Callable, storage: str, trace: Path, trials: int, *, rule_trials: bool = True
) -> None:
    code, out, err = tune(
        "run",
        "--trace",
        str(trace),
        *SLOS,
        "--trials",
        str(trials),
        "--storage",
        storage,
        "--study",
        STUDY,
        "--create-only",
        *([] if rule_trials else ["--no-rule-trials"]),
    )
    assert code == 0, err
    assert "recorded with a target" in err
    # The worker's command line, ready to paste (the storage URL has no password here).
    assert out.strip() == f"tune worker --study {STUDY} --storage {storage}"
