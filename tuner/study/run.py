"""The tuning study: Optuna proposes engine settings, the engine replays the trace, the run is
judged against the SLOs, and every trial is recorded.

Optuna 5 rules this module follows (docs/optuna.md): constraints are set inside the
objective with ``trial.set_constraint`` and every complete trial sets the same keys; an engine
failure is not left as FAIL (TPE would walk back into the failing region) but completed with
violated constraints and pessimistic objective values (the worst seen so far); the sampler's
seed is derived per resume so a resumed study does not re-propose what it already ran; the
directions of a loaded study are checked, since Optuna does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.storage.batched import BatchedStorage
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.first_trials import RULE_ATTR, rule_trials
from prefill_tuner.study.grouping import Callback, group_by_server
from prefill_tuner.study.local_search import refine_budget
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.runners import LIVE, recover_orphans, running
from prefill_tuner.study.trial import StudyProgress, TrialObjective, TrialResult, plain

__all__ = [
    "StudyProgress",
    "TrialObjective",
    "TrialResult",
    "baseline_outside",
    "definition_changes",
    "enqueue_baseline",
    "enqueue_rule_trials",
    "make_sampler",
    "open_study",
    "prepare_run",
    "run_study",
    "study_directions",
]


def make_sampler(kind: str, seed: int, startup_trials: int = 8) -> optuna.samplers.BaseSampler:
    """Multivariate TPE (fast, models knob interactions, handles constraints); or random."""
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(multivariate=True, seed=seed, n_startup_trials=startup_trials)


def open_study(
    plan: StudyPlan, store: TunerStore, engine: TrialEngine
) -> tuple[optuna.Study, StudyRecord]:
    """Create the study, or load it and check it is the same study (same trace, SLOs, goal)."""
    slo_texts = [str(slo) for slo in plan.slos]
    source = plan.trace.source
    trace_sha = source.sha256 if source else ""
    record = store.get_study(plan.name)
    if record is None:
        record = store.create_study(
            name=plan.name,
            objective_mode=plan.objective_mode,
            slos=slo_texts,
            error_budget=plan.error_budget,
            engine=engine.name,
            model=plan.model,
            trace_path=source.path if source else "",
            trace_sha256=trace_sha,
            trace_format=source.format if source else "",
            shaping=plan.shaping.model_dump(),
            space={
                "searched": plan.space.describe(),
                "fixed": plan.space.fixed,
                "dropped": [str(d) for d in plan.space.dropped],
            },
        )
    else:
        changes = definition_changes(record, plan, engine.name)
        if engine.deterministic:
            # A simulated study's numbers are its profile's (and replica count's): one study
            # must not mix two.
            recorded = (record.definition or {}).get("engine_version")
            ran = {recorded} if recorded else set()
            ran |= {trial.engine_version.version for trial in store.trials(record)}
            if ran and engine.version not in ran:
                changes.append(
                    Change(
                        "engine",
                        f"the study's trials ran on {sorted(ran)[0]}, this command's is "
                        f"{engine.version} (another `profile`, replica count or router)",
                    )
                )
        if changes:
            what = ", ".join(dict.fromkeys(change.what for change in changes))
            details = "; ".join(change.detail for change in changes)
            raise TunerError(
                f"study {plan.name!r} exists with a different {what} ({details}): resume it "
                "with the same options, or start another with another `name`"
            )
    directions = study_directions(plan)
    try:
        study = optuna.create_study(
            storage=BatchedStorage(plan.storage_url),
            study_name=plan.name,
            directions=directions,
            load_if_exists=True,
        )
    except Exception as exc:  # Optuna wraps storage errors in many types
        raise TunerError(
            f"cannot open the Optuna study {plan.name!r}: {str(exc).splitlines()[0]}"
        ) from None
    if list(study.directions) != directions:
        raise TunerError(f"study {plan.name!r} has other objectives; use another `name`")
    return study, record


@dataclass(frozen=True)
class Change:
    """One way a plan differs from the stored study it would resume."""

    what: str
    """``trace``, ``SLOs``, ``error budget``, ``search space``..."""
    detail: str
    """``OPTION: the study has X, this command gives Y``."""


ENGINE_SHAPING = ("max_model_len", "over_length")
"""Shaping options a study takes from its engine (the context length), not from the user."""


def definition_changes(record: StudyRecord, plan: StudyPlan, engine: str) -> list[Change]:
    """What this plan changes in a stored study's definition (empty when it is the same
    study). The trial budget, seed, sampler and timeout may change between runs; what decides
    a trial's measurement or verdict may not, or one study would mix two."""
    source = plan.trace.source
    trace_sha = source.sha256 if source else ""
    given_ranges = {name: knob.as_record() for name, knob in plan.space.ranges.items()}
    stored_ranges = (record.definition or {}).get("ranges")
    searched = "; ".join(line for line in record.space.get("searched", []) if "(fixed)" not in line)
    given = "; ".join(line for line in plan.space.describe() if "(fixed)" not in line)
    checks: list[tuple[str, str, Any, Any, str | None, str | None]] = [
        ("trace", "`trace`", record.trace_sha256, trace_sha,
         f"sha256 {record.trace_sha256[:12]}…", f"sha256 {trace_sha[:12]}…"),
        ("SLOs", "`slos`", sorted(record.slos), sorted(str(s) for s in plan.slos), None, None),
        ("objective", "`objective_mode`", record.objective_mode, plan.objective_mode, None, None),
        ("engine", "`engine`", record.engine, engine, None, None),
        ("error budget", "`error_budget`", record.error_budget, plan.error_budget, None, None),
        ("fixed settings", "`fixed`", record.space.get("fixed", {}), dict(plan.space.fixed), None,
         None),
    ]  # fmt: skip
    if stored_ranges is not None:  # recorded since workers exist
        checks.append(("search space", "`ranges`", stored_ranges, given_ranges, searched, given))
    stored_windows = ((record.definition or {}).get("options") or {}).get("judge_windows", [])
    checks.append(
        ("judge windows", "`judge_windows`", list(stored_windows), list(plan.judge_windows),
         None, None)
    )  # fmt: skip
    stored_shaping, given_shaping = record.shaping, plan.shaping.model_dump()
    for option in sorted(set(stored_shaping) | set(given_shaping)):
        # The context length clips the trace as the engine's settings say (`fixed`); every
        # other shaping option is the user's own.
        named = f"trace shaping {option}" if option in ENGINE_SHAPING else f"`{option}`"
        checks.append(
            ("shaping", named, stored_shaping.get(option), given_shaping.get(option), None, None)
        )
    return [
        Change(
            what,
            f"{option}: the study has {stored_text or plain(stored)}, this command gives "
            f"{given_text or plain(given_value)}",
        )
        for what, option, stored, given_value, stored_text, given_text in checks
        if plain(stored) != plain(given_value)
    ]


