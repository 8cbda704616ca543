"""How the simulator's cost grows with load and with trace length (issue 17).

    .venv/bin/python benchmarks/sim_scaling.py [--repeat 3] [--scheduling async] [--smoke]

Cases, on the shipped Llama-3.1-8B/H100 profile with its default engine flags:
- the Azure conversation slice at 1×, 4× and 16× its recorded request rate (``rate_scale``);
- the Azure slice 10× longer: the 20 minutes replayed ten times back to back (request ids
  made unique; the conversation trace has no prefix information, so copies share nothing);
- the Mooncake conversation slice (rate ×0.1, 32K context), as recorded and 10× longer (its
  copies share prefixes with the first, as a conversation resumed later would).

Each case runs in a fresh process, which reports the median wall time of ``simulate()`` and
its peak resident memory (the whole process: Python, numpy, the trace and the simulation).
Time per simulated request should stay flat as the trace grows: every step's work is bounded
by the requests in the engine, not by the requests seen.
``--smoke``: two cases (``azure x4 rate`` and ``mooncake x0.1, 10x longer``), one repeat, each
slice cut to its first 40 requests before it is tiled (the suite runs that, so the script does
not rot).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
AZURE = TRACES / "azure_conv_2023_head.csv"
MOONCAKE = TRACES / "mooncake_conversation_head.jsonl"
CASES: dict[str, tuple[Path, float, int, int | None]] = {
    # name: (trace, rate scale, copies back to back, max_model_len)
    "azure x1": (AZURE, 1.0, 1, None),
    "azure x4 rate": (AZURE, 4.0, 1, None),
    "azure x16 rate": (AZURE, 16.0, 1, None),
    "azure 10x longer": (AZURE, 1.0, 10, None),
    "mooncake x0.1": (MOONCAKE, 0.1, 1, 32768),
    "mooncake x0.1, 10x longer": (MOONCAKE, 0.1, 10, 32768),
}
SMOKE_CASES = ("azure x4 rate", "mooncake x0.1, 10x longer")
SMOKE_REQUESTS = 40


def run_case(
    name: str, repeat: int, scheduling: str, max_requests: int | None = None
) -> dict[str, object]:
    """In this process: load, shape and tile the trace, then time ``simulate()``."""
    from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
    from prefill_tuner.trace import ShapeOptions, load_trace

    path, rate, copies, max_model_len = CASES[name]
    trace = load_trace(
        str(path),
        options=ShapeOptions(
            rate_scale=rate, max_model_len=max_model_len, max_requests=max_requests
        ),
    )
    if copies > 1:
        span = trace.requests[-1].arrival_s - trace.requests[0].arrival_s + 1.0
        trace = trace.with_requests(
            tuple(
                dataclasses.replace(r, id=f"{r.id}~{k}", arrival_s=r.arrival_s + k * span)
                for k in range(copies)
                for r in trace.requests
            )
        )
    profile = load_profile("llama-3.1-8b-h100")
    overrides = {"max_model_len": max_model_len} if max_model_len else {}
    config = SimConfig(
        **{**profile.engine_defaults, **overrides, "async_scheduling": scheduling == "async"}
    )
    walls = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = simulate(trace, config, profile)
        walls.append(time.perf_counter() - started)
    return {
        "requests": len(trace),
        "steps": result.steps,
        "simulated_s": result.metrics.duration_s,
        "wall_s": statistics.median(walls),
        "walls": walls,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "p99_ttft_s": result.metrics.ttft_s["p99"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scheduling", choices=("async", "sync"), default="async")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # the child process's one case
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    max_requests = SMOKE_REQUESTS if args.smoke else None
    if args.case:
        print(json.dumps(run_case(args.case, args.repeat, args.scheduling, max_requests)))
        return
    if args.smoke:
        args.repeat = 1
    print(
        f"{'case':28} {'requests':>9} {'steps':>10} {'wall (median)':>14} "
        f"{'µs/request':>11} {'peak RSS':>9}"
    )
    for name in SMOKE_CASES if args.smoke else CASES:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--case",
                name,
                "--repeat",
                str(args.repeat),
                "--scheduling",
                args.scheduling,
                *(["--smoke"] if args.smoke else []),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(child.stdout.strip().splitlines()[-1])
        walls = ", ".join(f"{w:.2f}" for w in row["walls"])
        print(
            f"{name:28} {row['requests']:>9,} {row['steps']:>10,} {row['wall_s']:>12.2f} s "
            f"{row['wall_s'] / row['requests'] * 1e6:>11.0f} {row['peak_rss_mb']:>6.0f} MB"
            f"  (runs: {walls})",
            flush=True,
        )


if __name__ == "__main__":
    main()
