"""How quickly the tuner finds good settings, against random search and a vLLM auto_tune-like
grid, on the simulator where the exhaustive grid is affordable (issue 4).

    .venv/bin/python benchmarks/search_efficiency.py [--seeds 5] [--budget 40]
        [--methods tuner,random,...] [--only TEXT] [--cache FILE] [--smoke]

For two traces and two SLO settings each, quality is the normalised hypervolume of the
feasible (p99 TTFT, p99 TPOT) points found so far, with the SLO limits as the reference point:
0 = nothing meets the SLOs, 1 = a config with zero latency. The *grid optimum* is that of the
exhaustive power-of-two grid over the default space (max_num_batched_tokens 256..16384 ×
max_num_seqs 8..1024 × chunked prefill on/off × threshold off or 64..8192 × reserve-full-ISL
on/off, deduplicated after vLLM's validity rules). Methods, each with the same trial budget:

- ``tuner``: ``tune run``'s study (its default sampler, the defaults enqueued first), per seed;
- ``random``: the same study with Optuna's random sampler, per seed;
- the candidates of issue 17 (``--methods``, see :data:`METHODS`): other samplers, TPE
  options, the ratio parametrisation of the token budget, rule-derived first trials;
- ``auto_tune grid``: like vLLM's ``auto_tune.sh``, max_num_seqs × max_num_batched_tokens on a
  log grid of about ``sqrt(budget)`` values each, the other knobs at their defaults.

Prints, per setting: the grid optimum, trials each method needs to reach 98% of it (median
over seeds; "-" when not reached within the budget), the quality at budgets 5..40, and the
sampler's seconds per trial (time inside the sampler's calls over the study, per trial).
``--smoke``: one seed, a budget of 10, the Azure slice's first 10 seconds, its tight-TPOT SLOs
only (unless ``--only`` says otherwise); the whole grid still runs (the suite runs that, so the
script does not rot).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution

import prefill_tuner.study.first_trials
import prefill_tuner.study.local_search
import prefill_tuner.study.run
from prefill_tuner.engines.base import EngineRun
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.scoring import judge
from prefill_tuner.objectives.slo import Slo, parse_slos
from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import (
    SearchSpace,
    build_space,
    share_of_budget,
)
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.run import run_study
from prefill_tuner.trace import ShapeOptions, Trace, load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "examples" / "traces"
MAX_MODEL_LEN = 32768
CHECKPOINTS = (5, 10, 15, 20, 25, 30, 40)
SMOKE_SECONDS = 10

SETTINGS: dict[str, tuple[Path, ShapeOptions, dict[str, list[str]]]] = {
    "mooncake": (
        TRACES / "mooncake_conversation_head.jsonl",
        ShapeOptions(
            dequantize_s="auto", duration_s=120, rate_scale=0.1, max_model_len=MAX_MODEL_LEN
        ),
        {
            "tight TPOT": ["p99_tpot=20ms", "p99_ttft=6s"],
            "tight TTFT": ["p99_tpot=40ms", "p99_ttft=3s"],
        },
    ),
    "azure": (
        TRACES / "azure_conv_2023_head.csv",
        ShapeOptions(duration_s=120, max_model_len=MAX_MODEL_LEN),
        {
            "tight TPOT": ["p99_tpot=11ms", "p99_ttft=1s"],
            "tight TTFT": ["p99_tpot=20ms", "p99_ttft=250ms"],
        },
    ),
    "azure-busy": (
        TRACES / "azure_conv_2023_head.csv",
        ShapeOptions(duration_s=1200, rate_scale=2.5, max_model_len=MAX_MODEL_LEN),
        {
            "narrow TPOT": ["p99_tpot=20ms", "p99_ttft=750ms"],
            "narrow TPOT, loose TTFT": ["p99_tpot=20ms", "p99_ttft=2s"],
        },
    ),
    "burstgpt": (
        TRACES / "burstgpt1_head400.csv",
        ShapeOptions(max_model_len=MAX_MODEL_LEN),
        {"tight TPOT": ["p99_tpot=15ms", "p99_ttft=1s"]},
    ),
}
"""``azure-busy``'s best settings are a narrow band of budgets (issue 46), best judged by the
worst SLO ratio against the dense grid (``--quality ratio``)."""


class CachedEngine(SimEngine):
    """The simulator, remembering runs: the same settings on the same trace are not rerun
    (also across invocations, with ``--cache FILE``)."""

    def __init__(self, *args: Any, cache_file: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache_file = cache_file
        self.cache: dict[tuple[Any, ...], EngineRun] = {}
        if cache_file is not None and cache_file.exists():
            self.cache = pickle.loads(cache_file.read_bytes())
        self.runs = 0

    def run(
        self,
        trace: Trace,
        settings: dict[str, Any],
        early_abort: EarlyAbortRule | None = None,
        *,
        label: str | None = None,
        max_concurrency: int | None = None,
    ) -> EngineRun:
        source = trace.source
        identity = (source.sha256 if source else "", len(trace), trace.adjustments)
        key = (identity, tuple(sorted(settings.items())), max_concurrency)
        if key not in self.cache:
            self.cache[key] = super().run(trace, settings, max_concurrency=max_concurrency)
            self.runs += 1
        return self.cache[key]

    def save(self) -> None:
        if self.cache_file is not None:
            self.cache_file.write_bytes(pickle.dumps(self.cache))


def hypervolume(points: list[tuple[float, float]]) -> float:
    """Area dominated by (x, y) points in the unit box, reference (1, 1)."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not front or y < front[-1][1]:
            front.append((x, y))
    area = 0.0
    for (x, y), (next_x, _) in zip(front, [*front[1:], (1.0, 0.0)], strict=False):
        area += (next_x - x) * (1.0 - y)
    return area