def study_directions(plan: StudyPlan) -> list[optuna.study.StudyDirection]:
    return [
        optuna.study.StudyDirection.MINIMIZE
        if o.direction == "minimize"
        else optuna.study.StudyDirection.MAXIMIZE
        for o in plan.objectives
    ]


def baseline_outside(plan: StudyPlan, engine: TrialEngine) -> dict[str, Any]:
    """The engine's defaults that lie outside the searched ranges (``--space
    enable_chunked_prefill=false``): the baseline runs them all the same."""
    return plan.space.outside(engine.default_settings())


def enqueue_baseline(study: optuna.Study, plan: StudyPlan, engine: TrialEngine) -> None:
    """Queue the engine's defaults as the study's first trial, marked as the baseline.

    A default outside its searched range is enqueued as the nearest point of the range
    (Optuna refuses a categorical choice outside the distribution) and restored when the trial
    runs (``baseline_outside``): the baseline measures the engine's defaults, and the sampler
    sees one point at the range's edge."""
    defaults = engine.default_settings()
    baseline = {name: value for name, value in defaults.items() if name in plan.space.ranges}
    attrs: dict[str, Any] = {"baseline": True}
    outside = plan.space.outside(baseline)
    if outside:
        attrs["baseline_outside"] = outside
    study.enqueue_trial(plan.space.params_for(baseline), user_attrs=attrs)


