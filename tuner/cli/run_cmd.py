"""``tune run``: tune the scheduler settings for a trace and SLOs."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

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
from prefill_tuner.cli.fields import with_flags
from prefill_tuner.cli.options import (
    ENGINE,
    SPACE,
    STUDY,
    TRACE,
    JsonOpt,
    NoReportOpt,
    SampledTraceOpt,
    TraceChoice,
    with_options,
)
from prefill_tuner.cli.tables import AllOpt, ExplainOpt, render_next, render_summary
from prefill_tuner.engines.factory import EngineOptions, build_engine, given_profile, serving
from prefill_tuner.files import check_output
from prefill_tuner.output.documents import stored_summary_document
from prefill_tuner.output.html import image_path
from prefill_tuner.stopping import stop_signals
from prefill_tuner.storage.store import TunerStore, inputs_of, redact_url
from prefill_tuner.study.plan import SpaceSpec, StudyPlan, build_plan
from prefill_tuner.study.run import baseline_outside
from prefill_tuner.study.saturation import stored_saturation
from prefill_tuner.study.session import TuningSession
from prefill_tuner.study.summary import StudySummary


@with_options(study=STUDY, engine=ENGINE, trace=TRACE, space=SPACE)
def run_command(
    trace_file: SampledTraceOpt = defaults.SAMPLE_TRACE,
    create_only: Annotated[
        bool,
        typer.Option(
            "--create-only",
            help="Record the study (trace, SLOs, space, --trials target) and run no trial: "
            "`tune worker` processes run them.",
        ),
    ] = False,
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
    explain: ExplainOpt = False,
    every: AllOpt = False,
    *,
    study: dict[str, Any],
    engine: EngineOptions,
    trace: TraceChoice,
    space: SpaceSpec,
) -> None:
    """Tune the scheduler settings for a trace and SLOs; print the Pareto-optimal settings.
    Exit code 0: settings meet the SLOs; 4: no trial met them; 2: bad input; 130:
    interrupted (the same command resumes)."""
    err = error_console()
    engine = serving(engine, study["model"])
    storage = study["storage_url"]
    with closing(build_engine(engine, space.fixed)) as trial_engine:
        plan = build_plan(
            trial_engine, trace.at(trace_file), space, **{**study, "model": engine.model}
        )
        unwanted = no_report or create_only
        report_path = _report_path(report, plan, [trace_file, *inputs_of(storage)], unwanted)
        store = TunerStore(storage)  # a damaged storage fails before the first trial
        quiet_optuna()
        session = TuningSession(
            plan,
            trial_engine,
            store,
            sorted_trace=trace.sort,
            given_profile=given_profile(engine, space.fixed),
        )
        with session:  # a mismatched resume, or one another process runs, fails here
            where = _trace_words(trace_file, err)
            outside = baseline_outside(plan, trial_engine)
            print_study_header(err, plan, where, trial_engine, outside)
            if create_only:
                return _say_how_to_run(plan, storage, err)
            # A line per trial when trials take minutes (a real engine); the bar otherwise.
            verbose = trial_engine.starts_servers
            with stop_signals(err), ProgressDisplay(err, plan, verbose=verbose) as display:
                interrupted = session.run(display.progress, _sayer(err))
            if interrupted:
                err.print(INTERRUPTED_WORDS)
            summary = session.summary(None if interrupted else _sayer(err))
            _print_summary(store, summary, plan, as_json=as_json, explain=explain, every=every)
            if interrupted:
                raise typer.Exit(exit_codes.INTERRUPTED)
            _explain(session, summary, storage, report_path, err)
            if not as_json:
                next_steps = render_next(summary, storage, report=report_path is None)
                output_console().print(next_steps, crop=False)
    if summary.recommended is None or not summary.margin_met:
        raise typer.Exit(exit_codes.NOTHING_MEETS_SLOS)


INTERRUPTED_WORDS = "interrupted: every finished trial is kept; run the same command to resume"
SAMPLE_WORDS = (
    f"tuning on the bundled sample ({defaults.SAMPLE_DESCRIPTION}); give --trace FILE to "
    "tune on your own traffic"
)


def _print_summary(
    store: TunerStore,
    summary: StudySummary,
    plan: StudyPlan,
    *,
    as_json: bool,
    explain: bool,
    every: bool,
) -> None:
    """The study's results on stdout: its JSON document, or the answer first (with a
    saturation warning where an un-SLO'd latency shows one)."""
    if as_json:
        print_document(stored_summary_document(store, plan.name))
        return
    warnings = [found.line() for found in stored_saturation(store, summary, plan.trace)]
    shown = render_summary(summary, explain=explain, every=every, warnings=warnings)
    output_console().print(shown, crop=False)


