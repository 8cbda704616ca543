"""The ``tune`` command's entry point. It handles stop signals for the whole process
(:mod:`prefill_tuner.stopping`), from before the second of imports that loads the command line
to the process's exit, so that a stop at any moment ends as one during a trial does (one line,
exit code 130) rather than in a traceback or by the signal (exit 143)."""

from __future__ import annotations

import sys


def main() -> None:
    """Load the command line, then run it."""
    from prefill_tuner.stopping import ignore_from_now, install_for_process

    install_for_process()  # SIGTERM too: a stop while it loads is an interrupt
    try:
        from prefill_tuner.cli import main as run
    except KeyboardInterrupt:
        from prefill_tuner.exit_codes import INTERRUPTED

        ignore_from_now()
        print("error: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    try:
        run()
    finally:
        ignore_from_now()
