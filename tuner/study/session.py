"""A tuning session: everything ``tune run`` does, as the library does it.

``with TuningSession(plan, engine, store) as session`` opens the study (a resume with other
options is refused, before any work), holds its run lock (another process running it is
refused), records what ``tune worker`` needs to join it, and keeps a given profile for a real
engine's screening and explanation. Then :meth:`~TuningSession.run` runs its trials (screened
on the simulator when the plan says so); :meth:`~TuningSession.summary`,
:meth:`~TuningSession.why_infeasible` and :meth:`~TuningSession.baseline_finding` say what it
found, and :meth:`~TuningSession.write_report` writes the HTML report. :func:`tune_study` is the
whole of it in one call; the command line is argument parsing and display around the same
steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import optuna

from prefill_tuner.diagnosis.runs import trial_findings
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.output.html import ReportFiles, write_report
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.headroom import check_headroom, rule_key
from prefill_tuner.study.infeasibility import latency_floor, rate_headroom
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.recommend import references
from prefill_tuner.study.run import StudyProgress, open_study, run_study
from prefill_tuner.study.runners import running
from prefill_tuner.study.screening import give_profile, run_screened_study, stand_in
from prefill_tuner.study.summary import StudySummary, lockstep_caveat, summarize_stored
from prefill_tuner.worker.definition import definition_of

Say = Callable[[str], None]


class TuningSession:
    """One run of a study's trials, from its opening to its report (see the module)."""

    def __init__(
        self,
        plan: StudyPlan,
        engine: TrialEngine,
        store: TunerStore,
        *,
        sorted_trace: bool = False,
        given_profile: StepModel | None = None,
    ) -> None:
        """``sorted_trace``: the trace's arrivals were sorted when read (workers read it so);
        ``given_profile``: a real engine's stand-in profile, for its screening and for the
        explanation when nothing meets the SLOs."""
        self.plan, self.engine, self.store = plan, engine, store
        self.sorted_trace = sorted_trace
        self.given_profile = given_profile
        self._held = ExitStack()

    def __enter__(self) -> TuningSession:
        with ExitStack() as opening:
            self.study, self.record = open_study(self.plan, self.store, self.engine)
            opening.enter_context(running(self.study, self.store, self.record))
            self.store.record_definition(
                self.record,
                self.plan.trials,
                definition_of(self.plan, self.engine, sort=self.sorted_trace),
            )
            if self.given_profile is not None and self.engine.starts_servers:
                give_profile(self.study, self.given_profile)
            self._held = opening.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._held.__exit__(exc_type, exc, traceback)
        self.store.checkpoint()  # the file holds the whole study again, without its -wal

    def run(self, progress: StudyProgress | None = None, say: Say = lambda text: None) -> bool:
        """Run the study's trials to its target (or its timeout); ``True`` when a stop
        (``KeyboardInterrupt``) ended them: every finished trial is kept, and the trial that
        was running runs again on the next run."""
        try:
            if self.plan.screen_trials:
                run_screened_study(
                    self.plan,
                    self.engine,
                    self.store,
                    (self.study, self.record),
                    progress=progress,
                    say=say,
                )
            else:
                run_study(self.plan, self.engine, self.store, progress, (self.study, self.record))
        except KeyboardInterrupt:
            return True
        return False

    def summary(self, headroom: Say | None = None) -> StudySummary:
        """What the study found; with ``headroom`` (a sayer), after checking the best settings'
        headroom (:meth:`check_headroom`)."""
        summary = summarize_stored(self.store, self.plan.name)
        return summary if headroom is None else self.check_headroom(summary, headroom)

    def check_headroom(self, summary: StudySummary, say: Say = lambda text: None) -> StudySummary:
        """Check the best settings' load headroom and neighbours and return the summary with
        the recommendation they lead to (:func:`checked_summary`)."""
        return checked_summary(self.plan, self.engine, self.store, self.study, summary, say)

    def caveats(self, summary: StudySummary, say: Say) -> None:
        """What to bear in mind reading the answer: the recommended trial's TTFT simulated
        in lockstep waves (:func:`~prefill_tuner.study.summary.lockstep_caveat`)."""
        caveat = lockstep_caveat(summary, self.plan.shaping.max_concurrency)
        if caveat is not None:
            say(caveat)

    def why_infeasible(self, summary: StudySummary, say: Say) -> None:
        """When nothing met the SLOs of a latency study: whether any setting could at this
        load, and up to what load the closest trial's settings do, on the simulator (for a
        real server, its stand-in: the simulator with the study's profile on the server's
        config). Said line by line, as each is known (the load search takes a few runs)."""
        if summary.recommended is not None or self.plan.objective_mode != "latency":
            return
        plan, engine = self.plan, self.engine
        simulated = engine.profile is not None
        explainer = engine if simulated else stand_in(self.store, self.study)
        profile = explainer.profile if explainer is not None else None
        if explainer is None or profile is None:
            say(
                "whether any setting could meet these SLOs on this server: calibrate the "
                "simulator to it (tune calibrate) and give the profile with `profile`"
            )
            return
        words = profile_words(profile)
        by = "" if simulated else f", by the simulator with profile {words}"
        floors = latency_floor(
            plan.trace, profile, plan.slos, max_concurrency=plan.shaping.max_concurrency
        )
        unreachable = [floor for floor in floors if floor.unreachable]
        if unreachable:
            where = "on one engine" if simulated else "on this server"
            say(f"no scheduler setting can meet these SLOs {where}{by}:")
            for floor in unreachable:
                say(f"  {floor.line()}")
        closest = summary.closest_measured
        if closest is None:
            return
        runs = "the simulator"
        if not simulated:
            runs = "that simulator" if unreachable else f"the simulator with profile {words}"
        say(
            f"searching the highest request rate trial {closest.trial_number}'s settings "
            f"meet the SLOs at (a few runs of the trace on {runs})..."
        )
        headroom = rate_headroom(
            explainer,
            plan.trace,
            closest.settings,
            plan.slos,
            trial_number=closest.trial_number,
            error_budget=plan.error_budget,
            tolerance=plan.capacity_tolerance,
            max_concurrency=plan.shaping.max_concurrency,
        )
        say(headroom.line())

    def baseline_finding(self, summary: StudySummary) -> str | None:
        """The baseline's top finding (:mod:`prefill_tuner.diagnosis`), in one line."""
        if summary.baseline is None:
            return None
        findings, _ = trial_findings(summary.study, summary.baseline)
        return findings[0].line() if findings else None

    def write_report(self, path: Path) -> ReportFiles:
        """The study's HTML report at ``path``, its timeline's PNG beside it (each whole or not
        at all)."""
        return write_report(self.store, self.plan.name, path)


