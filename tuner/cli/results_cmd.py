"""``tune pareto`` and ``tune export``: a stored study's results, again or for deployment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from prefill_tuner import defaults, exit_codes
from prefill_tuner.cli.display import error_console, output_console, print_document
from prefill_tuner.cli.options import STDOUT, JsonOpt, StorageOpt, StudyOpt
from prefill_tuner.cli.stored import open_stored
from prefill_tuner.cli.tables import AllOpt, ExplainOpt, render_next, render_summary
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_text
from prefill_tuner.output.documents import export_document, stored_summary_document
from prefill_tuner.study.saturation import stored_saturation
from prefill_tuner.study.summary import export, require_finished, summarize_stored

EXPORT_FORMATS = ("shell", "yaml", "json")


def pareto_command(
    study_name: StudyOpt = None,
    storage: StorageOpt = defaults.STORAGE,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
    every: AllOpt = False,
) -> None:
    """Print a stored study's recommendation, Pareto-optimal settings and serve lines again."""
    store, name = open_stored(study_name, storage)
    summary = require_finished(summarize_stored(store, name))
    if as_json:
        print_document(stored_summary_document(store, name))
    else:
        warnings = [found.line() for found in stored_saturation(store, summary)]
        shown = render_summary(summary, explain=explain, every=every, warnings=warnings)
        output_console().print(shown, crop=False)
        output_console().print(render_next(summary, storage, report=True), crop=False)
    if summary.recommended is None:
        raise typer.Exit(exit_codes.NOTHING_MEETS_SLOS)


def export_command(
    format: Annotated[str, typer.Option("--format", help="shell, yaml or json.")] = "shell",
    study_name: StudyOpt = None,
    storage: StorageOpt = defaults.STORAGE,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of stdout ('-': stdout)."),
    ] = None,
) -> None:
    """Export a study's recommended settings (and Pareto alternatives) for deployment."""
    if format not in EXPORT_FORMATS:
        raise TunerError(f"--format: expected shell, yaml or json, got {format!r}")
    if output == STDOUT:
        output = None
    store, name = open_stored(study_name, storage, output)
    summary = require_finished(summarize_stored(store, name))
    if summary.recommended is None:
        raise TunerError(
            f"study {name}: no trial met the SLOs, nothing to export "
            "(tune pareto shows the closest trials)"
        )
    if format == "json":
        text = export_document(summary).model_dump_json(indent=2) + "\n"
    else:
        text = export(summary, summary.study.model, format)
    if output is None:
        sys.stdout.write(text)
        return
    with atomic_text(output) as stream:
        stream.write(text)
    error_console().print(f"wrote {output}", soft_wrap=True, markup=False)
