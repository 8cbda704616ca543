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

import json
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import optuna

from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.scoring import Verdict
from prefill_tuner.search_spaces.render import serve_command
from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import baseline_outside_note
from prefill_tuner.storage.batched import BatchedStorage, write_now
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TrialRow, TunerStore
from prefill_tuner.study.budget import admit, refuse
from prefill_tuner.study.evaluation import capacity_search, objective_value, verdict_of
from prefill_tuner.study.first_trials import rule_trials
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.windows import judge_windows

PESSIMISTIC_SECONDS = 3600.0
"""Objective value for a failed trial when no trial has succeeded yet."""


@dataclass
class TrialResult:
    """One finished trial, as the progress display sees it."""

    number: int
    settings: dict[str, Any]
    values: list[float]
    verdict: Verdict
    failure: str | None
    is_baseline: bool
    cut_short: str | None = None
    """Why the early-abort rule stopped its replay, if it did."""
    log_path: str | None = None
    """The server log of a real engine's trial."""
    overhead_s: dict[str, float] = field(default_factory=dict)
    """Where a real trial's time went (``resolve``, ``start-up``, ``replay``, ``teardown``)."""
    wall_s: float = 0.0
    """How long the trial took, end to end (engine, scoring, storing)."""
    same_as: int | None = None
    """The earlier trial whose settings it has (after the repair, in their canonical form):
    its result was reused, the engine did not run."""


@dataclass
class StudyProgress:
    """Callbacks for a display; all optional."""

    on_start: Callable[[int, int], None] = lambda finished, remaining: None
    on_trial: Callable[[TrialResult], None] = lambda result: None
    on_recovered: Callable[[list[int]], None] = lambda numbers: None
    """Trials an earlier run did not finish (stopped, killed), queued to run again."""


RUNNER_ATTR = "runner"
"""User attribute of a trial run by ``tune run``: the process running it (host, pid, start)."""
LIVE = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.WAITING,
)
"""States of a trial that has run or will run."""


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``None``: no such process). With
    the pid it names a process uniquely: a reused pid has another start time."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def this_runner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())}


def requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue a trial that did not finish to run again, with the same parameters and marks
    (a baseline stays the baseline)."""
    attrs = {k: v for k, v in trial.user_attrs.items() if k not in (RUNNER_ATTR,)}
    # A queued trial's parameters are Optuna's ``fixed_params`` until the objective suggests
    # them: a trial stopped before that (inside Optuna's ``ask``) has no ``params`` yet.
    params = {**trial.system_attrs.get("fixed_params", {}), **trial.params}
    study.enqueue_trial(params, user_attrs={**attrs, "retry_of": trial.number})


WORKER_ATTR = "worker"
"""User attribute naming the ``tune worker`` that claimed a trial (it has heartbeats)."""
RUN_BY_ATTR = "run_by"
"""Study user attribute: the process that holds (or last held) the study's run lock."""


def recover_orphans(
    study: optuna.Study, store: TunerStore, record: StudyRecord, *, ours: bool = False
) -> list[int]:
    """Fail and queue again the RUNNING trials that no process will finish; without this they
    stay RUNNING for ever. Called under the study's run lock (:func:`running`), so no other
    ``tune run`` is creating trials. The orphans: the trials of ``tune run`` processes on this
    machine that no longer exist (a SIGKILL, a power cut); the trials a run left before its
    objective marked them (a stop inside Optuna's ``ask``, which makes a trial RUNNING before
    it is handed over); and with ``ours``, this process's own (after a stop). Trials of other
    machines' runs, and of workers (whose heartbeats say when they died), are left alone."""
    host, me = socket.gethostname(), this_runner()
    recovered = []
    with store.study_lock(record):  # a worker marks the trial it asked for under this lock
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            runner = trial.user_attrs.get(RUNNER_ATTR)
            if WORKER_ATTR in trial.user_attrs:
                continue
            if isinstance(runner, dict):
                if runner.get("host") != host:
                    continue
                if runner == me and not ours:
                    continue
                alive = _process_start(int(runner.get("pid", -1))) == runner.get("start")
                if alive and runner != me:
                    continue
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            requeue(study, trial)
            recovered.append(trial.number)
    return recovered


