"""What vLLM 0.33's new scheduler knobs buy on a starvation trace (issue 45).

    .venv/bin/python benchmarks/prefill_cadence.py [--smoke]

The lesson's starvation case: steady decode streams (16-token prompts, 512 outputs) among
which 16k-token documents arrive (``tune trace synth --mix decode=0.95,longdoc-16k=0.05``),
Llama-3.1-8B on one H100 (the measured-kernel profile), 10 arrivals a second, SLOs
``p99_tpot=20ms`` and ``p99_ttft=1s``.
A dense grid of the space the tuner searched before 0.33 (budget × long-prefill threshold,
chunked prefill on, ``max_num_seqs`` 1024 or the budget: the decode population is far below
it) is
simulated with and without the new knobs: ``prefill_schedule_interval`` (0.33's single-engine
cadence) at 2, 4 and 8, and ``max_num_active_seqs`` at 16 and 64 (vLLM 0.32). Each setting is
scored by its worst SLO ratio (measured / limit; ≤ 1 meets every SLO), the tuner's objective,
and the best of each space is printed with its p99 TTFT, p99 TPOT and p99 ITL, and the best with
each new knob's value fixed. Then the KV watermark (0.01, 0.04 of the pool) and, with an error
budget of 5% (a request turned away fails; more than 5% turned away misses the SLOs), vLLM
0.32's ``max_num_queued_tokens`` (16k and 32k prompt tokens awaiting their first token): what
shedding load buys, and what it costs in requests turned away.

``--smoke``: a 2-minute trace and a 3 × 2 grid (the suite runs that, so the script does not
rot).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Iterable

from prefill_tuner.engines.sim import SimConfig, simulate
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.trace.synth import parse_mix, synthesize

SLO_TPOT_S, SLO_TTFT_S = 0.020, 1.0
BUDGETS = (512, 1024, 2048, 4096, 8192, 16384)
THRESHOLDS = (0, 512, 2048)
INTERVALS = (2, 4, 8)
RATE = 10.0
"""Arrivals a second: a 16k-token document every 2 s among the streams, on average."""
ACTIVE = (16, 64)
WATERMARKS = (0.01, 0.04)
QUEUED_TOKENS = (16384, 32768)
ERROR_BUDGET = 0.05


def score(settings: dict[str, object], trace, profile) -> tuple[float, ...]:  # type: ignore[no-untyped-def]
    """Worst SLO ratio (infinite past the error budget), p99 TTFT, TPOT, ITL, share failed."""
    config = SimConfig(**{**profile.engine_defaults, **settings})
    metrics = simulate(trace, config, profile).metrics
    ttft, tpot, itl = metrics.ttft_s["p99"], metrics.tpot_s["p99"], metrics.itl_s["p99"]
    failed = metrics.failed / metrics.requests
    ratio = max(ttft / SLO_TTFT_S, tpot / SLO_TPOT_S) if failed <= ERROR_BUDGET else math.inf
    return ratio, ttft, tpot, itl, failed


def best(
    grid: Iterable[dict[str, object]], scores: dict[str, tuple[float, ...]]
) -> tuple[dict[str, object], tuple[float, ...], int]:
    """The setting of ``grid`` with the least worst SLO ratio (``scores``: by setting)."""
    scored = [(scores[repr(settings)], settings) for settings in grid]
    ((ratio, *rest), settings) = min(scored, key=lambda item: item[0][0])
    return settings, (ratio, *rest), len(scored)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    duration = 120.0 if args.smoke else 600.0
    budgets, thresholds = (BUDGETS[1::2], THRESHOLDS[:2]) if args.smoke else (BUDGETS, THRESHOLDS)
    trace = synthesize(parse_mix("decode=0.95,longdoc-16k=0.05"), RATE, duration_s=duration)
    profile = ProfileSpec(gpu="h100_sxm").build("meta-llama/Llama-3.1-8B-Instruct", 32768)
    old = [
        {
            "max_num_batched_tokens": b,
            "max_num_seqs": min(b, 1024),
            "long_prefill_token_threshold": t,
            "max_model_len": 32768,
        }
        for b, t in itertools.product(budgets, thresholds)
    ]
    with_active = {a: [{**s, "max_num_active_seqs": a} for s in old] for a in ACTIVE}
    with_cadence = {n: [{**s, "prefill_schedule_interval": n} for s in old] for n in INTERVALS}
    spaces = {
        "before 0.32 (budget × threshold)": old,
        "+ max_num_active_seqs (0.32)": [*old, *itertools.chain(*with_active.values())],
        "+ prefill_schedule_interval (0.33)": [*old, *itertools.chain(*with_cadence.values())],
        **{f"only max_num_active_seqs {a}": grid for a, grid in with_active.items()},
        **{f"only prefill_schedule_interval {n}": grid for n, grid in with_cadence.items()},
        "+ watermark": [*old, *({**s, "watermark": w} for s in old for w in WATERMARKS)],
        "+ max_num_queued_tokens (0.32), 5% error budget": [
            *old,
            *({**s, "max_num_queued_tokens": q} for s in old for q in QUEUED_TOKENS),
        ],
    }
    everything = {repr(settings): settings for grid in spaces.values() for settings in grid}
    scores = {key: score(settings, trace, profile) for key, settings in everything.items()}
    print(
        f"{len(trace.requests)} requests over {duration:.0f} s; SLOs p99_ttft="
        f"{SLO_TTFT_S:g}s, p99_tpot={SLO_TPOT_S * 1000:g}ms\n"
    )
    print(
        "| space | settings | best | worst SLO ratio | p99 TTFT | p99 TPOT | p99 ITL "
        "| turned away |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, grid in spaces.items():
        settings, (ratio, ttft, tpot, itl, failed), count = best(grid, scores)
        shown = ", ".join(f"{k} {v}" for k, v in settings.items() if k != "max_model_len")
        print(
            f"| {name} | {count} | {shown} | {ratio:.3f} | {ttft:.2f} s | "
            f"{tpot * 1000:.1f} ms | {itl * 1000:.1f} ms | {failed:.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
