"""One night of retuning: a new generation of the study, warm-started from the last one; the
incumbent re-measured on the night's trace; a search within a trial budget and a deadline;
the best challenger re-measured; the promotion rule (:mod:`prefill_tuner.nightly.promotion`); a
dated report and the serve lines of whatever is deployed next.

Generation N of the family ``NAME`` is the study ``NAME-gN`` (``tune pareto --study NAME-gN``
shows it); ``tuner_nightly_runs`` records each night. A night that was interrupted resumes
its generation when run again with the same trace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from prefill_tuner import exit_codes
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.real.engine import server_engine
from prefill_tuner.engines.real.verify import IRREGULAR, verify
from prefill_tuner.errors import TunerError
from prefill_tuner.nightly.job import NightlyJob
from prefill_tuner.nightly.outputs import write_outputs
from prefill_tuner.nightly.promotion import Decision, Measurement, decide
from prefill_tuner.objectives.scoring import statistic
from prefill_tuner.output.html import write_report
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.render import serve_command
from prefill_tuner.search_spaces.space import knob_availability
from prefill_tuner.storage.batched import optuna_storage
from prefill_tuner.storage.models import NightlyRun, StudyRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.evaluation import verdict_of
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.run import (
    StudyProgress,
    definition_changes,
    enqueue_baseline,
)
from prefill_tuner.study.screening import give_profile
from prefill_tuner.study.session import TuningSession
from prefill_tuner.study.summary import StudySummary, summarize_study
from prefill_tuner.study.windows import judge_windows
from prefill_tuner.trace.stats import trace_stats

EXIT_KEPT = exit_codes.OK
EXIT_PROMOTED = exit_codes.PROMOTED
EXIT_NOTHING_MEETS_SLOS = exit_codes.NOTHING_MEETS_SLOS
EXIT_CODES = {
    "keep": EXIT_KEPT,
    "promote": EXIT_PROMOTED,
    "none": EXIT_NOTHING_MEETS_SLOS,
    "rejected": exit_codes.VERIFY_FAILED,
}


@dataclass(frozen=True)
class NightlyOutcome:
    generation: int
    study_name: str
    decision: Decision
    deployed: dict[str, Any] | None
    serve_command: str | None
    report_path: Path
    """The night's Markdown report."""
    engine_changed: bool
    page_path: Path | None = None
    """The generation's HTML report, when the job writes one."""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.decision.action]