@contextmanager
def running(study: optuna.Study, store: TunerStore, record: StudyRecord) -> Iterator[None]:
    """The block in which this process runs the study's trials: it holds the study's run
    lock (:meth:`~prefill_tuner.storage.store.TunerStore.run_lock`; another process running
    the study is a :class:`TunerError`, before any trial), and a stop (``KeyboardInterrupt``)
    leaves no trial of its RUNNING."""
    with store.run_lock(record) as held:
        if not held:
            raise TunerError(
                f"study {record.name!r} is being run by another process"
                f"{_holder_words(study.user_attrs.get(RUN_BY_ATTR))}: two runs would each run "
                "its `trials`; wait for that one to end, or stop it (its finished trials are "
                "kept) and run this command again"
            )
        study.set_user_attr(
            RUN_BY_ATTR, {**this_runner(), "since": datetime.now(timezone.utc).isoformat()}
        )
        try:
            yield
        except KeyboardInterrupt:
            recover_orphans(study, store, record, ours=True)
            raise


def _holder_words(holder: Any) -> str:
    """`` (pid 123 on host h, since 2026-12-01 21:40 UTC)``: who holds a run lock, as the
    holder recorded it; empty when it did not."""
    if not isinstance(holder, dict):
        return ""
    since = str(holder.get("since", ""))[:16].replace("T", " ")
    return f" (pid {holder.get('pid')} on host {holder.get('host')}, since {since} UTC)"


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
            f"{option}: the study has {stored_text or _plain(stored)}, this command gives "
            f"{given_text or _plain(given_value)}",
        )
        for what, option, stored, given_value, stored_text, given_text in checks
        if _plain(stored) != _plain(given_value)
    ]


