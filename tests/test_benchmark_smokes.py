"""Every benchmark script runs: its ``--smoke`` mode does the same work on the smallest honest
workload (each script's docstring says what it cuts), so an API change that breaks a
benchmark fails here, not months later when someone wants today's figure
(``benchmarks/RESULTS.md``). Each runs in a fresh folder, as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
OWN_TEST = {"gpu_truth.py": "tests/test_gpu_truth_benchmark.py"}
"""Benchmarks whose smoke mode a test of their own runs (with more checks)."""


def test_every_benchmark_has_a_smoke_mode() -> None:
    assert len(BENCHMARKS) >= 20
    for script in BENCHMARKS:
        text = script.read_text()
        assert "--smoke" in text.split('"""')[1], f"{script.name}: its docstring names no --smoke"


@pytest.mark.slow
@pytest.mark.parametrize(
    "script", [s for s in BENCHMARKS if s.name not in OWN_TEST], ids=lambda s: s.stem
)
def test_the_benchmark_runs(script: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), "--smoke"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TUNE_NO_REPORT": "1"},
    )
    assert done.returncode == 0, f"{script.name} --smoke failed:\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{script.name} --smoke printed nothing"
