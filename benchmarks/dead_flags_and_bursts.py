"""Dead flags and burst-blind rule trials (issue 29, items 3 and 4), measured.

    .venv/bin/python benchmarks/dead_flags_and_bursts.py [--smoke]

1. How often a random point of the default space carries a ``long_prefill_token_threshold``
   at or above its (repaired) ``max_num_batched_tokens``, where it caps nothing (it then runs
   and shows as off): with the threshold searched as an absolute power of two (the default)
   and as halvings of the budget (``share_of_budget``).
2. The rule-derived first trials on a bursty short-output code trace (the one
   ``tests/test_first_trials.py`` uses: 512-token prompts, 32 output tokens, one a second and
   three bursts of 64 at once; SLOs p99 TPOT 20 ms, p99 TTFT 2 s) on the shipped H100 profile:
   each rule's p99 TTFT and TPOT with ``max_num_seqs`` sized on the average decode batch alone
   (4 × the batch, the rule before: 8 here) and never below the bursts' peak (now).

``--smoke``: 200 random points, and the code trace with 60 of its one-a-second requests, not
300 (its three bursts kept) (the suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import optuna

from prefill_tuner import defaults
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.search_spaces.rules import RULES, threshold_moot
from prefill_tuner.search_spaces.space import (
    EngineCapabilities,
    SearchSpace,
    build_space,
    share_of_budget,
)
from prefill_tuner.study.evaluation import verdict_of
from prefill_tuner.study.first_trials import (
    RUNNING_FACTOR,
    burst_batch,
    decode_batch,
    rule_trials,
)
from prefill_tuner.study.plan import SpaceSpec, TraceSpec, build_plan
from prefill_tuner.trace.native import write_native
from prefill_tuner.trace.synth import Burst, MixPart, RequestClass, synthesize

THRESHOLD, BUDGET = "long_prefill_token_threshold", "max_num_batched_tokens"
SAMPLES = 20_000
MAX_MODEL_LEN = 32768
REQUESTS = 300
"""The code trace's requests besides its bursts (one a second)."""


def moot_share(space: SearchSpace, samples: int = SAMPLES) -> tuple[float, float]:
    """Share of random points whose threshold is moot after the repair; share capped."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    moot = capped = 0
    for _ in range(samples):
        settings = {**space.suggest(study.ask()), "max_model_len": MAX_MODEL_LEN}
        for rule in RULES:
            if rule.broken(settings):
                rule.repair(settings)
        moot += threshold_moot(settings)
        capped += bool(settings[THRESHOLD])
    return moot / samples, capped / samples


def dead_flags(samples: int = SAMPLES) -> None:
    space = build_space(EngineCapabilities("sim", "bench"), fixed={"max_model_len": MAX_MODEL_LEN})
    shares = share_of_budget(space)
    print(f"1. {samples} random points of the default space (max_model_len {MAX_MODEL_LEN}):")
    for name, candidate in (("absolute (the default)", space), ("halvings of the budget", shares)):
        moot, capped = moot_share(candidate, samples)
        print(f"   {name:<28} moot threshold {moot:6.1%}   a threshold set {capped:6.1%}")


def bursts(requests: int = REQUESTS) -> None:
    shape = RequestClass("code", 512, 32)
    trace = synthesize(
        [MixPart(shape, 1.0)],
        1.0,
        count=requests,
        seed=1,
        bursts=[Burst(shape, at_s, 64) for at_s in (10.0, 25.0, 40.0)],
    )
    engine = SimEngine(load_profile(defaults.PROFILE))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "code.jsonl"
        write_native(trace.requests, path)
        plan = build_plan(
            engine, TraceSpec(path), SpaceSpec(), slos=["p99_tpot=20ms", "p99_ttft=2s"]
        )
    batch, peak = decode_batch(plan), burst_batch(plan)
    assert batch is not None
    print(
        f"\n2. bursty code trace, {len(plan.trace)} requests: average decode batch {batch:.2f} "
        f"(max_num_seqs before: {RUNNING_FACTOR} x that, at least the range's 8), "
        f"bursts' peak in flight {peak}"
    )
    trials = rule_trials(plan, engine.default_settings(), engine.max_model_len(plan.space.fixed))
    print(f"   {'rule':<66}{'seqs':>6}{'budget':>8}{'p99 TTFT':>10}{'p99 TPOT':>10}  SLOs")
    for trial in trials:
        now = trial.settings
        before = {**now, "max_num_seqs": 8, BUDGET: now[BUDGET]}
        for label, settings in (("before", before), ("now", now)):
            run = engine.run(plan.trace, dict(settings))
            assert run.metrics is not None
            verdict = verdict_of(run, plan.slos, 0.0)
            print(
                f"   {trial.rule[:58] + ' ' + label:<66}{settings['max_num_seqs']:>6}"
                f"{settings[BUDGET]:>8}{run.metrics.ttft_s['p99']:>9.3f}s"
                f"{run.metrics.tpot_s['p99'] * 1000:>8.1f}ms  "
                f"{'met' if verdict.feasible else 'missed'}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="fewer points and requests")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    dead_flags(200 if args.smoke else SAMPLES)
    bursts(60 if args.smoke else REQUESTS)


if __name__ == "__main__":
    main()
