"""The main job, ``tune run --slo p99_tpot=50ms`` on the bundled sample into a fresh database:
its wall and CPU time, and where the CPU goes (issue 30: < 10 s wall, < 12 s CPU, quiet
2-core machine).

    .venv/bin/python benchmarks/main_job.py [--rounds 3] [--smoke] [NAME=PYTHON ...]

Each ``NAME=PYTHON`` is an interpreter with the tuner installed (``before=/path/.venv/bin/python
after=.venv/bin/python`` compares two checkouts in one run; default: this one). Rounds are
interleaved (one run of each, then again), so a machine that gets busier slows both alike.
Prints per interpreter the median wall and CPU (user + system of the child, from
``getrusage``) over the plain runs, then one extra run under cProfile split by where the
functions live (their own time, a built-in's counted where it was called from, so the parts
add up): simulation (``engines/sim``), storage
(SQLAlchemy, sqlite3, psycopg, Optuna's storages, the tuner's ``storage``), Optuna (the rest of
it: samplers, study), other (the rest: start-up imports, trace reading, report). cProfile
inflates Python-heavy parts most; the split is shown as shares of the profiled time.
``--smoke``: one round, and each run's job cut to 2 trials on the bundled sample's first 60
requests with no report (``--trials 2 --max-requests 60 --no-report``): its times are not the
main job's (the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

PARTS = {
    "simulation": ("/engines/sim/",),
    "storage": (
        "/sqlalchemy/",
        "sqlite3",
        "/psycopg",
        "/optuna/storages/",
        "/storage/store.py",
        "/storage/batched.py",
        "/storage/models.py",
    ),
    "optuna": ("/optuna/",),
}


PROFILED = """
import cProfile, runpy, sys, time
path, sys.argv = sys.argv[1], ["tune", *sys.argv[2:]]
profiler = cProfile.Profile(time.process_time)
try:
    profiler.runcall(runpy.run_module, "prefill_tuner", run_name="__main__")
except SystemExit:
    pass
profiler.dump_stats(path)
"""
"""The main job under cProfile with a CPU clock (``python -c PROFILED OUT ARGS...``)."""

SMOKE_JOB = ("--trials", "2", "--max-requests", "60", "--no-report")
"""``--smoke``'s job: the main job, cut."""


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    python: str, folder: Path, profile: Path | None = None, extra: Sequence[str] = ()
) -> tuple[float, float]:
    """Wall and CPU seconds of one main job (with ``extra`` arguments), into a fresh database
    in ``folder``."""
    database = folder / f"job-{time.monotonic_ns()}.db"
    tune = [python, "-m", "prefill_tuner"]
    if profile is not None:  # CPU time per function: a busy machine's waits are no one's
        tune = [python, "-c", PROFILED, str(profile)]
    command = [*tune, "run", "--slo", "p99_tpot=50ms", "--storage", f"sqlite:///{database}"]
    command += extra
    cpu, started = _child_cpu(), time.perf_counter()
    subprocess.run(command, cwd=folder, check=True, capture_output=True)
    return time.perf_counter() - started, _child_cpu() - cpu


def _part(filename: str) -> str:
    return next((p for p, marks in PARTS.items() if any(m in filename for m in marks)), "other")


def split(profile: Path) -> dict[str, float]:
    """Own time per part of the profiled run: a function's by its file, a built-in's (``len``,
    a ``sqlite3`` call) by the file of each caller, in the share that caller gave it."""
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    parts = dict.fromkeys([*PARTS, "other"], 0.0)
    for (filename, _, name), (_, _, tottime, _, callers) in stats.items():
        if filename != "~":
            parts[_part(filename)] += tottime
            continue
        if "sqlite3" in name or not callers:  # the database's own work is storage's
            parts["storage" if "sqlite3" in name else "other"] += tottime
            continue
        for (caller, _, _), (_, _, share, _) in callers.items():
            parts[_part(caller) if caller != "~" else "other"] += share
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("pythons", nargs="*", default=[f"this={sys.executable}"])
    parser.add_argument(
        "--smoke", action="store_true", help="one round of a cut job (2 trials, 60 requests)"
    )
    args = parser.parse_args()
    extra = SMOKE_JOB if args.smoke else ()
    if args.smoke:
        args.rounds = min(args.rounds, 1)
    pythons = dict(item.split("=", 1) for item in args.pythons)
    walls: dict[str, list[float]] = {name: [] for name in pythons}
    cpus: dict[str, list[float]] = {name: [] for name in pythons}
    with tempfile.TemporaryDirectory(prefix="main-job-") as directory:
        folder = Path(directory)
        for _ in range(args.rounds):
            for name, python in pythons.items():
                wall, cpu = run_once(python, folder, extra=extra)
                walls[name].append(wall)
                cpus[name].append(cpu)
                print(f"  {name}: wall {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
        for name, python in pythons.items():
            profile = folder / f"{name}.prof"
            run_once(python, folder, profile, extra)
            parts = split(profile)
            total = sum(parts.values())
            shares = ", ".join(f"{part} {seconds / total:.0%}" for part, seconds in parts.items())
            timed = (
                f"wall median {statistics.median(walls[name]):.2f} s (min {min(walls[name]):.2f}), "
                f"CPU median {statistics.median(cpus[name]):.2f} s (min {min(cpus[name]):.2f}), "
                f"n={args.rounds}; "
                if args.rounds
                else ""
            )
            print(f"{name}: {timed}profiled (CPU) {total:.1f} s: {shares}", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
