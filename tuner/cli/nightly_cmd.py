"""``tune nightly``: one night of retuning, with an exit code a pipeline can act on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from prefill_tuner import exit_codes
from prefill_tuner.cli.declared_options import group
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
    NoReportOpt,
    TraceChoice,
    study_options,
    with_options,
)
from prefill_tuner.engines.factory import EngineOptions, build_engine, given_profile, serving
from prefill_tuner.nightly.job import NightlyJob
from prefill_tuner.nightly.retune import NightlyOutcome, retune
from prefill_tuner.stopping import stop_signals
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.plan import SpaceSpec, build_plan
from prefill_tuner.study.run import baseline_outside

NIGHT = dataclasses.replace(
    group(
        NightlyJob,
        ("family", "deadline_s", "repeats", "min_gain", "report_dir", "verify"),
        panel="Night",
        build=lambda **values: values,
    ),
    leading=True,
)
"""The night's own options (:class:`NightlyJob`'s fields)."""
STUDY_OF_THE_NIGHT = study_options(
    "slos",
    "storage_url",
    "trials",
    "model",
    "seed",
    "error_budget",
    "screen_trials",
    "judge_windows",
    "headroom",
    trials={"help": "Trials of tonight's search."},
)


@with_options(night=NIGHT, study=STUDY_OF_THE_NIGHT, engine=ENGINE, trace=TRACE, space=SPACE)
def nightly_command(
    trace_file: Annotated[Path, typer.Option("--trace", help="Tonight's trace file.")],
    no_report: NoReportOpt = False,
    *,
    night: dict[str, Any],
    study: dict[str, Any],
    engine: EngineOptions,
    trace: TraceChoice,
    space: SpaceSpec,
) -> None:
    """Retune on tonight's trace and promote a new configuration only when it beats the
    incumbent beyond noise. Exit code 0: kept; 3: promoted (new serve lines); 4: nothing
    meets the SLOs; 2: bad input; 130: interrupted."""
    err = error_console()
    engine = serving(engine, study["model"])
    storage, family = study["storage_url"], night["family"]
    with closing(build_engine(engine, space.fixed)) as trial_engine:
        plan = build_plan(
            trial_engine,
            trace.at(trace_file),
            space,
            **{**study, "model": engine.model, "name": family},
        )
        job = NightlyJob(
            plan=plan,
            screen_profile=given_profile(engine, space.fixed) if study["screen_trials"] else None,
            html_report=not no_report,
            **night,
        )
        store = TunerStore(storage)  # a damaged storage fails before the first trial
        outside = baseline_outside(plan, trial_engine)
        print_study_header(err, plan, str(trace_file), trial_engine, outside)
        quiet_optuna()
        say = _sayer(err, family)
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
