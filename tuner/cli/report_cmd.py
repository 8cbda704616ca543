"""``tune report``: a stored study's HTML report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from prefill_tuner import defaults, exit_codes
from prefill_tuner.cli.display import error_console
from prefill_tuner.cli.options import STDOUT, MovedTraceOpt, StorageOpt, StudyOpt
from prefill_tuner.cli.stored import open_stored
from prefill_tuner.output.html import render_report, write_report
from prefill_tuner.stopping import stop_signals


def report_command(
    study_name: StudyOpt = None,
    storage: StorageOpt = defaults.STORAGE,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Where to write it ('-': the page on standard output, without its PNG).",
            show_default="STUDY-report.html",
        ),
    ] = None,
    trace: MovedTraceOpt = None,
) -> None:
    """Write a study's report: one HTML file that works offline, with the plots that explain
    its recommendation."""
    to_stdout = output == STDOUT
    store, name = open_stored(study_name, storage, None if to_stdout else output, trace)
    err = error_console()
    if to_stdout:
        sys.stdout.write(render_report(store, name).page)
        return
    try:
        with stop_signals(err):  # SIGTERM too: a half-written file is removed
            path = write_report(store, name, output or defaults.report_path(name))
    except KeyboardInterrupt:
        err.print("interrupted: no report written", markup=False)
        raise typer.Exit(exit_codes.INTERRUPTED) from None
    err.print(f"report: {path.words()}", soft_wrap=True, markup=False)
