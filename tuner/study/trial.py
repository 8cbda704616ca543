"""One trial of a study: Optuna's objective (:class:`TrialObjective`) runs the engine on the
trial's settings (or reuses an earlier trial's result for the same settings), judges the run
against the SLOs on the whole trace and on each judge window, stores it, and reports it to the
display (:class:`TrialResult`, :class:`StudyProgress`). Failed runs get pessimistic values, as
:mod:`prefill_tuner.study.run` explains."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import optuna

from prefill_tuner.engines.base import EngineRun, TrialEngine
from prefill_tuner.objectives.scoring import Verdict
from prefill_tuner.search_spaces.render import serve_command
from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import baseline_outside_note
from prefill_tuner.storage.batched import write_now
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TrialRow, TunerStore
from prefill_tuner.study import runners
from prefill_tuner.study.budget import admit, refuse
from prefill_tuner.study.evaluation import capacity_search, objective_value, verdict_of
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.runners import RUNNER_ATTR, this_runner
from prefill_tuner.study.windows import judge_windows


def plain(value: Any) -> Any:
    """A value as JSON storage returns it (tuples become lists)."""
    return json.loads(json.dumps(value, default=str))


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
                runners.requeue(trial.study, trial.study.get_trials(deepcopy=False)[trial.number])
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
        run, verdict, values = self._measure(settings, f"{plan.name}-trial-{trial.number:04d}")
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

    def _measure(
        self, settings: dict[str, Any], label: str
    ) -> tuple[EngineRun, Verdict, list[float]]:
        """The engine's run of ``settings`` (a capacity study: the bisection's), its verdict
        (on the whole trace and each judge window) and its objective values."""
        plan = self.plan
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
            return run, verdict, [multiplier]
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
        return run, verdict, values

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
                and plain(row.settings) == plain(settings)
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
