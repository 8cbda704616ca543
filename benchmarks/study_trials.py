"""The simulations of a stored study's trials alone: every simulated trial's fully resolved
engine config simulated again on the study's trace, the CPU time of ``simulate()`` summed
(issue 30: the main job's 30 trials, without its start-up, storage, headroom runs or report).

    .venv/bin/python benchmarks/study_trials.py sqlite:///tune.db [--study NAME] [--repeat 3]
    .venv/bin/python benchmarks/study_trials.py --smoke

Make the study once (``tune run --slo p99_tpot=50ms --storage sqlite:///tune.db``, the main
job), then run this with each checkout's interpreter in turn: the same configs, so the
simulations are the same work (it prints their steps, and a digest of every request's record:
two checkouts that simulate alike print the same digest). Prints the median of ``--repeat``
passes over all the trials, and each pass.
``--smoke``: makes its own study in a temporary folder first (``tune run --slo p99_tpot=50ms
--trials 3 --max-requests 100 --no-report``: the main job's on the bundled sample's first 100
requests), then one pass over its trials (the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prefill_tuner.engines.sim import SimConfig, simulate
from prefill_tuner.engines.sim.cost_model import StepModel, profile_from_record
from prefill_tuner.errors import TunerError
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.summary import study_trace
from prefill_tuner.trace.model import Trace

TUNE = str(Path(sys.executable).with_name("tune"))
SMOKE_STUDY = ("--slo", "p99_tpot=50ms", "--trials", "3", "--max-requests", "100", "--no-report")


def stored_study(
    parser: argparse.ArgumentParser, storage: str, name: str | None
) -> tuple[TunerStore, StudyRecord, Trace]:
    """The study ``name`` (``None``: the only one stored) and its trace, or the parser's
    one-line error saying why not."""
    try:
        store = TunerStore(storage, create=False)
    except TunerError as exc:
        parser.error(str(exc))
    names = [name] if name else store.study_names()
    if len(names) != 1:
        parser.error(f"--study: one of {', '.join(names)}")
    record = store.get_study(names[0])
    if record is None:
        parser.error(f"--study: no study {names[0]}")
    trace, why = study_trace(record)
    if trace is None:
        parser.error(f"the study's trace: {why}")
    return store, record, trace


def simulated_trials(store: TunerStore, record: StudyRecord) -> list[tuple[SimConfig, StepModel]]:
    """Each simulated trial's fully resolved engine config and step-time profile, in order
    (trials that failed or ran on a real server left out)."""
    runs = []
    for trial in store.trials(record):
        resolved = dict(trial.resolved_config)
        if trial.status != "complete" or "profile" not in resolved:
            continue
        profile = profile_from_record(resolved.pop("profile"))
        fields = {k: v for k, v in resolved.items() if k in SimConfig.model_fields}
        runs.append((SimConfig(**fields), profile))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storage", nargs="?")
    parser.add_argument("--study", help="the study's name (default: the only one stored)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="make a small study and time it")
    args = parser.parse_args()
    if args.smoke:
        if args.storage is not None:
            parser.error("--smoke makes its own study: give no storage")
        with tempfile.TemporaryDirectory(prefix="study-trials-") as folder:
            storage = f"sqlite:///{Path(folder) / 'tune.db'}"
            made = subprocess.run(
                [TUNE, "run", *SMOKE_STUDY, "--storage", storage],
                cwd=folder,
                capture_output=True,
                text=True,
            )
            if made.returncode not in (0, 4):  # 4: no trial met the SLO, the study is stored
                raise SystemExit(f"tune run: {made.stderr.strip()[-2000:]}")
            args.storage, args.repeat = storage, 1
            measure(parser, args)
        return
    if args.storage is None:
        parser.error("the following arguments are required: storage")
    measure(parser, args)


def measure(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Simulate the stored study's trials ``args.repeat`` times; print what it took."""
    store, record, trace = stored_study(parser, args.storage, args.study)
    runs = simulated_trials(store, record)
    passes: list[float] = []
    for _ in range(args.repeat):
        digest, steps, spent = hashlib.sha256(), 0, 0.0
        for config, profile in runs:
            started = time.process_time()
            result = simulate(trace, config, profile)
            spent += time.process_time() - started
            steps += result.steps
            digest.update(repr(result.records).encode())
        passes.append(spent)
    print(
        f"{len(runs)} trials of study {record.name}: {steps:,} steps, CPU median "
        f"{statistics.median(passes):.3f} s ({', '.join(f'{p:.3f}' for p in passes)}); "
        f"records digest {digest.hexdigest()[:16]}"
    )


if __name__ == "__main__":
    main()
