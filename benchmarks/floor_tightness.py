"""How close the latency floors (``tuner/study/infeasibility.py``) come to what settings achieve
(issue 18).

    .venv/bin/python benchmarks/floor_tightness.py [--smoke]

For three synthetic traces (a stream of chats with bursts of 30 long documents; the README's
``tune plan`` example, gamma arrivals with CV 3; 50 prompts of 4,000 tokens at one instant),
on the shipped H100 profile: each TTFT statistic's floor (the larger of "each request alone"
and "the bursts"), against the best value a grid of 24 settings reached on the simulator
(budget 512 / 2,048 / 8,192 / 65,536 x long-prefill threshold off / 512 x async on / off).
A floor is a bound: it must never be above the best; the closer, the more its "cannot be
met" catches.
``--smoke``: the same three traces against a grid of two settings (budget 2,048 / 65,536,
threshold off, async on), so each "best" is the better of two (the suite runs that, so the
script does not rot).
"""

from __future__ import annotations

import argparse
import itertools
import random

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.study.infeasibility import latency_floor
from prefill_tuner.trace.model import Request, Trace
from prefill_tuner.trace.synth import parse_mix, synthesize

STATISTICS = ("p50", "p90", "p99", "max")


def documents_in_bursts(seed: int = 0) -> Trace:
    """A chat every 0.5 s; every 20 s, 30 documents of 6-12k tokens within 0.3 s."""
    rng = random.Random(seed)
    requests = [
        Request(f"chat-{i}", i * 0.5, rng.randint(100, 600), rng.randint(20, 80))
        for i in range(120)
    ]
    requests += [
        Request(f"doc-{b}-{i}", 5.0 + 20.0 * b + 0.01 * i, rng.randint(6000, 12000), 20)
        for b in range(3)
        for i in range(30)
    ]
    return Trace(tuple(sorted(requests, key=lambda r: r.arrival_s)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="two settings, not 16 (a quick run)")
    args = parser.parse_args()
    profile = load_profile("llama-3.1-8b-h100")
    traces = {
        "documents in bursts": documents_in_bursts(),
        "README plan example": synthesize(
            parse_mix("interactive=0.7,decode=0.2,longdoc-16k=0.1"),
            6.0,
            duration_s=40.0,
            arrivals="gamma",
            cv=3.0,
            seed=5,
        ),
        "50 x 4k at once": Trace(tuple(Request(str(i), 5.0, 4000, 10) for i in range(50))),
    }
    slos = parse_slos([f"{stat}_ttft=1s" for stat in STATISTICS])
    grid = list(itertools.product((512, 2048, 8192, 65536), (0, 512), (True, False)))
    if args.smoke:
        grid = [(2048, 0, True), (65536, 0, True)]
    print(f"{'trace':22s} {'stat':>5s} {'floor s':>8s} {'from':>7s} {'best s':>7s} floor/best")
    for name, trace in traces.items():
        floors = latency_floor(trace, profile, slos)
        best = {stat: float("inf") for stat in STATISTICS}
        for budget, threshold, asynchronous in grid:
            config = SimConfig(
                **{
                    **profile.engine_defaults,
                    "max_num_batched_tokens": budget,
                    "max_num_seqs": min(256, budget),
                    "long_prefill_token_threshold": threshold,
                    "async_scheduling": asynchronous,
                }
            )
            metrics = simulate(trace, config, profile).metrics
            for stat in STATISTICS:
                best[stat] = min(best[stat], metrics.ttft_s[stat])
        for floor in floors:
            stat = floor.slo.statistic
            source = "bursts" if floor.bursts_s > floor.alone_s else "alone"
            print(
                f"{name:22s} {stat:>5s} {floor.floor_s:8.3f} {source:>7s} {best[stat]:7.3f} "
                f"{floor.floor_s / best[stat]:10.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
