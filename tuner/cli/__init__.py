"""The ``tune`` command line. Bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import sys

import typer
from prefill_tuner import __version__
from prefill_tuner.cli.nightly_cmd import nightly_command
from prefill_tuner.cli.results_cmd import export_command, pareto_command
from prefill_tuner.cli.run_cmd import run_command
from prefill_tuner.cli.simulate_cmd import simulate_command
from prefill_tuner.cli.trace_cmd import trace_app
from prefill_tuner.cli.worker_cmd import worker_command
from prefill_tuner.errors import TunerError
from prefill_tuner.redaction import redact_text

app = typer.Typer(
    name="tune",
    help="Find vLLM chunked-prefill settings that meet your SLOs on your own traffic.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.add_typer(trace_app, name="trace")
app.command("run")(run_command)
app.command("pareto")(pareto_command)
app.command("export")(export_command)
app.command("worker")(worker_command)
app.command("nightly")(nightly_command)
app.command("simulate")(simulate_command)

EXIT_BAD_INPUT = 2
"""Exit code for bad input (a file, flag or value), as for command-line usage errors."""


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        help="Print the version and exit.",
        callback=_print_version,
        is_eager=True,
    ),
) -> None:
    """Find vLLM chunked-prefill settings that meet your SLOs on your own traffic."""


def main() -> None:
    """Console entry point: run the app, turning user errors into one line and exit code 2."""
    try:
        app()
    except TunerError as exc:  # may quote a command line: secrets hidden
        print(f"error: {redact_text(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
