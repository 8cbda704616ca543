"""CPU seconds of one simulated run of the Mooncake slice (the case of ``sim_speed.py`` where
prefix-cache bookkeeping is heaviest), by ``time.process_time``: on a shared machine CPU time
moves far less with the load than wall time does.

    .venv/bin/python benchmarks/kv_cpu.py [--repeat 3] [--max-requests N] [--trace FILE] [--smoke]

Prints one line: the case, each run's CPU seconds and their median. Run it with two checkouts'
interpreters alternately (before, after, before, ...) to compare them.
``--smoke``: one run of the slice's first 300 requests (at most: a smaller ``--repeat`` or
``--max-requests`` stands; the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.trace import ShapeOptions, load_trace

MOONCAKE = (
    Path(__file__).resolve().parent.parent
    / "examples"
    / "traces"
    / "mooncake_conversation_head.jsonl"
)
SMOKE_REQUESTS = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--scheduling", choices=("async", "sync"), default="async")
    parser.add_argument("--trace", default=str(MOONCAKE), help="the Mooncake slice's file")
    parser.add_argument("--smoke", action="store_true", help="one run of 300 requests")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = min(args.repeat, 1)
        args.max_requests = min(args.max_requests or SMOKE_REQUESTS, SMOKE_REQUESTS)
    profile = load_profile("llama-3.1-8b-h100")
    shaping = ShapeOptions(rate_scale=0.1, max_model_len=32768, max_requests=args.max_requests)
    trace = load_trace(args.trace, options=shaping)
    config = SimConfig(
        **{
            **profile.engine_defaults,
            "max_model_len": 32768,
            "async_scheduling": args.scheduling == "async",
        }
    )
    cpu = []
    for _ in range(args.repeat):
        started = time.process_time()
        result = simulate(trace, config, profile)
        cpu.append(time.process_time() - started)
    runs = ", ".join(f"{seconds:.3f}" for seconds in cpu)
    print(
        f"mooncake x0.1 {args.scheduling}, {len(trace)} requests, {result.steps} steps: "
        f"CPU {runs} s; median {statistics.median(cpu):.3f} s"
    )


if __name__ == "__main__":
    main()