def retune(
    nightly: NightlyJob,
    engine: TrialEngine,
    store: TunerStore,
    progress: StudyProgress | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> NightlyOutcome:
    """Run one night (see the module docstring)."""
    if nightly.verify and not engine.starts_servers:
        raise TunerError("`verify`: only with `engine` vllm (the simulator computes no outputs)")
    started, started_at = time.monotonic(), datetime.now(timezone.utc)
    previous = store.last_nightly(nightly.family)
    generation = tonights_generation(nightly, store, engine, previous, say)
    plan = replace(nightly.plan, name=f"{nightly.family}-g{generation}")
    incumbent = previous.deployed if previous else None
    engine_changed = previous is not None and previous.engine_version != engine.version
    if previous is not None and engine_changed:
        say(f"engine changed: {previous.engine_version} → {engine.version}")
    repeats = 1 if engine.deterministic else nightly.repeats

    incumbent_runs = _remeasure(engine, plan, incumbent, repeats, say)
    measuring_s = time.monotonic() - started

    timeout = None
    if nightly.deadline_s is not None:
        # Leave as much time for re-measuring the challenger as the incumbent took.
        timeout = nightly.deadline_s - (time.monotonic() - started) - max(measuring_s, 0.0)
    summary, record = _search(
        nightly,
        replace(plan, timeout_s=timeout),
        engine,
        store,
        (previous, incumbent),
        progress,
        say,
    )

    challenger = summary.recommended.settings if summary.recommended else None
    if challenger is not None and incumbent is not None and _same(challenger, incumbent):
        challenger = None  # the search's best is the incumbent itself
    challenger_runs = None
    if challenger is not None:
        say(f"re-measuring the challenger ({repeats} run{'s' * (repeats > 1)})")
        challenger_runs = measure(engine, plan, challenger, repeats)

    busiest = busiest_runs(engine, plan, incumbent if incumbent_runs else None, challenger, say)
    decision = decide(incumbent_runs, challenger_runs, nightly.min_gain)
    if decision.action == "promote" and nightly.verify and challenger is not None:
        decision = verified(decision, engine, plan, challenger, say)
    deployed = challenger if decision.action == "promote" else incumbent
    command = (
        serve_command(plan.model, deployed, engine.capabilities, engine.server_args)
        if deployed
        else None
    )
    night = NightlyRun(
        family=nightly.family,
        generation=generation,
        study_name=plan.name,
        started_at=started_at,
        trace_path=record.trace_path,
        trace_sha256=record.trace_sha256,
        trace_stats=trace_stats(plan.trace).as_dict() if len(plan.trace) else {},
        engine_version=engine.version,
        incumbent=incumbent,
        incumbent_runs=[_as_record(m) for m in incumbent_runs or []],
        challenger=challenger,
        challenger_runs=[_as_record(m) for m in challenger_runs or []],
        decision=decision.action,
        reason=decision.reason,
        deployed=deployed,
        serve_command=command,
        report_path="",
        wall_s=0.0,
        busiest=busiest,
    )
    night.wall_s = time.monotonic() - started
    report_path = write_outputs(nightly, night, previous, summary, engine.capabilities)
    night.report_path = str(report_path)
    store.add_nightly(night)
    page = None
    if nightly.html_report:  # written atomically: a stop leaves no half-written page
        page = write_report(store, plan.name, report_path.with_suffix(".html")).page
    return NightlyOutcome(
        generation=generation,
        study_name=plan.name,
        decision=decision,
        deployed=deployed,
        serve_command=command,
        report_path=report_path,
        engine_changed=engine_changed,
        page_path=page,
    )


def _remeasure(
    engine: TrialEngine,
    plan: StudyPlan,
    incumbent: dict[str, Any] | None,
    repeats: int,
    say: Callable[[str], None],
) -> list[Measurement] | None:
    """Tonight's runs of the incumbent (``None``: there is none, or tonight's engine cannot
    run its settings)."""
    if incumbent is None:
        return None
    unavailable = unavailable_settings(incumbent, engine)
    if unavailable:
        say(f"the incumbent cannot run on {engine.version}: {unavailable}")
        return None
    say(f"re-measuring the incumbent ({repeats} run{'s' * (repeats > 1)})")
    return measure(engine, plan, incumbent, repeats)


def _search(
    nightly: NightlyJob,
    searched: StudyPlan,
    engine: TrialEngine,
    store: TunerStore,
    before: tuple[NightlyRun | None, dict[str, Any] | None],
    progress: StudyProgress | None,
    say: Callable[[str], None],
) -> tuple[StudySummary, StudyRecord]:
    """Tonight's search, as ``tune run`` runs one (warm-started from the previous
    generation, screened where asked, within the deadline): its summary and study record."""
    previous, incumbent = before
    with TuningSession(searched, engine, store) as session:
        if searched.screen_trials and nightly.screen_profile is not None:
            give_profile(session.study, nightly.screen_profile)
        if not session.study.trials:
            enqueue_baseline(session.study, searched, engine)
            warm = _warm_start(session.study, searched, store, previous, incumbent)
            if warm:
                say(
                    f"warm start: {warm} configuration{'s' * (warm > 1)} of the previous "
                    "generation queued first"
                )
        if searched.timeout_s is None or searched.timeout_s > 0:
            if session.run(progress, say):
                raise KeyboardInterrupt  # every finished trial is kept; the night resumes
        else:
            say("the deadline left no time to search: the incumbent is kept if it holds")
        return session.summary(say), session.record


def verified(
    decision: Decision,
    engine: TrialEngine,
    plan: StudyPlan,
    challenger: Mapping[str, Any],
    say: Callable[[str], None],
) -> Decision:
    """The promotion, if ``tune verify`` finds the challenger's chunking changes no output;
    else ``rejected``, saying where the outputs diverged."""
    server = server_engine(engine)
    if server is None:
        return decision  # nothing to verify on the simulator: it computes no outputs
    say("verifying the challenger's outputs against a no-chunking reference")
    knobs = {k: v for k, v in challenger.items() if k in KNOBS}
    result = verify(
        server,
        {"challenger": knobs, "irregular chunks": IRREGULAR},
        fixed=dict(plan.space.fixed),
        say=say,
    )
    if result.passed:
        return decision
    failed = next(c for c in result.comparisons if not c.passed)
    return Decision("rejected", f"{decision.reason}, but {failed.line()}")


def tonights_generation(
    nightly: NightlyJob,
    store: TunerStore,
    engine: TrialEngine,
    previous: NightlyRun | None,
    say: Callable[[str], None],
) -> int:
    """The generation to run: the one after the last finished night. A generation that was
    interrupted (its study exists, its night was never recorded) is resumed when tonight's
    options are its own, and superseded otherwise (another trace: a new day's export), so one
    interrupted night never blocks the nights after it."""
    generation = previous.generation + 1 if previous else 1
    while True:
        name = f"{nightly.family}-g{generation}"
        record = store.get_study(name)
        if record is None:
            return generation
        changes = definition_changes(record, replace(nightly.plan, name=name), engine.name)
        if not changes:
            say(f"resuming generation {generation}, which was interrupted")
            return generation
        say(
            f"generation {generation} was interrupted and is superseded by generation "
            f"{generation + 1} ({changes[0].detail})"
        )
        generation += 1


def measure(
    engine: TrialEngine, plan: StudyPlan, settings: Mapping[str, Any], repeats: int
) -> list[Measurement]:
    """Run one configuration ``repeats`` times on the night's trace, to the end (no early
    abort: these runs decide what is deployed)."""
    runs = []
    for _ in range(repeats):
        run = engine.run(
            plan.trace,
            dict(settings),
            label=f"{plan.name}-measure",
            max_concurrency=plan.shaping.max_concurrency,
        )
        verdict = verdict_of(run, plan.slos, plan.error_budget)
        values = {
            slo.name: statistic(run.metrics, slo.name) if run.metrics else math.nan
            for slo in plan.slos
        }
        runs.append(Measurement(verdict.feasible, verdict.min_slack, values, run.failure))
    return runs


BUSIEST_S = 600.0
"""Tonight's busiest window, when the plan judges on none: the busiest 10 minutes (a quarter of
a shorter night)."""


def busiest_spec(plan: StudyPlan) -> str:
    """The busiest window the night reports on: the plan's first ``busiest:`` judge window,
    else :data:`BUSIEST_S` seconds (at most a quarter of the trace's span)."""
    given = next((spec for spec in plan.judge_windows if spec.startswith("busiest:")), None)
    if given is not None:
        return given
    arrivals = [r.arrival_s for r in plan.trace.requests]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return f"busiest:{max(min(BUSIEST_S, span / 4), 1.0):g}"


def busiest_runs(
    engine: TrialEngine,
    plan: StudyPlan,
    incumbent: Mapping[str, Any] | None,
    challenger: Mapping[str, Any] | None,
    say: Callable[[str], None],
) -> dict[str, Any] | None:
    """How the incumbent and the challenger do on tonight's busiest window (one run each; the
    whole night's runs decide): heavier traffic than the night's average is what tomorrow may
    bring. ``None`` when there is neither."""
    if incumbent is None and challenger is None:
        return None
    window = judge_windows(plan.trace, [busiest_spec(plan)])[0]
    say(f"measuring on tonight's busiest window, {window.words()}")
    shaped = replace(plan, trace=window.trace)
    result: dict[str, Any] = {
        "window": window.spec,
        "start_s": window.start_s,
        "requests": len(window.trace),
    }
    for label, settings in (("incumbent", incumbent), ("challenger", challenger)):
        runs = measure(engine, shaped, settings, 1) if settings is not None else []
        result[f"{label}_runs"] = [_as_record(m) for m in runs]
    return result


def unavailable_settings(settings: Mapping[str, Any], engine: TrialEngine) -> str:
    """Why this engine cannot take these settings (a knob its version lacks), or ''."""
    reasons = []
    for name in settings:
        knob = KNOBS.get(name)
        reason = knob_availability(knob, engine.capabilities) if knob else None
        if reason:
            reasons.append(f"{name}: {reason}")
    return "; ".join(reasons)


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return {k: v for k, v in a.items() if v is not None} == {
        k: v for k, v in b.items() if v is not None
    }


def _warm_start(
    study: optuna.Study,
    plan: StudyPlan,
    store: TunerStore,
    previous: NightlyRun | None,
    incumbent: Mapping[str, Any] | None,
) -> int:
    """Queue the incumbent and the previous generation's Pareto set first (by the parameters
    they were sampled with); those outside tonight's space (a new engine version, other
    ranges) are left out."""
    record = store.get_study(previous.study_name) if previous is not None else None
    if record is None:
        return 0
    try:
        last = optuna.load_study(study_name=record.name, storage=optuna_storage(plan.storage_url))
    except KeyError:
        return 0
    trials = store.trials(record)
    chosen = list(summarize_study(last, record, trials).pareto)
    if incumbent is not None:
        chosen += [trial for trial in trials if _same(trial.settings, incumbent)][:1]
    distributions = plan.space.distributions()
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    # Already queued (the baseline): not queued twice, and not counted as warm start.
    queued = [trial.system_attrs.get("fixed_params", {}) for trial in waiting]
    added = 0
    for trial in chosen:
        params = trial.params
        if params in queued or set(params) != set(distributions):
            continue
        if all(_within(distributions[name], value) for name, value in params.items()):
            study.enqueue_trial(params)
            queued.append(params)
            added += 1
    return added


def _within(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    if isinstance(distribution, IntDistribution):
        return isinstance(value, int) and distribution.low <= value <= distribution.high
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    return False


def _as_record(measurement: Measurement) -> dict[str, Any]:
    return {
        "feasible": measurement.feasible,
        "headroom": measurement.headroom,
        "values": measurement.values,
        "failure": measurement.failure,
    }
