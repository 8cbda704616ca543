"""How fast the simulator replays the bundled 20-minute traces (issue: < 1 s each, one core).

    .venv/bin/python benchmarks/sim_speed.py [--repeat 5] [--profile-top 12] [--smoke]

Cases, with the default engine flags of the shipped Llama-3.1-8B/H100 profile, each with
async scheduling (the profile's default) and synchronous:
- Mooncake conversation slice, rate ×0.1 (one H100 cannot serve 40k prompt tok/s), requests
  longer than a 32K context clipped (``--max-model-len 32768``);
- Azure conversation slice as recorded.

Prints the median wall time of ``simulate()`` over the repeats (reading and shaping the trace
excluded), simulated requests per wall second, and where the time goes (cProfile, one extra run).
``--smoke``: one repeat of each case on the slice's first 200 requests (the suite runs that, so
the script does not rot).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.trace import ShapeOptions, load_trace

TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
CASES = {
    "mooncake x0.1, 32K": (
        TRACES / "mooncake_conversation_head.jsonl",
        ShapeOptions(rate_scale=0.1, max_model_len=32768),
        {"max_model_len": 32768},
    ),
    "azure conv": (TRACES / "azure_conv_2023_head.csv", ShapeOptions(), {}),
}
SMOKE_REQUESTS = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile-top", type=int, default=12)
    parser.add_argument(
        "--scheduling",
        choices=("async", "sync", "both"),
        default="both",
        help="async (the profile's default, as vLLM on GPU), sync (as vLLM on CPU), or both",
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 1
    profile = load_profile("llama-3.1-8b-h100")
    modes = {"async": (True,), "sync": (False,), "both": (True, False)}[args.scheduling]
    for (name, (path, shaping, overrides)), mode in (
        (case, mode) for case in CASES.items() for mode in modes
    ):
        if args.smoke:
            shaping = shaping.model_copy(update={"max_requests": SMOKE_REQUESTS})
        trace = load_trace(str(path), options=shaping)
        config = SimConfig(**{**profile.engine_defaults, **overrides, "async_scheduling": mode})
        name = f"{name}, {'async' if mode else 'sync'}"
        walls = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            result = simulate(trace, config, profile)
            walls.append(time.perf_counter() - started)
        median = statistics.median(walls)
        metrics = result.metrics
        print(
            f"{name}: {len(trace)} requests, {result.steps:,} steps, "
            f"{metrics.duration_s:,.0f} s simulated; wall median {median:.3f} s "
            f"(min {min(walls):.3f}, max {max(walls):.3f}, n={args.repeat}); "
            f"{len(trace) / median:,.0f} simulated requests/s; "
            f"p99 TTFT {metrics.ttft_s['p99'] * 1000:.0f} ms, p99 TPOT "
            f"{metrics.tpot_s['p99'] * 1000:.1f} ms, preemptions {result.preemptions}"
        )
        if args.profile_top:
            profiler = cProfile.Profile()
            profiler.runcall(simulate, trace, config, profile)
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile_top)
            lines = [line for line in out.getvalue().splitlines() if line.strip()]
            start = next(i for i, line in enumerate(lines) if "ncalls" in line)
            print(
                "\n".join("    " + line for line in lines[start - 1 : start + args.profile_top + 1])
            )


if __name__ == "__main__":
    main()
