"""Deployable recommendations (issue 29): the recommendation's load headroom and neighbour
safety before and after the headroom checks, its distance to the grid optimum, and how it does
on a later window of the same trace; on traces the tests never tune on, on the simulator.

    .venv/bin/python benchmarks/deployable.py [--seeds 2] [--trials 30] [--only TEXT]
        [--judge-window busiest:60] [--json FILE] [--smoke]

For each workload (a trace, the window it is tuned on, a later window of the same length, and
an SLO set), per seed: ``tune run``'s study on the tuning window (its defaults), then the
headroom checks (:mod:`prefill_tuner.study.headroom`). *before* is the rule's pick alone
(:mod:`prefill_tuner.study.recommend`), *after* the recommendation with the checks; with
``--judge-window`` a third study (seed 0 only, to fit the time) also judges each trial on
that window (*+window*). For each:

- **neighbours**: how many of its budget / max_num_seqs ×0.8 / ×1.25 neighbours meet the SLOs;
- **load**: the highest of 1.25×, 1.5×, 2× the rate that it meets (1 = none);
- **vs grid**: its worst ratio by the recommendation rule on the tuning window (p99 TTFT and
  p99 TPOT, each against its SLO limit or, without one, against the engine defaults' value on
  that window) over the best of the grid points that meet the SLOs, minus 1 (0 = as good as
  the grid optimum; negative: better than any grid point, the search is finer than the grid);
- **later**: whether it meets the SLOs on the later window, its worst ratio there (against the
  defaults' values there), and its rank among the grid's points there (those meeting the SLOs
  first, then by the ratio; 1 = the best of them).

The grid: max_num_batched_tokens 2^8..2^14 × max_num_seqs 2^3..2^10 × long_prefill_token_threshold
off / 1024, chunked prefill on (a coarser grid than search_efficiency.py's, to fit the time).

``--smoke``: the first workload alone (or ``--only``'s), on the repository's copy of its trace
(``examples/traces/``), windows a sixth as long, one seed of 4 trials, judged on ``busiest:10`` too,
and a grid of max_num_batched_tokens 2^8, 2^11, 2^14 × max_num_seqs 2^3, 2^6, 2^10 (the
suite runs that, so the script does not rot).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from prefill_tuner.engines.base import EngineRun
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.scoring import judge, statistic
from prefill_tuner.objectives.slo import Slo, parse_slos
from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import build_space
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.headroom import Candidate, HeadroomReport
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.session import TuningSession
from prefill_tuner.trace import ShapeOptions, Trace, load_trace

TRACES = Path("/work/shared/traces")
SHIPPED_TRACES = Path(__file__).resolve().parent.parent / "examples" / "traces"
"""The same traces' heads in the repository (``--smoke`` reads these)."""
MAX_MODEL_LEN = 32768


@dataclass(frozen=True)
class Workload:
    path: Path
    shaping: ShapeOptions
    window_s: float
    """Tuned on [start, start + window); judged later on [start + window, start + 2 × window),
    in the trace's own seconds (windows are cut before ``rate_scale``)."""
    slos: tuple[str, ...]


WORKLOADS: dict[str, Workload] = {
    "azure / tight TPOT": Workload(
        TRACES / "azure_conv_2023_head.csv",
        ShapeOptions(max_model_len=MAX_MODEL_LEN),
        180,
        ("p99_tpot=11ms", "p99_ttft=1s"),
    ),
    "azure / tight TTFT": Workload(
        TRACES / "azure_conv_2023_head.csv",
        ShapeOptions(max_model_len=MAX_MODEL_LEN),
        180,
        ("p99_tpot=20ms", "p99_ttft=250ms"),
    ),
    "mooncake / tight TPOT": Workload(
        TRACES / "mooncake_conversation_head.jsonl",
        ShapeOptions(dequantize_s="auto", rate_scale=0.1, max_model_len=MAX_MODEL_LEN),
        120,
        ("p99_tpot=20ms", "p99_ttft=6s"),
    ),
    "azure / TPOT only": Workload(
        TRACES / "azure_conv_2023_head.csv",
        ShapeOptions(max_model_len=MAX_MODEL_LEN),
        180,
        ("p99_tpot=12ms",),
    ),
    "mooncake / TPOT only": Workload(
        TRACES / "mooncake_conversation_head.jsonl",
        ShapeOptions(dequantize_s="auto", rate_scale=0.1, max_model_len=MAX_MODEL_LEN),
        120,
        ("p99_tpot=30ms",),
    ),
    "burstgpt / TPOT only": Workload(
        TRACES / "burstgpt1_head400.csv",
        ShapeOptions(start_s=30500, rate_scale=25, max_model_len=MAX_MODEL_LEN),
        3200,
        ("p99_tpot=12ms",),
    ),
    "burstgpt / chat": Workload(
        TRACES / "burstgpt1_head400.csv",
        ShapeOptions(start_s=30500, rate_scale=25, max_model_len=MAX_MODEL_LEN),
        3200,
        ("p99_tpot=12ms", "p99_ttft=500ms"),
    ),
}


