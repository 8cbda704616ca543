"""benchmarks/gpu_truth.py (issue 42's measure of the simulator against real GPU runs) runs:
its smoke mode replays three of the shared runs and prints their errors. The shared runs sit
beside the checkout (CI has a copy); without them the test says so and skips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT.parent / "shared" / "gpu-truth" / "dense_qwen3-32b_h100.csv"


def test_the_benchmark_replays_real_runs() -> None:
    if not TRUTH.is_file():
        pytest.skip(f"no shared GPU runs beside the checkout ({TRUTH})")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_truth.py"), "--smoke"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tp")]
    assert len(rows) == 3
    assert "TTFT |error|: median" in done.stdout and "TPOT |error|: median" in done.stdout
