"""The main job's simulations: ``tune run --slo p99_tpot=50ms`` on the bundled sample, with
every ``simulate()`` call timed (issue 30).

    .venv/bin/python benchmarks/main_job_sim.py [--python OTHER/.venv/bin/python ...] [--repeat 2]
        [--smoke]

Each interpreter given (each imports the simulator it was installed with) runs the job in a
fresh process and a fresh study database, ``--repeat`` times, the interpreters taking turns;
each run reports the job's wall and CPU time, and the simulations' share of them (their
count, steps, wall and CPU time: on a shared machine the CPU time varies less).
``--smoke``: one run per interpreter, of the job cut to 2 trials on the bundled sample's first
60 requests (``--trials 2 --max-requests 60``): its times are not the main job's (the suite
runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

SMOKE_JOB = ("--trials", "2", "--max-requests", "60")
"""``--smoke``'s job: the main job, cut."""


def child(storage: str, extra: list[str]) -> None:
    """Run the job (with ``extra`` arguments) in this process, timing every simulation."""
    from prefill_tuner.diagnosis import view
    from prefill_tuner.engines.sim import loop, trial_engine

    spent = {"calls": 0, "steps": 0, "wall_s": 0.0, "cpu_s": 0.0}
    original = loop.simulate

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        started, cpu = time.perf_counter(), time.process_time()
        result = original(*args, **kwargs)
        spent["wall_s"] += time.perf_counter() - started
        spent["cpu_s"] += time.process_time() - cpu
        spent["calls"] += 1
        spent["steps"] += result.steps
        return result

    for module in (loop, trial_engine, view):
        module.simulate = timed  # type: ignore[attr-defined]
    from prefill_tuner.cli import main as run

    sys.argv = ["tune", "run", "--slo", "p99_tpot=50ms", "--storage", storage, "--no-report"]
    sys.argv += extra
    started, cpu = time.perf_counter(), time.process_time()
    try:
        run()
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    spent["job_wall_s"] = time.perf_counter() - started
    spent["job_cpu_s"] = time.process_time() - cpu
    print(json.dumps(spent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="an interpreter (repeatable)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--smoke", action="store_true", help="one run of a cut job (2 trials, 60 requests)"
    )
    args = parser.parse_args()
    extra = list(SMOKE_JOB) if args.smoke else []
    if args.child:
        child(args.child, extra)
        return
    if args.smoke:
        args.repeat = min(args.repeat, 1)
    smoke = ["--smoke"] if args.smoke else []
    for turn in range(args.repeat):
        for python in args.python or [sys.executable]:
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run(
                    [python, __file__, "--child", f"sqlite:///{tmp}/study.db", *smoke],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=tmp,
                )
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"run {turn + 1}, {python}: job {row['job_wall_s']:.1f} s wall, "
                f"{row['job_cpu_s']:.1f} s CPU; its {row['calls']} simulations "
                f"{row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s CPU ({row['steps']:,} steps)",
                flush=True,
            )


if __name__ == "__main__":
    main()
