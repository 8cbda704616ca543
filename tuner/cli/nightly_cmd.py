"""``tune nightly``: one night of retuning, with an exit code a pipeline can act on."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from prefill_tuner import defaults, exit_codes
from prefill_tuner.cli.declared_options import option
from prefill_tuner.cli.display import (
    ProgressDisplay,
    error_console,
    print_study_header,
    quiet_optuna,
)
from prefill_tuner.cli.fields import with_flags
from prefill_tuner.cli.options import (
    ENGINE,
    SPACE,
    TRACE,
    ErrorBudgetOpt,
    HeadroomOpt,
    JudgeWindowOpt,
    ModelOpt,
    NoReportOpt,
    ScreenOpt,
    SeedOpt,
    SloOpt,
    StorageOpt,
    TraceChoice,
    with_options,
)
from prefill_tuner.engines.factory import EngineOptions, build_engine, given_profile, serving
from prefill_tuner.nightly.job import NightlyJob
from prefill_tuner.nightly.retune import NightlyOutcome, retune
from prefill_tuner.stopping import stop_signals
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.plan import SpaceSpec, StudyPlan, build_plan
from prefill_tuner.study.run import baseline_outside


@with_options(engine=ENGINE, trace=TRACE, space=SPACE)
def nightly_command(
    study: Annotated[str, option(NightlyJob, "family")],
    trace_file: Annotated[Path, typer.Option("--trace", help="Tonight's trace file.")],
    slo: SloOpt,
    storage: StorageOpt = defaults.STORAGE,
    trials: Annotated[
        int, option(StudyPlan, "trials", help="Trials of tonight's search.")
    ] = defaults.TRIALS,
    deadline: Annotated[float | None, option(NightlyJob, "deadline_s")] = None,
    repeats: Annotated[int, option(NightlyJob, "repeats")] = defaults.REPEATS,
    min_gain: Annotated[float, option(NightlyJob, "min_gain")] = defaults.MIN_GAIN,
    report_dir: Annotated[Path, option(NightlyJob, "report_dir")] = defaults.REPORT_DIR,
    model: ModelOpt = defaults.MODEL,
    seed: SeedOpt = 0,
    error_budget: ErrorBudgetOpt = 0.0,
    screen: ScreenOpt = 0,
    judge_window: JudgeWindowOpt = None,
    headroom: HeadroomOpt = None,
    no_report: NoReportOpt = False,
    verify: Annotated[bool, option(NightlyJob, "verify")] = False,
    *,
    engine: EngineOptions,
    trace: TraceChoice,
    space: SpaceSpec,
) -> None:
    """Retune on tonight's trace and promote a new configuration only when it beats the
    incumbent beyond noise. Exit code 0: kept; 3: promoted (new serve lines); 4: nothing
    meets the SLOs; 2: bad input; 130: interrupted."""
    err = error_console()
    engine = serving(engine, model)
    with closing(build_engine(engine, space.fixed)) as trial_engine:
        plan = build_plan(
            trial_engine,
            trace.at(trace_file),
            space,
            slos=slo,
            name=study,
            storage_url=storage,
            model=engine.model,
            trials=trials,
            error_budget=error_budget,
            seed=seed,
            screen_trials=screen,
            judge_windows=tuple(judge_window or ()),
            headroom=headroom,
        )
        job = NightlyJob(
            family=study,
            plan=plan,
            report_dir=report_dir,
            repeats=repeats,
            min_gain=min_gain,
            deadline_s=deadline,
            verify=verify,
            screen_profile=given_profile(engine, space.fixed) if screen else None,
            html_report=not no_report,
        )
        store = TunerStore(storage)  # a damaged storage fails before the first trial
        outside = baseline_outside(plan, trial_engine)
        print_study_header(err, plan, str(trace_file), trial_engine, outside)
        quiet_optuna()
        say = _sayer(err, study)
        try:
            verbose = trial_engine.starts_servers
            with stop_signals(err), ProgressDisplay(err, plan, verbose=verbose) as display:
                outcome = retune(job, trial_engine, store, display.progress, say)
        except KeyboardInterrupt:
            err.print(
                "interrupted: finished trials are kept; run the same command to resume tonight's "
                "generation"
            )
            raise typer.Exit(exit_codes.INTERRUPTED) from None
    _print_outcome(outcome)
    raise typer.Exit(outcome.exit_code)


def _sayer(err: Console, study: str) -> Callable[[str], None]:
    return lambda text: err.print(escape(with_flags(f"nightly {study}: {text}")), soft_wrap=True)


def _print_outcome(outcome: NightlyOutcome) -> None:
    out = Console(highlight=False, soft_wrap=True)
    action = f"{outcome.decision.action}: {outcome.decision.reason}"
    out.print(escape(f"generation {outcome.generation} ({outcome.study_name}): {action}"))
    if outcome.serve_command:
        out.print(escape(outcome.serve_command))
    for path in (outcome.report_path, outcome.page_path):
        if path is not None:
            out.print(escape(f"report: {path}"))
