"""Does async scheduling change latency in a way worth tuning? (issue: measure, then decide)

    .venv/bin/python benchmarks/async_scheduling.py [--max-requests N] [--smoke]

For each trace and each configuration of a grid (``max_num_batched_tokens`` × ``max_num_seqs``)
on the shipped Llama-3.1-8B/H100 profile, simulates the same replay with synchronous and with
async scheduling, twice: with the profile as shipped (1.0 ms + 5 µs/request of each step is
host time, hidden behind the step in flight under async scheduling) and with its host time
moved onto the device (so only the scheduling differs: one-step-late frees, placeholders).

Prints, per trace and metric, the async/sync ratio over the grid (median, min, max), how many
configurations async makes worse by more than 1%, the Spearman rank correlation of the grid
under the two modes, whether the best configuration is the same, and how far apart the grid's
configurations are (max/min − 1, synchronous): a rank correlation means little where they
tie. A knob worth searching would make some configurations better and others worse, or reorder
them; one that is better everywhere and keeps the order is a deployment default, not a tuning
choice. Also prints the simulator's wall time in each mode.
``--smoke``: each trace's first 16 requests (or ``--max-requests``), on budgets 512, 2048 and
8192 × max_num_seqs 32 and 1024 (the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scipy.stats import spearmanr

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.trace import ShapeOptions, load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = {
    "bundled sample": (ROOT / "tuner" / "data" / "sample_trace.jsonl", ShapeOptions(), {}),
    "azure conv": (ROOT / "examples" / "traces" / "azure_conv_2023_head.csv", ShapeOptions(), {}),
    "mooncake x0.1, 32K": (
        ROOT / "examples" / "traces" / "mooncake_conversation_head.jsonl",
        ShapeOptions(rate_scale=0.1, max_model_len=32768),
        {"max_model_len": 32768},
    ),
}
BUDGETS = (512, 1024, 2048, 4096, 8192)
SEQS = (32, 128, 1024)
SMOKE_BUDGETS, SMOKE_SEQS, SMOKE_REQUESTS = (512, 2048, 8192), (32, 1024), 16
METRICS = (
    ("p50 TTFT", lambda m: m.ttft_s["p50"]),
    ("p99 TTFT", lambda m: m.ttft_s["p99"]),
    ("p99 TPOT", lambda m: m.tpot_s["p99"]),
    ("p99 ITL", lambda m: m.itl_s["p99"]),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--smoke", action="store_true", help="fewer requests, a smaller grid")
    args = parser.parse_args()
    budgets, seqs_grid = (SMOKE_BUDGETS, SMOKE_SEQS) if args.smoke else (BUDGETS, SEQS)
    if args.smoke:
        args.max_requests = args.max_requests or SMOKE_REQUESTS
    shipped = load_profile("llama-3.1-8b-h100")
    device_only = shipped.model_copy(
        update={
            "overhead_ms": shipped.overhead_ms + shipped.host_ms,
            "per_request_us": shipped.per_request_us + shipped.host_request_us,
            "host_ms": 0.0,
            "host_request_us": 0.0,
        }
    )
    for trace_name, (path, shaping, overrides) in TRACES.items():
        if args.max_requests:
            shaping = shaping.model_copy(update={"max_requests": args.max_requests})
        trace = load_trace(str(path), options=shaping)
        for profile_name, profile in (("as shipped", shipped), ("host on device", device_only)):
            rows: dict[bool, list[list[float]]] = {False: [], True: []}
            walls: dict[bool, list[float]] = {False: [], True: []}
            for budget in budgets:
                for seqs in seqs_grid:
                    if seqs > budget:
                        continue
                    for mode in (False, True):
                        config = SimConfig(
                            **{
                                **profile.engine_defaults,
                                **overrides,
                                "max_num_batched_tokens": budget,
                                "max_num_seqs": seqs,
                                "async_scheduling": mode,
                            }
                        )
                        started = time.perf_counter()
                        result = simulate(trace, config, profile)
                        walls[mode].append(time.perf_counter() - started)
                        rows[mode].append([get(result.metrics) for _, get in METRICS])
            print(
                f"{trace_name} ({len(trace)} requests), profile {profile_name}, "
                f"{len(rows[True])} configurations; simulator wall median "
                f"sync {statistics.median(walls[False]):.2f} s, "
                f"async {statistics.median(walls[True]):.2f} s"
            )
            for column, (name, _) in enumerate(METRICS):
                sync = [row[column] for row in rows[False]]
                async_ = [row[column] for row in rows[True]]
                ratios = [a / s for a, s in zip(async_, sync, strict=True) if s > 0]
                worse = sum(1 for ratio in ratios if ratio > 1.01)
                rho = spearmanr(sync, async_).statistic
                same_best = sync.index(min(sync)) == async_.index(min(async_))
                spread = max(sync) / min(sync) - 1 if min(sync) > 0 else float("nan")
                print(
                    f"  {name}: async/sync median {statistics.median(ratios):.3f} "
                    f"(min {min(ratios):.3f}, max {max(ratios):.3f}); worse by >1% in {worse}; "
                    f"Spearman {rho:.3f}; same best configuration: {same_best}; "
                    f"the grid's own range (sync) {spread:.1%}"
                )


if __name__ == "__main__":
    main()