class CachedEngine(SimEngine):
    """The simulator, remembering runs (the same settings on the same arrivals are not rerun);
    runs go to the end (an early stop changes no verdict, only the cost)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache: dict[tuple[Any, ...], EngineRun] = {}
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
        arrivals = tuple(r.arrival_s for r in trace.requests[:: max(1, len(trace) // 50)])
        key = (len(trace), arrivals, trace.requests[-1].arrival_s, tuple(sorted(settings.items())))
        if key not in self.cache:
            self.cache[key] = super().run(trace, settings, max_concurrency=max_concurrency)
            self.runs += 1
        found = self.cache[key]
        return replace(found, details=dict(found.details))


OBJECTIVES = ("p99_ttft", "p99_tpot")


def bars_for(engine: CachedEngine, trace: Trace, slos: tuple[Slo, ...]) -> dict[str, float]:
    """What the recommendation rule measures each objective against: an SLO'd one against its
    limit, the other against the engine defaults' value on the same window."""
    limits = {slo.name: slo.limit_s for slo in slos}
    base = engine.run(trace, engine.default_settings())
    assert base.metrics is not None
    return {name: limits.get(name) or statistic(base.metrics, name) for name in OBJECTIVES}


def score(run: EngineRun, slos: tuple[Slo, ...], bars: dict[str, float]) -> tuple[bool, float]:
    """Whether the run meets the SLOs, and the rule's worst ratio (inf: it failed)."""
    if run.metrics is None or run.failure:
        return False, math.inf
    meets = judge(run.metrics, slos).feasible
    return meets, max(statistic(run.metrics, name) / bars[name] for name in OBJECTIVES)


GRID_BUDGETS = tuple(2**e for e in range(8, 15))
GRID_SEQS = tuple(2**e for e in range(3, 11))
SMOKE_BUDGETS, SMOKE_SEQS = (2**8, 2**11, 2**14), (2**3, 2**6, 2**10)


def grid(
    budgets: tuple[int, ...] = GRID_BUDGETS, seqs_grid: tuple[int, ...] = GRID_SEQS
) -> list[dict[str, Any]]:
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for budget, seqs, threshold in itertools.product(budgets, seqs_grid, (0, 1024)):
        settings, _ = effective_settings(
            {
                "max_num_batched_tokens": budget,
                "max_num_seqs": seqs,
                "enable_chunked_prefill": True,
                "long_prefill_token_threshold": threshold,
            },
            {"max_model_len": MAX_MODEL_LEN},
            MAX_MODEL_LEN,
        )
        unique.setdefault(tuple(sorted(settings.items())), settings)
    return list(unique.values())


def study(
    engine: CachedEngine,
    trace: Trace,
    shaping: ShapeOptions,
    slos: tuple[Slo, ...],
    seed: int,
    trials: int,
    windows: tuple[str, ...],
) -> tuple[HeadroomReport, dict[int, dict[str, Any]], float, float] | None:
    """``tune run``'s study and its headroom checks: the report, each trial's settings, and
    the seconds of the study and of the checks."""
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
            trials=trials,
            seed=seed,
            judge_windows=windows,
        )
        store = TunerStore(storage)
        with TuningSession(plan, engine, store) as session:
            started = time.perf_counter()
            session.run()
            summary = session.summary()
            study_s = time.perf_counter() - started
            checked = session.check_headroom(summary)
        report = checked.headroom
        if report is None:
            return None
        settings = {t.trial_number: t.settings for t in checked.pareto}
        return report, settings, study_s, report.seconds


