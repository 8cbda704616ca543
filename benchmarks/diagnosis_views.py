"""What the main job's diagnosis and report pay to see a simulated trial's steps: the trial
simulated again with every step recorded (``prefill_tuner.diagnosis.runs.trial_view``), CPU
seconds, for the study's baseline and its recommended trial (the two ``tune run`` rebuilds).

    .venv/bin/python benchmarks/diagnosis_views.py sqlite:///tune.db [--study NAME]
        [--repeat 5] [--trials 0 21]
    .venv/bin/python benchmarks/diagnosis_views.py --smoke

Make the study once (``tune run --slo p99_tpot=50ms --storage sqlite:///tune.db``, the main
job), then run this with each checkout's interpreter in turn. Prints per trial its steps and
the median CPU time over ``--repeat`` rebuilds (the view's cache cleared before each), then a
digest of every view's steps and request records: two checkouts that rebuild alike print the
same digest.

``--smoke`` (the suite runs it, so the script does not rot) makes its own study first, in a
temporary database: ``tune run --trials 2 --max-requests 20 --slo p99_tpot=50ms --no-report``
(the bundled sample's first 20 requests), then rebuilds its views once each.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time

from study_trials import stored_study  # (this folder's: run as a script)

from prefill_tuner.diagnosis import runs

SMOKE_STUDY = ["--trials", "2", "--max-requests", "20", "--slo", "p99_tpot=50ms", "--no-report"]
"""``--smoke``'s study: the main job's, on the bundled sample's first 20 requests, 2 trials."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storage", nargs="?")
    parser.add_argument("--study", help="the study's name (default: the only one stored)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--trials",
        type=int,
        nargs="+",
        help="trial numbers (default: 0, the baseline, and the recommended trial)",
    )
    parser.add_argument("--smoke", action="store_true", help="make a small study and view it")
    args = parser.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory() as folder:
            args.storage, args.repeat = f"sqlite:///{folder}/tune.db", 1
            command = [sys.executable, "-m", "prefill_tuner", "run", *SMOKE_STUDY]
            command += ["--storage", args.storage]
            done = subprocess.run(command, capture_output=True, text=True, cwd=folder)
            if done.returncode:
                sys.exit(f"the smoke study's tune run failed ({done.returncode}):\n{done.stderr}")
            views(parser, args)
    elif not args.storage:
        parser.error("the following arguments are required: storage")
    else:
        views(parser, args)


def views(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Rebuild the study's views and print what they cost and their digest."""
    store, record, trace = stored_study(parser, args.storage, args.study)
    trials = {trial.trial_number: trial for trial in store.trials(record)}
    numbers = args.trials or [0, *([record.headroom["recommended"]] if record.headroom else [])]
    digest = hashlib.sha256()
    for number in numbers:
        if number not in trials:
            parser.error(f"--trials: the study has no trial {number}")
        seconds = []
        for _ in range(args.repeat):
            runs._simulated_view.cache_clear()
            started = time.process_time()
            view = runs.trial_view(record, trials[number], trace)
            seconds.append(time.process_time() - started)
        for step in view.steps:
            digest.update(repr(dataclasses.astuple(step)).encode())
        for request in view.records:
            digest.update(repr((request.id, request.sent_s, list(request.token_times_s))).encode())
        print(
            f"trial {number}: {len(view.steps):,} steps; CPU median "
            f"{statistics.median(seconds):.3f} s (min {min(seconds):.3f}, n={args.repeat})"
        )
    print(f"digest {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