def _trace_words(trace_file: Path, err: Console) -> str:
    """How the header names the trace; the bundled sample is said to be one."""
    if trace_file != defaults.SAMPLE_TRACE:
        return str(trace_file)
    err.print(f"no --trace given: {SAMPLE_WORDS}", soft_wrap=True)
    return "the bundled sample"


def _report_path(
    report: Path | None, plan: StudyPlan, inputs: list[Path | str], unwanted: bool
) -> Path | None:
    """Where the report goes (``None``: ``unwanted``), checked before any trial with the
    timeline's PNG beside it: one that cannot be written, or would replace an input, is
    refused."""
    if unwanted:
        return None
    path = report or defaults.report_path(plan.name)
    check_output(path, inputs)
    check_output(image_path(path), inputs)
    return path


def _sayer(err: Console) -> Callable[[str], None]:
    return lambda text: err.print(escape(with_flags(text)), soft_wrap=True)


def _explain(
    session: TuningSession,
    summary: StudySummary,
    storage: str,
    report_path: Path | None,
    err: Console,
) -> None:
    """After the study: why nothing met the SLOs (if nothing did), the baseline's top finding
    with the command that shows them all, and the report. A stop now leaves no half-written
    report behind."""
    try:
        with stop_signals(err):
            session.why_infeasible(summary, _sayer(err))
            session.caveats(summary, _sayer(err))
            finding = session.baseline_finding(summary)
            if finding is not None:
                diagnose = ["tune", "diagnose", "--study", summary.study.name]
                if storage != defaults.STORAGE and redact_url(storage) == storage:
                    diagnose += ["--storage", storage]  # no password in it to show
                command = shlex.join(diagnose)
                err.print(escape(f"baseline: {finding} (all findings: {command})"), soft_wrap=True)
            if report_path is not None and summary.finished:
                err.print(
                    f"report: {session.write_report(report_path).words()}",
                    soft_wrap=True,
                    markup=False,
                )
    except KeyboardInterrupt:
        err.print(
            "interrupted after the study: every trial is kept; tune report writes the report",
            soft_wrap=True,
        )
        raise typer.Exit(exit_codes.INTERRUPTED) from None


def _say_how_to_run(plan: StudyPlan, storage: str, err: Console) -> None:
    """A ``--create-only`` study: the worker command that runs its trials."""
    worker = ["tune", "worker", "--study", plan.name]
    hidden = redact_url(storage) != storage
    if not hidden:
        worker += ["--storage", storage]
    err.print(
        escape(f"study {plan.name} recorded with a target of {plan.trials} trials; run them with"),
        soft_wrap=True,
    )
    if plan.screen_trials:
        err.print(
            f"the first worker after the baseline screens {plan.screen_trials} settings on the "
            "simulator; every worker then confirms its candidates first",
            soft_wrap=True,
        )
    output_console().print(escape(shlex.join(worker)), soft_wrap=True)
    if hidden:
        err.print(
            "with TUNE_STORAGE set to the database URL (its password is not printed)",
            soft_wrap=True,
        )
