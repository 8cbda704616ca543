"""Instructions one ``simulate()`` of each bundled 20-minute slice costs, counted by callgrind
(wall time on a shared machine varies by a factor of two; instruction counts do not).

    .venv/bin/python benchmarks/sim_instructions.py [--python OTHER/.venv/bin/python ...]
        [--max-requests N] [--rate-scale X] [--smoke]

Cases: ``benchmarks/sim_speed.py``'s (the Mooncake slice at rate ×0.1 with a 32K context, and
the Azure slice), each with async and synchronous scheduling, on the shipped
Llama-3.1-8B/H100 profile. For each interpreter given (each imports the simulator it was
installed with: a checkout of the code before a change, and this one), every case runs once
under ``valgrind --tool=callgrind`` with the simulation and once without it (the same imports
and trace loading); the difference is the simulation's instruction count. Under valgrind a
run takes about 60 times as long: ``--max-requests`` replays each slice's first N requests.
``--rate-scale`` multiplies the Azure slice's request rate (the Mooncake slice's ×0.1 with it).
``--smoke``: every case's child process once, simulating each slice's first 20 requests
(``--max-requests`` unless given), without valgrind, so without instruction counts: under
callgrind the imports alone take about 40 s (the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
CASES = ("mooncake", "azure")
SMOKE_REQUESTS = 20


def child(
    case: str, scheduling: str, simulate_it: bool, max_requests: int | None, rate: float
) -> None:
    """Load the case (and simulate it when asked): what callgrind counts."""
    from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
    from prefill_tuner.trace import ShapeOptions, load_trace

    profile = load_profile("llama-3.1-8b-h100")
    overrides: dict[str, object] = {"async_scheduling": scheduling == "async"}
    if case == "mooncake":
        options = ShapeOptions(
            rate_scale=0.1 * rate, max_model_len=32768, max_requests=max_requests
        )
        trace = load_trace(str(TRACES / "mooncake_conversation_head.jsonl"), options=options)
        overrides["max_model_len"] = 32768
    else:
        options = ShapeOptions(rate_scale=rate, max_requests=max_requests)
        trace = load_trace(str(TRACES / "azure_conv_2023_head.csv"), options=options)
    config = SimConfig(**{**profile.engine_defaults, **overrides})
    if simulate_it:
        result = simulate(trace, config, profile)
        print(result.steps, result.metrics.tpot_s["p99"])


def count(
    python: str,
    case: str,
    scheduling: str,
    simulate_it: bool,
    max_requests: int | None,
    rate: float,
) -> int:
    """Instructions callgrind counts for one child run."""
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/out",
                python,
                __file__,
                "--child",
                case,
                scheduling,
                "1" if simulate_it else "0",
                str(max_requests or 0),
                str(rate),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in callgrind's output:\n{run.stderr[-2000:]}")
    return int(found.group(1))


def smoke(
    pythons: list[str],
    cases: list[str] | tuple[str, ...],
    schedulings: list[str] | None,
    max_requests: int | None,
    rate: float,
) -> None:
    """Each case's child process, simulating, without valgrind."""
    why = "not installed" if shutil.which("valgrind") is None else "a callgrind run takes ~40 s"
    print(f"--smoke: the children run without valgrind ({why}): steps, no instruction counts")
    for case in cases:
        for scheduling in schedulings or ("async", "sync"):
            for python in pythons:
                run = subprocess.run(
                    [
                        python,
                        __file__,
                        "--child",
                        case,
                        scheduling,
                        "1",
                        str(max_requests or SMOKE_REQUESTS),
                        str(rate),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                steps, p99_tpot = run.stdout.split()
                print(
                    f"{case} x{rate:g}, {scheduling}, {python}: simulate() {int(steps):,} steps "
                    f"(p99 TPOT {float(p99_tpot) * 1000:.1f} ms), not counted",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python",
        action="append",
        help="an interpreter to count with (repeatable; default: this one)",
    )
    parser.add_argument("--case", choices=CASES, action="append")
    parser.add_argument("--scheduling", choices=("async", "sync"), action="append")
    parser.add_argument("--max-requests", type=int, help="replay each slice's first N requests")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.child:
        case, scheduling, simulate_it, max_requests, rate = args.child
        child(case, scheduling, simulate_it == "1", int(max_requests) or None, float(rate))
        return
    pythons = args.python or [sys.executable]
    if args.smoke:
        smoke(pythons, args.case or CASES, args.scheduling, args.max_requests, args.rate_scale)
        return
    for case in args.case or CASES:
        for scheduling in args.scheduling or ("async", "sync"):
            for python in pythons:
                base = count(python, case, scheduling, False, args.max_requests, args.rate_scale)
                total = count(python, case, scheduling, True, args.max_requests, args.rate_scale)
                print(
                    f"{case} x{args.rate_scale:g}, {scheduling}, {python}: simulate() "
                    f"{(total - base) / 1e9:.3f} G "
                    f"instructions (process {total / 1e9:.3f} G, without simulating "
                    f"{base / 1e9:.3f} G)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