def _plain(value: Any) -> Any:
    """A value as JSON storage returns it (tuples become lists)."""
    return json.loads(json.dumps(value, default=str))


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
        study.enqueue_trial(plan.space.params_for(trial.settings), user_attrs={"rule": trial.rule})


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

        def stop_once_met(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            if until_feasible and _met(trial):
                study.stop()

        study.optimize(
            objective,
            n_trials=remaining,
            timeout=plan.timeout_s,
            catch=(),
            callbacks=[stop_once_met],
        )
    return study


def _met(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a finished trial met every SLO."""
    return trial.state == optuna.trial.TrialState.COMPLETE and bool(
        trial.user_attrs.get("feasible")
    )


class TrialObjective:
    """Optuna's objective: one trial = one engine run (or a capacity bisection)."""

    def __init__(
        self,
        plan: StudyPlan,
        engine: TrialEngine,
        store: TunerStore,
        record: StudyRecord,
        progress: StudyProgress,
        finished: list[optuna.trial.FrozenTrial],
        *,
        standalone: bool = False,
        predict: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        self.plan, self.engine, self.store, self.record = plan, engine, store, record
        self.progress = progress
        self.standalone = standalone
        """Trials run by this process alone (``tune run``): it marks them with its identity
        and queues an interrupted one again itself (workers have heartbeats and
        :func:`~prefill_tuner.worker.claim.give_up` for that)."""
        self.predict = predict
        """What the simulator predicts for a trial's settings (screened studies), stored
        beside what the trial measures."""
        self.max_model_len = engine.max_model_len(dict(plan.space.fixed))
        self.windows = (
            judge_windows(plan.trace, plan.judge_windows)
            if plan.objective_mode == "latency"
            else []
        )
        """The windows each trial is also judged on (:mod:`prefill_tuner.study.windows`)."""
        # Worst objective values seen, for pessimistic values of failed trials.
        self.worst: list[float | None] = [None] * len(plan.objectives)
        for trial in finished:
            self._note_values(trial.values)

    def __call__(self, trial: optuna.Trial) -> list[float]:
        try:
            return self._run(trial)
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM mid-trial: Optuna fails the trial; its settings run again on
            # resume (the baseline stays the baseline), so nothing asked for is lost.
            if self.standalone:
                requeue(trial.study, trial.study.get_trials(deepcopy=False)[trial.number])
            raise

    def _run(self, trial: optuna.Trial) -> list[float]:
        plan = self.plan
        if self.standalone:
            trial.set_user_attr(RUNNER_ATTR, this_runner())
        started_at, started = datetime.now(timezone.utc), time.perf_counter()
        sampled = plan.space.suggest(trial)
        outside = dict(trial.user_attrs.get("baseline_outside") or {})
        sampled.update(outside)
        settings, repairs = effective_settings(sampled, plan.space.fixed, self.max_model_len)
        if outside:
            repairs.insert(0, baseline_outside_note(outside))
        if self.standalone:  # its settings and runner are stored as it is admitted
            admitted, running = admit(trial, self.store, self.record, plan.trials)
            if not admitted:  # workers (or another path to the database) spent the budget
                raise refuse(trial, running, drop=(RUNNER_ATTR,))
        same = None if trial.user_attrs.get("baseline") else self._same_as(trial, settings)
        if same is not None:
            return self._reuse(trial, same, settings, repairs, started_at, started)
        # Its settings and runner, stored before it runs: a crash reruns them.
        write_now(trial.study)
        label = f"{plan.name}-trial-{trial.number:04d}"
        if plan.objective_mode == "capacity":
            run, verdict, multiplier = capacity_search(
                self.engine,
                plan.trace,
                settings,
                plan.slos,
                plan.error_budget,
                plan.capacity_tolerance,
                plan.abort_rule,
                label=label,
                max_concurrency=plan.shaping.max_concurrency,
            )
            values = [multiplier]
        else:
            run = self.engine.run(
                plan.trace,
                settings,
                plan.abort_rule,
                label=label,
                max_concurrency=plan.shaping.max_concurrency,
            )
            verdict = verdict_of(run, plan.slos, plan.error_budget)
            values = [objective_value(run, o.name) for o in plan.objectives]
            if self.windows and run.metrics is not None:
                verdict, judged = self._judge_windows(settings, label, verdict)
                run.details = {**run.details, "windows": judged}
        values = self._pessimistic(values, failed=bool(run.failure) or run.metrics is None)
        self._note_values(values)
        for name, value in verdict.constraints.items():
            trial.set_constraint(name, value)
        is_baseline = bool(trial.user_attrs.get("baseline"))
        command = serve_command(
            plan.model, settings, self.engine.capabilities, self.engine.server_args
        )
        trial.set_user_attr("feasible", verdict.feasible)
        trial.set_user_attr("settings", settings)
        trial.set_user_attr("serve_command", command)
        if run.failure:
            trial.set_user_attr("failure", run.failure)
        if run.cut_short:
            trial.set_user_attr("cut_short", run.cut_short.reason)
        metrics = run.metrics.as_dict() if run.metrics else None
        if metrics is not None:
            metrics["details"] = run.details
            predicted = self.predict(settings) if self.predict is not None else None
            if predicted is not None:
                metrics["details"] = {**run.details, "predicted": predicted}
        wall_s = time.perf_counter() - started
        self.store.add_trial(
            self.record,
            self.engine.name,
            run.version,
            TrialRow(
                trial_number=trial.number,
                is_baseline=is_baseline,
                params=dict(trial.params),
                settings=settings,
                repairs=repairs,
                serve_command=command,
                resolved_config=run.resolved_config,
                trace_sha256=self.record.trace_sha256,
                shaping=plan.shaping.model_dump(),
                metrics=metrics,
                objectives=dict(zip([o.name for o in plan.objectives], values, strict=True)),
                constraints=verdict.constraints,
                slacks=verdict.slacks,
                feasible=verdict.feasible,
                status="failed" if run.failure else "complete",
                failure_reason=run.failure,
                started_at=started_at,
                wall_s=wall_s,
                log_path=run.log_path,
                startup_s=run.startup_s,
            ),
        )
        self.progress.on_trial(
            TrialResult(
                trial.number,
                settings,
                values,
                verdict,
                run.failure,
                is_baseline,
                run.cut_short.reason if run.cut_short else None,
                run.log_path,
                run.overhead_s,
                time.perf_counter() - started,
            )
        )
        return values

    def _same_as(self, trial: optuna.Trial, settings: dict[str, Any]) -> TrialRecord | None:
        """The earliest stored trial that ran to completion with exactly these settings (in
        their canonical form two settings that schedule alike are equal) on this engine
        version, if any."""
        return next(
            (
                row
                for row in self.store.trials(self.record)
                if row.status == "complete"
                and row.trial_number != trial.number
                and row.engine_version.version == self.engine.version
                and _plain(row.settings) == _plain(settings)
            ),
            None,
        )

    def _reuse(
        self,
        trial: optuna.Trial,
        same: TrialRecord,
        settings: dict[str, Any],
        repairs: list[str],
        started_at: datetime,
        started: float,
    ) -> list[float]:
        """Complete a trial with the result of an earlier one with the same settings: the
        engine would schedule them identically, so it does not run again (Optuna still sees
        the point, so the sampler learns it is known). Recorded, marked with ``same_as``."""
        values = [float(same.objectives[o.name]) for o in self.plan.objectives]
        for name, value in same.constraints.items():
            trial.set_constraint(name, value)
        trial.set_user_attr("feasible", same.feasible)
        trial.set_user_attr("settings", settings)
        trial.set_user_attr("serve_command", same.serve_command)
        trial.set_user_attr("same_as", same.trial_number)
        note = f"the same settings as trial {same.trial_number}: its result is reused, not rerun"
        wall_s = time.perf_counter() - started
        self.store.add_trial(
            self.record,
            self.engine.name,
            same.engine_version.version,
            TrialRow(
                trial_number=trial.number,
                params=dict(trial.params),
                settings=settings,
                repairs=[*repairs, note],
                serve_command=same.serve_command,
                resolved_config=same.resolved_config,
                trace_sha256=self.record.trace_sha256,
                shaping=self.plan.shaping.model_dump(),
                metrics=same.metrics,
                objectives=dict(same.objectives),
                constraints=dict(same.constraints),
                slacks=dict(same.slacks),
                feasible=same.feasible,
                status="complete",
                started_at=started_at,
                wall_s=wall_s,
            ),
        )
        self.progress.on_trial(
            TrialResult(
                trial.number,
                settings,
                values,
                Verdict(dict(same.constraints), dict(same.slacks)),
                None,
                False,
                wall_s=wall_s,
                same_as=same.trial_number,
            )
        )
        return values

    def _judge_windows(
        self, settings: dict[str, Any], label: str, verdict: Verdict
    ) -> tuple[Verdict, dict[str, Any]]:
        """The trial's verdict with every judge window's constraints and slacks joined as
        ``NAME@WINDOW``, and what each window measured (for the trial's details)."""
        plan = self.plan
        constraints, slacks = dict(verdict.constraints), dict(verdict.slacks)
        judged: dict[str, Any] = {}
        for window in self.windows:
            run = self.engine.run(
                window.trace,
                settings,
                plan.abort_rule,
                label=f"{label}-{window.spec.replace(':', '-')}",
                max_concurrency=plan.shaping.max_concurrency,
            )
            own = verdict_of(run, plan.slos, plan.error_budget)
            constraints.update({f"{k}@{window.spec}": v for k, v in own.constraints.items()})
            slacks.update({f"{k}@{window.spec}": v for k, v in own.slacks.items()})
            judged[window.spec] = {
                "start_s": window.start_s,
                "requests": len(window.trace),
                "feasible": own.feasible,
                "objectives": {o.name: objective_value(run, o.name) for o in plan.objectives},
                "failure": run.failure,
            }
        return Verdict(constraints=constraints, slacks=slacks), judged

    def _note_values(self, values: list[float] | None) -> None:
        if not values:
            return
        for index, (value, objective) in enumerate(zip(values, self.plan.objectives, strict=True)):
            if math.isnan(value):
                continue
            current = self.worst[index]
            worse = max if objective.direction == "minimize" else min
            self.worst[index] = value if current is None else worse(current, value)

    def _pessimistic(self, values: list[float], *, failed: bool) -> list[float]:
        """Replace what was not measured, and everything of a failed run, by the worst value
        seen so far (a failed run's partial metrics would otherwise look good)."""
        result = []
        for value, worst, objective in zip(values, self.worst, self.plan.objectives, strict=True):
            if not failed and not math.isnan(value):
                result.append(value)
            elif worst is not None:
                result.append(worst)
            elif objective.direction == "maximize":
                result.append(0.0)
            else:
                result.append(value if not math.isnan(value) else PESSIMISTIC_SECONDS)
        return result
