"""The ``tune`` command line. Bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import NoReturn

import optuna
import typer
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from prefill_tuner import exit_codes
from prefill_tuner.cli.calibrate_cmd import calibrate_command
from prefill_tuner.cli.diagnose_cmd import diagnose_command
from prefill_tuner.cli.fields import with_flags
from prefill_tuner.cli.listing_cmd import studies_command, trials_command
from prefill_tuner.cli.nightly_cmd import nightly_command
from prefill_tuner.cli.options import finite_floats
from prefill_tuner.cli.plan_cmd import plan_command
from prefill_tuner.cli.profile_cmd import profile_command
from prefill_tuner.cli.report_cmd import report_command
from prefill_tuner.cli.results_cmd import export_command, pareto_command
from prefill_tuner.cli.run_cmd import run_command
from prefill_tuner.cli.simulate_cmd import simulate_command
from prefill_tuner.cli.tiny_model_cmd import tiny_model_command
from prefill_tuner.cli.trace_cmd import trace_app
from prefill_tuner.cli.verify_cmd import verify_command
from prefill_tuner.cli.worker_cmd import worker_command
from prefill_tuner.errors import TunerError
from prefill_tuner.files import WRITE_FAILURES, command_inputs
from prefill_tuner.redaction import redact_text
from prefill_tuner.storage.batched import close_databases
from prefill_tuner.storage.store import mask_password, storage_error
from prefill_tuner.version import __version__

app = typer.Typer(
    name="tune",
    help="Find vLLM chunked-prefill settings that meet your SLOs on your own traffic.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    # Click's plain help: readable at 80 columns (rich's panels squeeze each option's help
    # into a narrow third column beside the long --flag/--no-flag names).
    rich_markup_mode=None,
)
app.add_typer(trace_app, name="trace")
app.command("run")(run_command)
app.command("plan")(plan_command)
app.command("pareto")(pareto_command)
app.command("export")(export_command)
app.command("report")(report_command)
app.command("studies")(studies_command)
app.command("trials")(trials_command)
app.command("worker")(worker_command)
app.command("nightly")(nightly_command)
app.command("simulate")(simulate_command)
app.command("calibrate")(calibrate_command)
app.command("diagnose")(diagnose_command)
app.command("verify")(verify_command)
app.command("profile")(profile_command)
app.command("tiny-model")(tiny_model_command)
for _command in (*app.registered_commands, *trace_app.registered_commands):
    if _command.callback is not None:
        _command.callback = finite_floats(_command.callback)


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
    """Console entry point: run the app, turning user errors (ours and the parser's) into one
    line and exit code 2, and a failing disk, pipe or database into one line and exit code 1.
    A stop signal ends it with exit code 130 (the console script, :mod:`prefill_tuner.entry`,
    handles stop signals for the whole process: :mod:`prefill_tuner.stopping`)."""
    try:
        try:
            with command_inputs():  # what it reads, no output of it may replace
                code = app(standalone_mode=False, prog_name="tune")  # errors: in one line
        finally:
            close_databases()  # the study is one file again: its WAL checkpointed and removed
            if sys.stdout is not None:
                sys.stdout.flush()  # a full disk or a closed pipe shows here, not at exit
    except SystemExit as exit_:
        if exit_.code == exit_codes.FAILURE and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            # click's own answer to EPIPE: quiet stdout, exit 1 (say why, in one line)
            _fail("standard output was closed before everything was written", exit_codes.FAILURE)
        raise
    except TunerError as exc:
        # Fields named as flags; a quoted command line's secrets hidden.
        _fail(redact_text(with_flags(str(exc))), exc.exit_code)
    except KeyboardInterrupt:  # outside a study's own handling (e.g. reading a large trace)
        _fail("interrupted", exit_codes.INTERRUPTED)
    except BrokenPipeError:
        _fail("standard output was closed before everything was written", exit_codes.FAILURE, True)
    except OSError as exc:
        if exc.errno not in WRITE_FAILURES:
            raise
        _fail(f"cannot write to standard output: {exc.strerror}", exit_codes.FAILURE, True)
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
        _fail(f"the storage failed: {_storage_failure(exc)}", exit_codes.FAILURE)
    except Exception as exc:
        if not _is_click(exc, "ClickException", "Abort"):
            raise
        _parser_error(exc)
    if isinstance(code, int) and code:
        sys.exit(code)


def _is_click(exc: BaseException, *names: str) -> bool:
    """Whether ``exc`` is one of click's exceptions (by name: typer vendors click in newer
    versions, and typer itself tells them apart so)."""
    return any(kind.__name__ in names for kind in type(exc).__mro__)


def _parser_error(exc: Exception) -> NoReturn:
    """A usage error of the argument parser (a missing argument, a value out of range) in one
    line naming the command and its ``--help``; no arguments at all: the help.

    ``exc`` is one of click's exceptions, told apart by name (``_is_click``): typer may vendor
    click, so its classes cannot be imported to narrow the type, hence the three ignores."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        help_text = exc.format_message()  # type: ignore[attr-defined]
        if help_text.strip():  # typer's rich help is printed when it is built
            print(help_text, file=sys.stderr)
        sys.exit(exit_codes.BAD_INPUT)
    if _is_click(exc, "Abort"):
        _fail("aborted", exit_codes.FAILURE)
    not_finite = _not_finite(exc)
    param = getattr(exc, "param", None)
    if not_finite and param is not None and getattr(param, "opts", None):
        # As the command's own checks say it (an option with bounds is checked by the parser)
        message = f"{param.opts[0]}: {not_finite}"
    else:
        if not_finite:
            exc.message = not_finite  # type: ignore[attr-defined]
        message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
    context = getattr(exc, "ctx", None)
    if context is not None:
        message += f" (see {context.command_path} --help)"
    _fail(message, int(getattr(exc, "exit_code", exit_codes.FAILURE)))


def _not_finite(exc: Exception) -> str | None:
    """What a number option's value is when it is ``nan`` or an infinity: typer checks the
    option's range first, and ``nan`` fails every comparison ('should be ≥ 0', about a value
    that is no number at all)."""
    cause = exc.__cause__
    errors = cause.errors() if isinstance(cause, ValidationError) else []
    given = errors[0].get("input") if errors else None
    if not isinstance(given, (int, float, str)):
        return None
    try:
        value = float(given)
    except (TypeError, ValueError):
        return None
    if math.isfinite(value):
        return None
    return f"{value} is {'not a number' if math.isnan(value) else 'not a finite number'}"


def _fail(message: str, code: int, stdout_failed: bool = False) -> NoReturn:
    """One line on stderr, then exit. A failed stdout (a closed pipe, a full disk) is pointed
    at /dev/null first, so that Python's exit does not fail again flushing what is left."""
    if stdout_failed:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    with contextlib.suppress(OSError):
        print(f"error: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


def _one_line(message: str) -> str:
    """The message on one line: a value the user gave may hold a newline or a control
    character, shown escaped as Python writes it."""
    return "".join(
        char if char.isprintable() or char == " " else repr(char)[1:-1] for char in message
    )


def _storage_failure(exc: BaseException) -> str:
    """The database's own words, every storage URL given masked."""
    given = [os.environ.get("TUNE_STORAGE", "")]
    given += [arg.split("=", 1)[-1] for arg in sys.argv if "://" in arg]
    text = storage_error(exc, "")
    for url in filter(None, given):
        text = mask_password(text, url)
    return text
