"""``tune run``: tune the scheduler settings for a trace and SLOs."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from prefill_tuner import defaults, exit_codes
from prefill_tuner.cli.display import (
    ProgressDisplay,
    error_console,
    output_console,
    print_document,
    print_study_header,
    quiet_optuna,
)
from prefill_tuner.cli.options import (
    ENGINE,
    SPACE,
    TRACE,
    ErrorBudgetOpt,
    JsonOpt,
    ModelOpt,
    NoReportOpt,
    SampledTraceOpt,
    ScreenOpt,
    SeedOpt,
    SloOpt,
    StorageOpt,
    StudyOpt,
    TraceChoice,
    TrialsOpt,
    with_options,
)
from prefill_tuner.diagnosis.sources import trial_findings
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.factory import EngineOptions, build_engine
from prefill_tuner.engines.sim.cost_model import StepModel, load_profile
from prefill_tuner.files import check_output
from prefill_tuner.output.documents import stored_summary_document
from prefill_tuner.output.html import write_report
from prefill_tuner.stopping import stop_signals
from prefill_tuner.storage.store import TunerStore, inputs_of, redact_url
from prefill_tuner.study.infeasibility import latency_floor, rate_headroom
from prefill_tuner.study.plan import SpaceSpec, StudyPlan, build_plan
from prefill_tuner.study.run import baseline_outside, open_study, run_study, running
from prefill_tuner.study.screening import give_profile, run_screened_study, stand_in
from prefill_tuner.study.summary import StudySummary, render_summary, summarize_stored
from prefill_tuner.worker.definition import definition_of


@with_options(engine=ENGINE, trace=TRACE, space=SPACE)
def run_command(
    slo: SloOpt,
    trace_file: SampledTraceOpt = defaults.SAMPLE_TRACE,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="latency: minimise the SLO'd percentiles; capacity: maximise the "
            "trace rate multiplier at which all SLOs hold.",
        ),
    ] = defaults.OBJECTIVE,
    trials: TrialsOpt = defaults.TRIALS,
    create_only: Annotated[
        bool,
        typer.Option(
            "--create-only",
            help="Record the study (trace, SLOs, space, --trials target) and run no trial: "
            "`tune worker` processes run them.",
        ),
    ] = False,
    model: ModelOpt = defaults.MODEL,
    study_name: StudyOpt = None,
    storage: StorageOpt = defaults.STORAGE,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0, help="Stop starting trials after this many seconds."),
    ] = None,
    seed: SeedOpt = 0,
    sampler: Annotated[
        str, typer.Option("--sampler", help="tpe (multivariate TPE) or random.")
    ] = defaults.SAMPLER,
    rule_trials: Annotated[
        bool,
        typer.Option(
            "--rule-trials/--no-rule-trials",
            help="Latency studies: after the defaults, run a few settings derived from the "
            "trace's decode batch at the TPOT limit (a small token budget, the same with a "
            "per-prompt prefill cap, one with room for prefills) before the sampler's.",
        ),
    ] = defaults.RULE_TRIALS,
    error_budget: ErrorBudgetOpt = 0.0,
    capacity_tolerance: Annotated[
        float,
        typer.Option(
            "--capacity-tolerance", min=0.001, help="Capacity bisection precision (relative)."
        ),
    ] = defaults.CAPACITY_TOLERANCE,
    early_abort: Annotated[
        bool,
        typer.Option(
            "--early-abort/--no-early-abort",
            help="Stop a real engine's replay once its SLOs are certainly missed (the trial "
            "is judged on lower bounds of what it would have measured).",
        ),
    ] = True,
    screen: ScreenOpt = 0,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Where to write the HTML report at the end.",
            show_default="STUDY-report.html",
        ),
    ] = None,
    no_report: NoReportOpt = False,
    as_json: JsonOpt = False,
    *,
    engine: EngineOptions,
    trace: TraceChoice,
    space: SpaceSpec,
) -> None:
    """Tune the scheduler settings for a trace and SLOs; print the Pareto-optimal settings.
    Exit code 0: settings meet the SLOs; 4: no trial met them; 2: bad input; 130:
    interrupted (the same command resumes)."""
    err = error_console()
    bundled = trace_file == defaults.SAMPLE_TRACE
    given_profile = load_profile(engine.profile) if engine.profile != defaults.PROFILE else None
    with ExitStack() as held:
        trial_engine = held.enter_context(
            closing(build_engine(dataclasses.replace(engine, model=model)))
        )
        plan = build_plan(
            trial_engine,
            trace.at(trace_file),
            space,
            slos=slo,
            name=study_name,
            objective_mode=objective,
            sampler=sampler,
            storage_url=storage,
            model=model,
            trials=trials,
            error_budget=error_budget,
            timeout_s=timeout,
            seed=seed,
            capacity_tolerance=capacity_tolerance,
            early_abort=early_abort,
            screen_trials=screen,
            rule_trials=rule_trials,
        )
        report_path = (
            None if no_report or create_only else report or defaults.report_path(plan.name)
        )
        if report_path is not None:
            # Before any trial: a report that cannot be written, or would replace an input.
            check_output(report_path, [trace_file, *inputs_of(storage)])
        store = TunerStore(storage)  # a damaged storage fails before the first trial
        quiet_optuna()
        opened = open_study(plan, store, trial_engine)  # a mismatched resume fails before any work
        held.enter_context(running(opened[0], store, opened[1]))  # nor one another process runs
        store.record_definition(opened[1], trials, definition_of(plan, sort=trace.sort))
        if given_profile is not None and trial_engine.starts_servers:
            give_profile(opened[0], given_profile)  # screening's, and the explanation's below
        if bundled:
            err.print(
                f"no --trace given: tuning on the bundled sample ({defaults.SAMPLE_DESCRIPTION}"
                "); give --trace FILE to tune on your own traffic",
                soft_wrap=True,
            )
        print_study_header(
            err,
            plan,
            "the bundled sample" if bundled else str(trace_file),
            trial_engine,
            baseline_outside(plan, trial_engine),
        )
        if create_only:
            worker = ["tune", "worker", "--study", plan.name]
            hidden = redact_url(storage) != storage
            if not hidden:
                worker += ["--storage", storage]
            err.print(
                escape(
                    f"study {plan.name} recorded with a target of {trials} trials; run them with"
                ),
                soft_wrap=True,
            )
            if screen:
                err.print(
                    f"the first worker after the baseline screens {screen} settings on the "
                    "simulator; every worker then confirms its candidates first",
                    soft_wrap=True,
                )
            output_console().print(escape(shlex.join(worker)), soft_wrap=True)
            if hidden:
                err.print(
                    "with TUNE_STORAGE set to the database URL (its password is not printed)",
                    soft_wrap=True,
                )
            return
        interrupted = False
        # A line per trial when trials take minutes (a real engine); the bar alone otherwise.
        with (
            stop_signals(err),
            ProgressDisplay(err, plan, verbose=trial_engine.starts_servers) as display,
        ):
            try:
                if screen:
                    run_screened_study(
                        plan,
                        trial_engine,
                        store,
                        opened,
                        progress=display.progress,
                        say=lambda text: err.print(escape(text), soft_wrap=True),
                    )
                else:
                    run_study(plan, trial_engine, store, display.progress, opened)
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            err.print("interrupted: every finished trial is kept; run the same command to resume")
        summary = summarize_stored(store, plan.name)
        if as_json:
            print_document(stored_summary_document(store, plan.name))
        else:
            output_console().print(render_summary(summary), crop=False)
        if not interrupted:
            try:
                with stop_signals(err):  # a stop now leaves no half-written report behind
                    _why_infeasible(
                        plan, trial_engine, summary, err, lambda: stand_in(store, opened[0])
                    )
                    _explain(summary, plan.name, storage, err)
                    if report_path is not None and summary.finished:
                        path = write_report(store, plan.name, report_path)
                        err.print(f"report: {path}", markup=False)
            except KeyboardInterrupt:
                err.print(
                    "interrupted after the study: every trial is kept; tune report writes the "
                    "report",
                    soft_wrap=True,
                )
                raise typer.Exit(exit_codes.INTERRUPTED) from None
        if interrupted:
            raise typer.Exit(exit_codes.INTERRUPTED)
        if summary.recommended is None:
            raise typer.Exit(exit_codes.NOTHING_MEETS_SLOS)


def _why_infeasible(
    plan: StudyPlan,
    engine: TrialEngine,
    summary: StudySummary,
    err: Console,
    real_stand_in: Callable[[], TrialEngine | None],
) -> None:
    """When nothing met the SLOs: whether any setting could at this load, and up to what load
    the closest trial's settings do, on the simulator (for a real server, its stand-in: the
    simulator with the study's profile on the server's config)."""
    if summary.recommended is not None or plan.objective_mode != "latency":
        return
    simulated = engine.profile is not None
    explainer = engine if simulated else real_stand_in()
    profile = explainer.profile if explainer is not None else None
    if explainer is None or profile is None:
        err.print(
            "whether any setting could meet these SLOs on this server: calibrate the "
            "simulator to it (tune calibrate) and give the profile with --profile",
            soft_wrap=True,
        )
        return
    words = _profile_words(profile)
    by = "" if simulated else f", by the simulator with profile {words}"
    floors = latency_floor(plan.trace, profile, plan.slos)
    unreachable = [floor for floor in floors if floor.unreachable]
    if unreachable:
        where = "on one engine" if simulated else "on this server"
        err.print(escape(f"no scheduler setting can meet these SLOs {where}{by}:"), soft_wrap=True)
        for floor in unreachable:
            err.print(escape(f"  {floor.line()}"), soft_wrap=True)
    closest = summary.closest_measured
    if closest is not None:
        runs = "the simulator"
        if not simulated:
            runs = "that simulator" if unreachable else f"the simulator with profile {words}"
        err.print(
            escape(
                f"searching the highest request rate trial {closest.trial_number}'s settings "
                f"meet the SLOs at (a few runs of the trace on {runs})..."
            ),
            soft_wrap=True,
        )
        headroom = rate_headroom(
            explainer,
            plan.trace,
            closest.settings,
            plan.slos,
            trial_number=closest.trial_number,
            error_budget=plan.error_budget,
            tolerance=plan.capacity_tolerance,
        )
        err.print(escape(headroom.line()), soft_wrap=True)


def _profile_words(profile: StepModel) -> str:
    """A profile's name and how far to trust it: estimated, or calibrated and how close."""
    provenance = profile.provenance
    error = (provenance.held_out_error or {}).get("median")
    trust = provenance.kind + (f", held-out step-time error {error:.0%}" if error else "")
    return f"{profile.name} ({trust})"


def _explain(summary: StudySummary, study: str, storage: str, err: Console) -> None:
    """The baseline's top finding, in one line, with the command that shows them all."""
    if summary.baseline is None:
        return
    findings, _ = trial_findings(summary.study, summary.baseline)
    if not findings:
        return
    diagnose = ["tune", "diagnose", "--study", study]
    if storage != defaults.STORAGE and redact_url(storage) == storage:
        diagnose += ["--storage", storage]  # no password in it to show
    command = shlex.join(diagnose)
    err.print(escape(f"baseline: {findings[0].line()} (all findings: {command})"), soft_wrap=True)
