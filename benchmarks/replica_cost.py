"""What simulating N replicas behind a router costs (issue 18, ``tune plan``).

    .venv/bin/python benchmarks/replica_cost.py [--repeat 3] [--smoke]

On the shipped Llama-3.1-8B/H100 profile with its default engine flags, for N = 1, 2, 4, 8, 16
replicas behind each router, the median wall time of ``simulate_replicas()``:

- **same trace**: the Azure conversation slice at 4x its recorded rate, on N replicas (the
  work is the same requests, spread thinner);
- **N x the rate**: the slice at N x its recorded rate on N replicas (each replica's load
  stays that of the recorded trace on one: what growing a deployment with its traffic costs).

Beside each time: the ratio to ``simulate()`` of the same trace on one engine, and the time
per replica. Run in one process, one case after another, so ratios compare like with like.

``--smoke``: the slice's first 300 requests, N = 1, 2 and 4, one run each (the suite runs that,
so the script does not rot).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.engines.sim.replicas import simulate_replicas
from prefill_tuner.engines.sim.routing import ROUTERS
from prefill_tuner.trace import load_trace
from prefill_tuner.trace.shaping import scale_rate

AZURE = Path(__file__).resolve().parent.parent / "examples" / "traces" / "azure_conv_2023_head.csv"
COUNTS = (1, 2, 4, 8, 16)
SMOKE_REQUESTS, SMOKE_COUNTS = 300, (1, 2, 4)


def median_time(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="300 requests, N = 1, 2, 4, one run")
    args = parser.parse_args()
    counts = SMOKE_COUNTS if args.smoke else COUNTS
    profile = load_profile("llama-3.1-8b-h100")
    config = SimConfig(**profile.engine_defaults)
    recorded = load_trace(str(AZURE), sort=True)
    if args.smoke:
        args.repeat = 1
        recorded = recorded.with_requests(recorded.requests[:SMOKE_REQUESTS])
    print(f"{len(recorded.requests)} requests; median of {args.repeat} runs")
    print(f"{'case':34s} {'N':>3s} {'wall s':>7s} {'x one':>6s} {'s/replica':>9s}")
    for case in ("same trace", "N x the rate"):
        for router in ROUTERS:
            for count in counts:
                trace = scale_rate(recorded, 4.0 if case == "same trace" else float(count))
                single = median_time(lambda t=trace: simulate(t, config, profile), args.repeat)
                wall = median_time(
                    lambda t=trace, n=count, r=router: simulate_replicas(
                        t, config, profile, replicas=n, router=r
                    ),
                    args.repeat,
                )
                print(
                    f"{case + ', ' + router:34s} {count:3d} {wall:7.2f} {wall / single:6.2f} "
                    f"{wall / count:9.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
