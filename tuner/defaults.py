"""Every user-facing default, in one place: the command line and the library read them here."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

PROFILE = "llama-3.1-8b-h100"
"""The simulator's step-time profile (shipped with the package)."""
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
"""The model named in serve lines (and served by ``--engine vllm``)."""
STORAGE = "sqlite:///tune.db"
"""Where studies are kept: an SQLite file in the working directory."""
LOG_DIR = Path("tune-logs")
"""Where a real engine's per-trial server logs and step traces go."""
HANG_TIMEOUT_S = 120.0
"""A real trial fails when requests are in flight but no token arrives for this long."""
TRIALS = 30
"""Trials of a study (or of one night)."""
MAX_TRIALS = 1_000_000
"""The most trials a study may ask for (more would never finish; 10**20 overflowed SQLite)."""
MAX_SEED = 2**32 - 1
"""Seeds go to numpy and Optuna, which take 0..2**32-1."""
OBJECTIVE: Literal["latency", "capacity"] = "latency"
SAMPLER: Literal["tpe", "random"] = "tpe"
STARTUP_TRIALS = 8
"""Trials TPE samples at random before it models the results (the baseline included)."""
RULE_TRIALS = True
"""Latency studies run a few rule-derived settings after the baseline (tuner/study/first_trials.py;
benchmarks/RESULTS.md, issue 17)."""
ROUTER = "least-outstanding"
"""``tune plan``'s router in front of the replicas."""
MAX_REPLICAS = 16
"""The most replicas ``tune plan`` considers."""
PLAN_TRIALS = 20
"""``tune plan``'s trials per replica count (a count none of them meets is not met)."""
CAPACITY_TOLERANCE = 0.05
"""Relative precision of the capacity bisection."""
MIN_GAIN = 0.05
"""Least median gain in headroom (share of the tightest SLO limit) worth a nightly promotion."""
REPEATS = 3
"""Runs of the incumbent and of the challenger in a night (1 on the deterministic simulator)."""
REPORT_DIR = Path("nightly-reports")
HEARTBEAT_S = 15
"""Seconds between a worker's heartbeats."""
GRACE_S = 60
"""Seconds without a heartbeat after which a worker is taken for dead."""
MAX_HEARTBEAT_S = 3600
"""The longest interval between heartbeats (an hour)."""
MAX_GRACE_S = 7 * 86_400
"""The longest a worker may be silent before it is taken for dead (a week)."""
MAX_REPEATS = 100
"""The most runs of each setting a night makes."""

SAMPLE_TRACE = Path(__file__).resolve().parent / "data" / "sample_trace.jsonl"
"""The trace ``tune run`` replays when none is given: the first 4 minutes of the Mooncake
conversation trace at 0.3× its rate (see ``data/README.md``)."""
SAMPLE_DESCRIPTION = "4 minutes of the Mooncake conversation trace, at 0.3× its rate"
"""What ``tune run`` says the bundled sample is."""


def report_path(study: str) -> Path:
    """Where ``tune run`` and ``tune report`` write a study's HTML report by default."""
    return Path(f"{study}-report.html")


GPU_MEMORY_UTILIZATION = 0.92
"""vLLM's default ``gpu_memory_utilization`` (``CacheConfig``; 0.9 before vLLM 0.20): the
share of GPU memory a simulated server's KV pool is sized from."""
