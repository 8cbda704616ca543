"""How quickly the tuner finds good settings, against random search and a vLLM auto_tune-like
grid, on the simulator where the exhaustive grid is affordable (issue 4).

    .venv/bin/python benchmarks/search_efficiency.py [--seeds 5] [--budget 40]

For two traces and two SLO settings each, quality is the normalised hypervolume of the
feasible (p99 TTFT, p99 TPOT) points found so far, with the SLO limits as the reference point:
0 = nothing meets the SLOs, 1 = a config with zero latency. The *grid optimum* is that of the
exhaustive power-of-two grid over the default space (max_num_batched_tokens 256..16384 ×
max_num_seqs 8..1024 × chunked prefill on/off × threshold off or 64..8192 × reserve-full-ISL
on/off, deduplicated after vLLM's validity rules). Methods, each with the same trial budget:

- ``tuner``: ``tune run``'s study (multivariate TPE, the defaults enqueued first), per seed;
- ``random``: the same study with Optuna's random sampler, per seed;
- ``auto_tune grid``: like vLLM's ``auto_tune.sh``, max_num_seqs × max_num_batched_tokens on a
  log grid of about ``sqrt(budget)`` values each, the other knobs at their defaults.

Prints, per setting: the grid optimum, trials each method needs to reach 98% of it (median
over seeds; "-" when not reached within the budget), and the quality at budgets 5..40.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import pickle
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from prefill_tuner.engines.base import EngineRun
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.adapter import SimEngine
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.scoring import judge
from prefill_tuner.objectives.slo import Slo, parse_slos
from prefill_tuner.plan import StudyPlan
from prefill_tuner.search_spaces.space import build_space, effective_settings
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study import run_study
from prefill_tuner.trace import ShapeOptions, Trace, load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "examples" / "traces"
MAX_MODEL_LEN = 32768
CHECKPOINTS = (5, 10, 15, 20, 25, 30, 40)

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
}


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
        self, trace: Trace, settings: dict[str, Any], early_abort: EarlyAbortRule | None = None
    ) -> EngineRun:
        source = trace.source
        identity = (source.sha256 if source else "", len(trace), trace.adjustments)
        key = (identity, tuple(sorted(settings.items())))
        if key not in self.cache:
            self.cache[key] = super().run(trace, settings)
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


def study_runs(
    engine: CachedEngine,
    trace: Trace,
    shaping: ShapeOptions,
    slos: tuple[Slo, ...],
    sampler: str,
    seed: int,
    budget: int,
    startup: int = 8,
) -> list[EngineRun]:
    """Run ``tune run``'s study; return the engine runs in trial order."""
    space = build_space(engine.capabilities, fixed={"max_model_len": MAX_MODEL_LEN})
    with tempfile.TemporaryDirectory() as tmp:
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
            sampler=sampler,  # type: ignore[arg-type]
            startup_trials=startup,
        )
        study = run_study(plan, engine, TunerStore(storage))
        trials = sorted(study.trials, key=lambda t: t.number)
        return [engine.run(trace, t.user_attrs["settings"]) for t in trials]


def reached(curve: list[float], target: float) -> int | None:
    return next((index + 1 for index, value in enumerate(curve) if value >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--json", type=Path, help="Also write the raw results here.")
    parser.add_argument("--cache", type=Path, help="Keep simulation results in this file.")
    parser.add_argument(
        "--tpe-startup",
        type=int,
        default=8,
        help="Random trials before TPE models (the tuner's default: 8).",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    profile = load_profile("llama-3.1-8b-h100")
    results: dict[str, Any] = {}
    for trace_name, (path, shaping, slo_sets) in SETTINGS.items():
        trace = load_trace(str(path), options=shaping)
        engine = CachedEngine(profile, cache_file=args.cache)
        started = time.perf_counter()
        grid = grid_settings()
        grid_runs = [engine.run(trace, settings) for settings in grid]
        grid_seconds = time.perf_counter() - started
        engine.save()
        defaults = engine.default_settings()
        for slo_name, slo_texts in slo_sets.items():
            slos = parse_slos(slo_texts)
            optimum = quality_curve(grid_runs, slos)[-1]
            curves: dict[str, list[list[float]]] = {"tuner": [], "random": []}
            for seed in range(args.seeds):
                for method, sampler in (("tuner", "tpe"), ("random", "random")):
                    runs = study_runs(
                        engine, trace, shaping, slos, sampler, seed, args.budget, args.tpe_startup
                    )
                    curves[method].append(quality_curve(runs, slos))
            grid_curve = []
            for budget in range(1, args.budget + 1):
                runs = [engine.run(trace, s) for s in auto_tune_grid(budget, defaults)]
                grid_curve.append(quality_curve(runs, slos)[-1])
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
                f"  {'method':<16}{'trials to 98%':>15}  "
                + "".join(f"{f'@{n}':>8}" for n in CHECKPOINTS if n <= args.budget)
            )
            for method, method_curves in curves.items():
                hits = [reached(curve, 0.98 * optimum) for curve in method_curves]
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
                print(f"  {method:<16}{needed:>15}  " + "".join(f"{v:>8.1%}" for v in at.values()))
                summary["methods"][method] = {"trials_to_98": hits, "median_quality": at}
            results[key] = summary
        engine.save()
        print(f"  ({engine.runs} distinct simulations for {trace_name})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