def enqueue_rule_trials(study: optuna.Study, plan: StudyPlan, engine: TrialEngine) -> None:
    """Queue the rule-derived first trials (:mod:`prefill_tuner.study.first_trials`) after the
    baseline, each marked with its rule; nothing when ``plan.rule_trials`` is off, under the
    random sampler (a random search is the reference the rules and TPE are measured against,
    so it runs only the engine's defaults, the reference of every ratio, before its random
    points), or in a screened study (the simulator's Pareto-optimal candidates run after the
    baseline there)."""
    if not plan.rule_trials or plan.sampler == "random" or plan.screen_trials:
        return
    defaults = engine.default_settings()
    rules = rule_trials(plan, defaults, engine.max_model_len(dict(plan.space.fixed)))
    for trial in rules[: max(plan.trials - 1, 0)]:  # no more than the study will run
        study.enqueue_trial(
            plan.space.params_for(trial.settings), user_attrs={RULE_ATTR: trial.rule}
        )


def prepare_run(
    study: optuna.Study,
    plan: StudyPlan,
    engine: TrialEngine,
    store: TunerStore,
    record: StudyRecord,
) -> list[int]:
    """Before a run starts trials (inside :func:`running`): fail what a dead run left RUNNING
    and queue it again, seed the sampler for this run, and queue the baseline on a first run
    (or when it never finished), and on a first run the rule-derived trials after it. Returns
    the numbers of the trials an earlier run did not finish, queued to run again."""
    recover_orphans(study, store, record)
    study.sampler = make_sampler(plan.sampler, plan.seed + len(study.trials), plan.startup_trials)
    first_run = not study.trials
    if not any(t.user_attrs.get("baseline") and t.state in LIVE for t in study.trials):
        enqueue_baseline(study, plan, engine)
    if first_run:
        enqueue_rule_trials(study, plan, engine)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return [t.user_attrs["retry_of"] for t in waiting if "retry_of" in t.user_attrs]


def run_study(
    plan: StudyPlan,
    engine: TrialEngine,
    store: TunerStore,
    progress: StudyProgress | None = None,
    opened: tuple[optuna.Study, StudyRecord] | None = None,
    *,
    until_feasible: bool = False,
) -> optuna.Study:
    """Run the study to ``plan.trials`` finished trials (or the timeout), or with
    ``until_feasible`` only until one meets every SLO. KeyboardInterrupt propagates after the
    finished trials are stored. ``opened``: the result of :func:`open_study`, when the caller
    already opened (and so checked) it."""
    progress = progress or StudyProgress()
    study, record = opened or open_study(plan, store, engine)
    with running(study, store, record):
        recovered = prepare_run(study, plan, engine, store, record)
        finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        remaining = max(plan.trials - len(finished), 0)
        if until_feasible and any(_met(trial) for trial in finished):
            remaining = 0
        progress.on_start(len(finished), remaining)
        if recovered:
            progress.on_recovered(recovered)
        if remaining == 0:
            return study
        objective = TrialObjective(plan, engine, store, record, progress, finished, standalone=True)

        queueing = trial_callbacks(plan, engine)

        def after_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            if until_feasible and _met(trial):
                study.stop()  # and nothing queued that this run would leave waiting
                return
            for callback in queueing:
                callback(study, trial)

        study.optimize(
            objective,
            n_trials=remaining,
            timeout=plan.timeout_s,
            catch=(),
            callbacks=[after_trial],
        )
    return study


def trial_callbacks(plan: StudyPlan, engine: TrialEngine) -> list[Callback]:
    """What queues trials as the study goes (``tune run`` and ``tune worker`` alike): the
    budget refinement rounds (:mod:`~prefill_tuner.study.local_search`), then a sampled trial's
    siblings on its server (:mod:`~prefill_tuner.study.grouping`), which wait while a round is
    queued."""
    found = (refine_budget(plan), group_by_server(plan.space, engine, plan.trials))
    return [callback for callback in found if callback is not None]


def _met(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a finished trial met every SLO."""
    return trial.state == optuna.trial.TrialState.COMPLETE and bool(
        trial.user_attrs.get("feasible")
    )
