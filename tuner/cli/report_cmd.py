"""``tune report``: a stored study's HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefill_tuner import defaults
from prefill_tuner.cli.display import error_console, quiet_optuna
from prefill_tuner.cli.options import StorageOpt, StudyOpt
from prefill_tuner.files import check_output
from prefill_tuner.html_report import write_report
from prefill_tuner.plan import check_study_name
from prefill_tuner.report import find_study
from prefill_tuner.storage.store import TunerStore


def report_command(
    study_name: StudyOpt = None,
    storage: StorageOpt = defaults.STORAGE,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write it.", show_default="STUDY-report.html"),
    ] = None,
) -> None:
    """Write a study's report: one HTML file that works offline, with the plots that explain
    its recommendation."""
    if study_name is not None:
        check_study_name(study_name)  # before the storage is opened (or created)
    if output is not None:
        check_output(output)
    quiet_optuna()
    store = TunerStore(storage, create=False)
    name = find_study(store, study_name)
    path = write_report(store, name, output or defaults.report_path(name))
    error_console().print(f"report: {path}", soft_wrap=True, markup=False)
