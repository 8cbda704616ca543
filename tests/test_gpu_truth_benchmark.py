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


def test_the_benchmark_replays_the_moe_runs() -> None:
    """Issue 44: the MiniMax-M2.5 runs on B200, their experts split or spread (expert
    parallel); the data-parallel-attention runs are left out, and counted."""
    moe = TRUTH.parent / "moe_minimax-m2.5_b200.csv"
    if not moe.is_file():
        pytest.skip(f"no shared GPU runs beside the checkout ({moe})")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_truth.py"), "--smoke", "--truth", str(moe)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "left out: 23 runs with data-parallel attention (not modelled)" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tp")]
    assert len(rows) == 3 and all(" fp8 " in row for row in rows)


def test_settings_the_runs_did_not_record_are_set_per_row() -> None:
    """``--set`` replays every row with engine settings computed from its own lengths and
    concurrency (here AIConfigurator's generated budget), and refuses anything but integer
    arithmetic on those names, in one line."""
    if not TRUTH.is_file():
        pytest.skip(f"no shared GPU runs beside the checkout ({TRUTH})")
    script = str(ROOT / "benchmarks" / "gpu_truth.py")
    rule = "max_num_batched_tokens=batch+isl+1500,max_num_seqs=batch"
    done = subprocess.run(
        [sys.executable, script, "--smoke", "--set", rule], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len([line for line in done.stdout.splitlines() if line.startswith("| tp")]) == 3
    # the budget decides how many 1,024-token prompts prefill together: with room for two and
    # a chunk, the smoke rows' (c = 8) groups are smaller than with vLLM's default (8,192:
    # all eight)
    default = subprocess.run(
        [sys.executable, script, "--smoke"], capture_output=True, text=True, timeout=120
    )
    together = [
        [float(line.split("|")[6]) for line in run.stdout.splitlines() if line.startswith("| tp")]
        for run in (done, default)
    ]
    assert all(capped < 3.0 < free for capped, free in zip(*together, strict=True))
    for bad in ("max_num_seqs=__import__('os')", "max_num_seqs=batch/2", "max_num_seqs=1.5"):
        refused = subprocess.run(
            [sys.executable, script, "--smoke", "--set", bad], capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert refused.returncode == 2
        assert "--set max_num_seqs: " in refused.stderr and "Traceback" not in refused.stderr