def checked_summary(
    plan: StudyPlan,
    engine: TrialEngine,
    store: TunerStore,
    study: optuna.Study,
    summary: StudySummary,
    say: Say = lambda text: None,
) -> StudySummary:
    """Check the best settings' load headroom and neighbours
    (:mod:`prefill_tuner.study.headroom`), keep the checks with the study, and return the
    summary with the recommendation they lead to. Nothing to do for a capacity study (its
    objective is the load it carries), when nothing met the SLOs, with ``headroom_check``
    off, or when the stored checks are of the study as it is."""
    if plan.headroom_check == "off" or plan.objective_mode != "latency" or not summary.pareto:
        return summary
    stored = summary.headroom
    if stored is not None and stored.margin == plan.headroom:
        return summary
    checker, where = headroom_engine(plan, engine, store, study)
    if checker is None:
        say(
            "headroom not checked: a real server's checks run on its simulated stand-in; "
            "calibrate the simulator to it (tune calibrate) and give the profile with "
            "`profile`, or check on the server itself with `headroom_check` engine"
        )
        return summary
    limits = {slo.name: slo.limit_s for slo in plan.slos}
    reference = references(summary.objectives, summary.pareto, summary.baseline, limits)
    key = rule_key(summary.objectives, summary.directions, reference, tuple(limits))
    report = check_headroom(
        plan, checker, summary.pareto, key, checked_on=where, finished=summary.finished, say=say
    )
    store.record_headroom(summary.study, report.as_dict() if report else None)
    if report is None:
        return summary
    # The summary as summarize_stored would now draw it, without opening the study again.
    chosen = next(t for t in summary.pareto if t.trial_number == report.recommended)
    return dataclasses.replace(summary, headroom=report, recommended=chosen)


def headroom_engine(
    plan: StudyPlan, engine: TrialEngine, store: TunerStore, study: optuna.Study
) -> tuple[TrialEngine | None, str]:
    """Where the headroom checks run, and how outputs name it: the simulator itself, a real
    server's stand-in, or with ``headroom_check`` engine the study's own engine."""
    if plan.headroom_check == "engine" or engine.profile is not None:
        profile = engine.profile
        return engine, f"the simulator, profile {profile.name}" if profile else engine.name
    explainer = stand_in(store, study)
    if explainer is None or explainer.profile is None:
        return None, ""
    words = profile_words(explainer.profile)
    return explainer, f"the simulator standing in for the server, {words}"


def profile_words(profile: StepModel) -> str:
    """A profile's name and how far to trust it: estimated, or calibrated and how close."""
    provenance = profile.provenance
    error = (provenance.held_out_error or {}).get("median")
    trust = provenance.kind + (f", held-out step-time error {error:.0%}" if error else "")
    return f"{profile.name} ({trust})"


def tune_study(
    plan: StudyPlan,
    engine: TrialEngine,
    store: TunerStore,
    *,
    report: Path | None = None,
    progress: StudyProgress | None = None,
    say: Say = lambda text: None,
    given_profile: StepModel | None = None,
) -> StudySummary:
    """``tune run`` as one call: run the study (resuming it), then say why nothing met the
    SLOs if nothing did and write the report to ``report`` if given. A stop
    (``KeyboardInterrupt``) is raised again once every finished trial is kept."""
    with TuningSession(plan, engine, store, given_profile=given_profile) as session:
        if session.run(progress, say):
            raise KeyboardInterrupt
        summary = session.summary(say)
        session.why_infeasible(summary, say)
        session.caveats(summary, say)
        if report is not None and summary.finished:
            session.write_report(report)
    return summary
