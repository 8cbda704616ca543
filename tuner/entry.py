"""The ``tune`` command's entry point. Loading the command line takes about a second of
imports; it happens here, inside Ctrl-C handling, so that a stop while it loads ends as one
later does (one line, exit code 130) rather than in a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    """Load the command line, then run it."""
    try:
        from prefill_tuner.cli import main as run
    except KeyboardInterrupt:
        from prefill_tuner.exit_codes import INTERRUPTED

        print("error: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    run()