def describe(
    candidate: Candidate,
    settings: dict[str, Any],
    engine: CachedEngine,
    trace: Trace,
    later: Trace,
    slos: tuple[Slo, ...],
    bars: tuple[dict[str, float], dict[str, float]],
    grid_best: float,
    later_grid: list[tuple[bool, float]],
) -> dict[str, Any]:
    later_meets, later_ratio = score(engine.run(later, settings), slos, bars[1])
    _, ratio = score(engine.run(trace, settings), slos, bars[0])
    return {
        "trial": candidate.trial_number,
        "settings": {k: settings[k] for k in ("max_num_batched_tokens", "max_num_seqs")},
        "neighbours_met": sum(c.meets for c in candidate.neighbours),
        "neighbours": len(candidate.neighbours),
        "load": candidate.load,
        "ratio": ratio,
        "vs_grid": ratio / grid_best - 1 if grid_best > 0 else math.nan,
        "later_meets": later_meets,
        "later_ratio": later_ratio,
        "later_rank": 1
        + sum((not m, r) < (not later_meets, later_ratio - 1e-12) for m, r in later_grid),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--only", help="Only the workloads whose name contains this text.")
    parser.add_argument("--judge-window", help="Also run studies judged on this window.")
    parser.add_argument("--json", type=Path, help="Also write the raw results here.")
    parser.add_argument("--smoke", action="store_true", help="One small workload, one seed.")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    engine = CachedEngine(load_profile("llama-3.1-8b-h100"))
    workloads = WORKLOADS
    if args.smoke:
        args.seeds, args.trials = 1, 4
        args.judge_window = args.judge_window or "busiest:10"
        name = next((name for name in WORKLOADS if not args.only or args.only in name), "")
        if not name:
            parser.error(f"--only {args.only}: no workload's name contains it")
        work = WORKLOADS[name]
        workloads = {
            name: replace(work, path=SHIPPED_TRACES / work.path.name, window_s=work.window_s / 6)
        }
    points = grid(SMOKE_BUDGETS, SMOKE_SEQS) if args.smoke else grid()
    results: dict[str, Any] = {}
    started_all = time.perf_counter()
    for name, work in workloads.items():
        if args.only and args.only not in name:
            continue
        slos = parse_slos(list(work.slos))
        tune_shaping = work.shaping.model_copy(update={"duration_s": work.window_s})
        later_shaping = work.shaping.model_copy(
            update={"start_s": work.shaping.start_s + work.window_s, "duration_s": work.window_s}
        )
        trace = load_trace(str(work.path), options=tune_shaping)
        later = load_trace(str(work.path), options=later_shaping)
        bars = (bars_for(engine, trace, slos), bars_for(engine, later, slos))
        tune_grid = [score(engine.run(trace, s), slos, bars[0]) for s in points]
        later_grid = [score(engine.run(later, s), slos, bars[1]) for s in points]
        grid_best = min((r for m, r in tune_grid if m), default=math.nan)
        later_best = min((r for m, r in later_grid if m), default=math.nan)
        print(
            f"\n{name} ({', '.join(work.slos)}): tuned on {len(trace)} requests "
            f"[{work.shaping.start_s:g}, +{work.window_s:g} s), later window {len(later)} "
            "requests; grid "
            f"({len(points)} points) best worst-ratio {grid_best:.3f} tuned, "
            f"{later_best:.3f} later ({sum(m for m, _ in later_grid)} grid points meet later)"
        )
        rows: list[dict[str, Any]] = []
        variants: list[tuple[str, tuple[str, ...]]] = [("", ())]
        if args.judge_window:
            variants.append(("+window", (args.judge_window,)))
        for seed in range(args.seeds):
            for suffix, windows in variants if seed == 0 else variants[:1]:
                found = study(engine, trace, work.shaping, slos, seed, args.trials, windows)
                if found is None:
                    print(f"  seed {seed}{suffix}: no trial met the SLOs")
                    continue
                report, settings, study_s, check_s = found
                before = report.candidate(report.rule_pick)
                assert before is not None
                after = report.chosen
                stated = after.neighbours_meet or "misses them at" in report.lines()[0]
                for label, candidate in (("before", before), ("after", after)):
                    if suffix and label == "before":
                        continue
                    row = describe(
                        candidate,
                        settings[candidate.trial_number],
                        engine,
                        trace,
                        later,
                        slos,
                        bars,
                        grid_best,
                        later_grid,
                    )
                    row.update(
                        variant=label + suffix,
                        seed=seed,
                        study_s=study_s,
                        check_s=check_s,
                        check_runs=report.runs,
                        unsafe_stated=stated,
                    )
                    rows.append(row)
                    print(
                        f"  seed {seed} {label + suffix:<14} trial {row['trial']:>3} "
                        f"tokens {row['settings']['max_num_batched_tokens']:>5} seqs "
                        f"{row['settings']['max_num_seqs']:>4}: neighbours "
                        f"{row['neighbours_met']}/{row['neighbours']} meet, load "
                        f"{row['load']:g}x, vs grid {row['vs_grid']:+.1%}; later: "
                        f"{'meets' if row['later_meets'] else 'MISSES'} "
                        f"(ratio {row['later_ratio']:.3f}, rank {row['later_rank']}/"
                        f"{len(points)}); checks {report.runs} runs {check_s:.1f} s vs "
                        f"study {study_s:.1f} s"
                    )
        results[name] = {"grid_best": grid_best, "later_best": later_best, "rows": rows}
        for variant in dict.fromkeys(row["variant"] for row in rows):
            own = [row for row in rows if row["variant"] == variant]
            gap = statistics.median(r["vs_grid"] for r in own)
            print(
                f"  {variant:<14} median vs grid {gap:+.1%}; "
                f"all neighbours meet {sum(r['neighbours_met'] == r['neighbours'] for r in own)}/"
                f"{len(own)}; load ≥1.25x {sum(r['load'] >= 1.25 for r in own)}/{len(own)}; "
                f"meets later {sum(r['later_meets'] for r in own)}/{len(own)}; a neighbour "
                f"missed and not said {sum(not r['unsafe_stated'] for r in own)}"
            )
    print(f"\n{engine.runs} distinct simulations, {time.perf_counter() - started_all:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