def quality_curve(runs: list[EngineRun], slos: tuple[Slo, ...]) -> list[float]:
    """Hypervolume of the feasible points after each run."""
    by_name = {slo.name: slo for slo in slos}
    ttft, tpot = by_name["p99_ttft"], by_name["p99_tpot"]
    points: list[tuple[float, float]] = []
    curve = []
    for run in runs:
        if run.metrics is not None and not run.failure and judge(run.metrics, slos).feasible:
            points.append(
                (ttft.value(run.metrics) / ttft.limit_s, tpot.value(run.metrics) / tpot.limit_s)
            )
        curve.append(hypervolume(points))
    return curve


def ratio_curve(runs: list[EngineRun], slos: tuple[Slo, ...]) -> list[float]:
    """The best worst SLO ratio (measured over limit, the worse of the SLOs; infinite for a
    run that failed or lost requests) after each run: what the recommendation rule ranks."""
    best, curve = math.inf, []
    for run in runs:
        if run.metrics is not None and not run.failure:
            verdict = judge(run.metrics, slos)
            if verdict.constraints.get("errors", 0) <= 0:
                worst = max(1 + verdict.constraints[slo.name] for slo in slos)
                best = min(best, worst)
        curve.append(best)
    return curve


def dense_grid() -> list[dict[str, Any]]:
    """A dense grid where narrow optima live (issue 46): the token budget 256 × 2^(k/5) up to
    16,384 (31 values: 256, 294, 338, 388, 446, 512, ...), max_num_seqs 32, 64, 128, 256 and
    1,024, chunked prefill with the threshold off, 128 or 512 tokens, and chunked prefill off
    (its budget raised to max_model_len by vLLM's rule) with the threshold off, 64, 128 or
    256; reserve-full-ISL on (vLLM's default), after the validity repair."""
    budgets = sorted({round(256 * 2 ** (k / 5)) for k in range(31)})
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    shapes = [(True, t) for t in (0, 128, 512)] + [(False, t) for t in (0, 64, 128, 256)]
    for budget, seqs, (chunked, threshold) in itertools.product(
        budgets, (32, 64, 128, 256, 1024), shapes
    ):
        settings, _ = effective_settings(
            {
                "max_num_batched_tokens": budget,
                "max_num_seqs": seqs,
                "enable_chunked_prefill": chunked,
                "long_prefill_token_threshold": threshold,
                "scheduler_reserve_full_isl": True,
            },
            {"max_model_len": MAX_MODEL_LEN},
            MAX_MODEL_LEN,
        )
        unique.setdefault(tuple(sorted(settings.items())), settings)
    return list(unique.values())


def grid_settings() -> list[dict[str, Any]]:
    """The exhaustive power-of-two grid over the default space, after the validity repair."""
    budgets = [2**e for e in range(8, 15)]
    seqs = [2**e for e in range(3, 11)]
    thresholds = [0] + [2**e for e in range(6, 14)]
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for budget, seq, chunked, threshold, reserve in itertools.product(
        budgets, seqs, (True, False), thresholds, (True, False)
    ):
        settings, _ = effective_settings(
            {
                "max_num_batched_tokens": budget,
                "max_num_seqs": seq,
                "enable_chunked_prefill": chunked,
                "long_prefill_token_threshold": threshold,
                "scheduler_reserve_full_isl": reserve,
            },
            {"max_model_len": MAX_MODEL_LEN},
            MAX_MODEL_LEN,
        )
        unique.setdefault(tuple(sorted(settings.items())), settings)
    return list(unique.values())


def auto_tune_grid(budget: int, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """max_num_seqs × max_num_batched_tokens, log-spaced, about sqrt(budget) values each."""
    side = math.ceil(math.sqrt(budget))

    def spread(low: int, high: int) -> list[int]:
        return sorted({round(low * (high / low) ** (i / max(side - 1, 1))) for i in range(side)})

    points = []
    for seqs in spread(8, 1024):
        for tokens in spread(256, 16384):
            settings, _ = effective_settings(
                {**defaults, "max_num_seqs": seqs, "max_num_batched_tokens": tokens},
                {"max_model_len": MAX_MODEL_LEN},
                MAX_MODEL_LEN,
            )
            points.append(settings)
    return points[:budget]


SAMPLER_CALLS = (
    "infer_relative_search_space",
    "sample_relative",
    "sample_independent",
    "before_trial",
    "after_trial",
)


def timed(sampler: optuna.samplers.BaseSampler, clock: list[float]) -> optuna.samplers.BaseSampler:
    """The sampler, adding the seconds spent in its calls to ``clock[0]``."""
    for name in SAMPLER_CALLS:
        call = getattr(sampler, name)

        def wrapper(*args: Any, _call: Callable[..., Any] = call, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return _call(*args, **kwargs)
            finally:
                clock[0] += time.perf_counter() - started

        setattr(sampler, name, wrapper)
    return sampler


SamplerFactory = Callable[[int, int], optuna.samplers.BaseSampler]
"""(seed, start-up trials) → a sampler."""


def gp_sampler(seed: int, startup: int) -> optuna.samplers.BaseSampler:
    """Optuna's GP sampler: it reads the constraints ``trial.set_constraint`` stores."""
    return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)


def tpe_with(**options: Any) -> SamplerFactory:
    """Multivariate TPE (it reads the stored constraints too) with other options."""

    def make(seed: int, startup: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(
            **{"multivariate": True, "seed": seed, "n_startup_trials": startup, **options}
        )

    return make


TOKENS, SEQS, THRESHOLD = "max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold"
RATIO_PARAM = "max_num_batched_tokens_per_seq"
THRESHOLD_PARAM = "long_prefill_token_threshold_log2_off_high"


@dataclass(frozen=True)
class RatioSpace(SearchSpace):
    """The default space, ``max_num_batched_tokens`` searched as its ratio to
    ``max_num_seqs`` (log scale; clipped to the token range). Trials store the effective
    settings, as ever; only the parameters Optuna models differ."""

    def _bounds(self) -> tuple[float, float]:
        tokens, seqs = self.ranges[TOKENS], self.ranges[SEQS]
        return max(1.0, tokens.low / seqs.high), tokens.high / seqs.low

    def distributions(self) -> dict[str, BaseDistribution]:
        result = {k: v for k, v in super().distributions().items() if k != TOKENS}
        return {RATIO_PARAM: FloatDistribution(*self._bounds(), log=True), **result}

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        values = _suggest_others(self, trial, skip=(TOKENS,))
        ratio = trial.suggest_float(RATIO_PARAM, *self._bounds(), log=True)
        tokens = self.ranges[TOKENS]
        values[TOKENS] = min(max(round(ratio * values[SEQS]), tokens.low), tokens.high)
        threshold = self.ranges[THRESHOLD]  # searched as a share of the budget, known only now
        values[THRESHOLD] = threshold.value(trial.params[threshold.param], values[TOKENS])
        return values

    def params_for(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        params = {k: v for k, v in super().params_for(settings).items() if k != TOKENS}
        low, high = self._bounds()
        ratio = settings[TOKENS] / settings[SEQS]
        return {RATIO_PARAM: min(max(ratio, low), high), **params}


@dataclass(frozen=True)
class ThresholdOffHighSpace(SearchSpace):
    """The default space, the threshold's "off" placed above its highest power of two
    (no cap = the loosest cap) instead of below its lowest (next to the tightest)."""

    def _exponents(self) -> tuple[int, int]:
        knob = self.ranges[THRESHOLD]
        return knob.low.bit_length() - 1, knob.high.bit_length() - 1

    def distributions(self) -> dict[str, BaseDistribution]:
        result = super().distributions()
        low, high = self._exponents()
        del result[self.ranges[THRESHOLD].param]
        return {**result, THRESHOLD_PARAM: IntDistribution(low, high + 1)}

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        values = _suggest_others(self, trial, skip=(THRESHOLD,))
        low, high = self._exponents()
        exponent = trial.suggest_int(THRESHOLD_PARAM, low, high + 1)
        values[THRESHOLD] = 0 if exponent > high else 2**exponent
        return values

    def params_for(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        params = super().params_for(settings)
        del params[self.ranges[THRESHOLD].param]
        low, high = self._exponents()
        value = settings[THRESHOLD]
        exponent = high + 1 if not value else min(max(value.bit_length() - 1, low), high)
        return {**params, THRESHOLD_PARAM: exponent}


def _suggest_others(
    space: SearchSpace, trial: optuna.Trial, skip: tuple[str, ...]
) -> dict[str, Any]:
    """The base space's suggestions for every knob not in ``skip``."""
    others = SearchSpace({k: v for k, v in space.ranges.items() if k not in skip}, space.fixed)
    return others.suggest(trial)


def as_space(kind: type[SearchSpace]) -> Callable[[SearchSpace], SearchSpace]:
    return lambda space: kind(space.ranges, space.fixed, space.dropped)


def absolute_threshold(space: SearchSpace) -> SearchSpace:
    """The threshold searched as an absolute power of two (off or 64..8192), whatever the
    budget, so some points cap nothing (at or above the budget; they run in canonical form,
    off). The default space: measured against :func:`share_of_budget` in issue 29."""
    ranges = dict(space.ranges)
    ranges[THRESHOLD] = dataclasses.replace(ranges[THRESHOLD], halvings=0)
    return SearchSpace(ranges, space.fixed, space.dropped)


@dataclass(frozen=True)
class Method:
    """One way of running the study."""

    sampler: str = "tpe"
    """The product's ``--sampler``."""
    factory: SamplerFactory | None = None
    """A sampler the product does not offer (replaces ``sampler``)."""
    space: Callable[[SearchSpace], SearchSpace] | None = None
    """Another parametrisation of the default space."""
    rule_trials: bool = True
    """Run the rule-derived first trials after the defaults (``tune run``'s default)."""
    budget_sweep: bool = True
    """With them, the budget axis between the small and the roomy budget (rule 4, issue 46)."""
    refine: bool = True
    """With them, the budget refined around the best trial once they ran (issue 46)."""
    description: str = ""


METHODS: dict[str, Method] = {
    "tuner": Method(description="tune run's default: TPE, rule-derived first trials"),
    "tuner-nosweep": Method(
        budget_sweep=False,
        refine=False,
        description="rule trials without the budget sweep (before issue 46)",
    ),
    "tuner-norefine": Method(
        refine=False, description="rule trials and the sweep, the budget not refined after"
    ),
    "tpe": Method(rule_trials=False, description="the default until issue 17: TPE alone"),
    "random": Method("random", rule_trials=False, description="Optuna's random sampler"),
    "gp": Method(factory=gp_sampler, rule_trials=False, description="Optuna's GPSampler"),
    "tpe-ratio": Method(space=as_space(RatioSpace), rule_trials=False),
    "tpe-offhigh": Method(space=as_space(ThresholdOffHighSpace), rule_trials=False),
    "tuner-ratio": Method(space=as_space(RatioSpace), description="rule trials, ratio space"),
    "tuner-absolute": Method(
        space=absolute_threshold, description="tune run's default, the threshold absolute"
    ),
    "random-absolute": Method("random", space=absolute_threshold, rule_trials=False),
    "tuner-halvings": Method(
        space=share_of_budget, description="the threshold as halvings of the budget"
    ),
    "random-halvings": Method("random", space=share_of_budget, rule_trials=False),
}


@contextlib.contextmanager
def method_in_place(method: Method, clock: list[float]) -> Iterator[None]:
    """Make ``run_study`` use the method's sampler, timed."""
    make_sampler = prefill_tuner.study.run.make_sampler

    def make(kind: str, seed: int, startup_trials: int = 8) -> optuna.samplers.BaseSampler:
        if method.factory is not None:
            return timed(method.factory(seed, startup_trials), clock)
        return timed(make_sampler(kind, seed, startup_trials), clock)

    with (
        mock.patch.object(prefill_tuner.study.run, "make_sampler", make),
        mock.patch.object(prefill_tuner.study.first_trials, "BUDGET_SWEEP", method.budget_sweep),
        mock.patch.object(prefill_tuner.study.local_search, "REFINE", method.refine),
    ):
        yield


def study_runs(
    engine: CachedEngine,
    trace: Trace,
    shaping: ShapeOptions,
    slos: tuple[Slo, ...],
    method: Method,
    seed: int,
    budget: int,
    startup: int = 8,
) -> tuple[list[EngineRun], float]:
    """Run ``tune run``'s study; return the engine runs in trial order and the sampler's
    seconds per trial."""
    space = build_space(engine.capabilities, fixed={"max_model_len": MAX_MODEL_LEN})
    if method.space is not None:
        space = method.space(space)
    clock = [0.0]
    with tempfile.TemporaryDirectory() as tmp, method_in_place(method, clock):
        storage = f"sqlite:///{tmp}/bench.db"
        plan = StudyPlan(
            name="bench",
            storage_url=storage,
            trace=trace,
            shaping=shaping,
            slos=slos,
            space=space,
            model="m",
            trials=budget,
            seed=seed,
            sampler=method.sampler,  # type: ignore[arg-type]
            startup_trials=startup,
            rule_trials=method.rule_trials,
        )
        study = run_study(plan, engine, TunerStore(storage))
        trials = sorted(study.trials, key=lambda t: t.number)
        REPEATS[method] = REPEATS.get(method, 0) + sum("same_as" in t.user_attrs for t in trials)
        return [engine.run(trace, t.user_attrs["settings"]) for t in trials], clock[0] / len(trials)


REPEATS: dict[Method, int] = {}
"""Trials per method (all seeds) whose settings, in canonical form, repeated an earlier
trial's: their result was reused, but they count against the trial budget."""


def reached(curve: list[float], target: float) -> int | None:
    return next((index + 1 for index, value in enumerate(curve) if value >= target), None)


def reached_ratio(curve: list[float], target: float) -> int | None:
    """Trials until the best worst ratio is at or below ``target``."""
    return next((index + 1 for index, value in enumerate(curve) if value <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--json", type=Path, help="Also write the raw results here.")
    parser.add_argument("--cache", type=Path, help="Keep simulation results in this file.")
    parser.add_argument(
        "--methods",
        default="tuner,random",
        help=f"Comma-separated, from: {', '.join(METHODS)} (the auto_tune grid always runs).",
    )
    parser.add_argument("--only", help="Only the settings whose name contains this text.")
    parser.add_argument(
        "--tpe-startup",
        type=int,
        default=8,
        help="Random trials before TPE models (the tuner's default: 8).",
    )
    parser.add_argument(
        "--quality",
        choices=("hypervolume", "ratio"),
        default="hypervolume",
        help="hypervolume of the feasible points against the power-of-two grid, or the best "
        "worst SLO ratio against the dense grid (issue 46: target within 2%%)",
    )
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    ratio = args.quality == "ratio"
    measure = ratio_curve if ratio else quality_curve
    if args.smoke:
        args.seeds, args.budget, args.only = 1, 10, args.only or "azure / tight TPOT"
    methods = {name: METHODS[name] for name in args.methods.split(",")}
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    profile = load_profile("llama-3.1-8b-h100")
    results: dict[str, Any] = {}
    for trace_name, (path, shaping, slo_sets) in SETTINGS.items():
        slo_sets = {
            slo_name: texts
            for slo_name, texts in slo_sets.items()
            if not args.only or args.only in f"{trace_name} / {slo_name} ({', '.join(texts)})"
        }
        if not slo_sets:
            continue
        if args.smoke:
            shaping = shaping.model_copy(update={"duration_s": SMOKE_SECONDS})
        trace = load_trace(str(path), options=shaping)
        engine = CachedEngine(profile, cache_file=args.cache)
        started = time.perf_counter()
        grid = dense_grid() if ratio else grid_settings()
        grid_runs = [engine.run(trace, settings) for settings in grid]
        grid_seconds = time.perf_counter() - started
        engine.save()
        defaults = engine.default_settings()
        for slo_name, slo_texts in slo_sets.items():
            slos = parse_slos(slo_texts)
            optimum = measure(grid_runs, slos)[-1]
            curves: dict[str, list[list[float]]] = {name: [] for name in methods}
            seconds: dict[str, list[float]] = {name: [] for name in methods}
            REPEATS.clear()
            for seed in range(args.seeds):
                for name, method in methods.items():
                    runs, per_trial = study_runs(
                        engine, trace, shaping, slos, method, seed, args.budget, args.tpe_startup
                    )
                    curves[name].append(measure(runs, slos))
                    seconds[name].append(per_trial)
            grid_curve = []
            for budget in range(1, args.budget + 1):
                runs = [engine.run(trace, s) for s in auto_tune_grid(budget, defaults)]
                grid_curve.append(measure(runs, slos)[-1])
            curves["auto_tune grid"] = [grid_curve]
            key = f"{trace_name} / {slo_name} ({', '.join(slo_texts)})"
            summary: dict[str, Any] = {
                "grid_optimum": optimum,
                "grid_configs": len(grid),
                "grid_seconds": grid_seconds,
                "methods": {},
            }
            print(
                f"\n{key}: {len(trace)} requests; grid optimum {optimum:.4f} over "
                f"{len(grid)} configs ({grid_seconds:.0f} s)"
            )
            print(
                f"  {'method':<16}{'to ≤1.02×' if ratio else 'trials to 98%':>15}  "
                + "".join(f"{f'@{n}':>8}" for n in CHECKPOINTS if n <= args.budget)
                + f"{'s/trial':>9}{'repeats':>9}"
            )
            if ratio:
                best = grid[min(range(len(grid)), key=lambda i: measure([grid_runs[i]], slos)[0])]
                print(f"  the grid's best: {json.dumps(best)}")
            for method, method_curves in curves.items():
                hits = [
                    reached_ratio(curve, 1.02 * optimum)
                    if ratio
                    else reached(curve, 0.98 * optimum)
                    for curve in method_curves
                ]
                found = [h for h in hits if h is not None]
                needed = (
                    f"{statistics.median(found):g} ({len(found)}/{len(hits)})"
                    if found
                    else f"- (0/{len(hits)})"
                )
                at = {
                    n: statistics.median(c[n - 1] for c in method_curves) / optimum
                    if optimum
                    else math.nan
                    for n in CHECKPOINTS
                    if n <= args.budget
                }
                per_trial = statistics.mean(seconds[method]) if method in seconds else None
                repeats = REPEATS.get(methods[method], 0) if method in methods else None
                print(
                    f"  {method:<16}{needed:>15}  "
                    + "".join((f"{v:>8.3f}" if ratio else f"{v:>8.1%}") for v in at.values())
                    + (f"{per_trial:>9.3f}" if per_trial is not None else "")
                    + (f"{repeats:>9}" if repeats is not None else "")
                )
                median_curve = [statistics.median(c) for c in zip(*method_curves, strict=True)]
                summary["methods"][method] = {
                    "trials_to_98": hits,
                    "median_quality": at,
                    "sampler_s_per_trial": per_trial,
                    "repeat_trials": repeats,
                    "median_curve": median_curve,
                }
            if "random" in curves:
                random_curve = summary["methods"]["random"]["median_curve"]
                for method, result in summary["methods"].items():
                    behind = [
                        n
                        for n in range(10, args.budget + 1)
                        if (result["median_curve"][n - 1] - random_curve[n - 1])
                        * (-1 if ratio else 1)
                        < -1e-12
                    ]
                    result["behind_random_at"] = behind
                    if method != "random":
                        print(
                            f"  {method}: behind random (median) at budgets "
                            f"{', '.join(map(str, behind)) or 'none'} of 10..{args.budget}"
                        )
            results[key] = summary
        engine.save()
        print(f"  ({engine.runs} distinct simulations for {trace_name})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
