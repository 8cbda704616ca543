"""The ``tune`` command's entry point. It handles stop signals for the whole process
(:mod:`prefill_tuner.stopping`), from before the second of imports that loads the command line
to the process's exit, so that a stop at any moment ends as one during a trial does (one line,
exit code 130) rather than in a traceback or by the signal (exit 143).

It also sets the process's garbage collection (:func:`_collect_for_a_command`): the libraries
the command line loads are most of its heap and live as long as it does, and what a command
makes (trials, simulations, reports) is freed by reference counting almost all, so the
collector's default of a pass every 700 new container objects, rescanning the whole heap every
few dozen passes, spent about a second of the main job (``tune run --slo p99_tpot=50ms``) and
0.13 s of every command's start finding almost nothing to free (``benchmarks/RESULTS.md``)."""

from __future__ import annotations

import gc
import sys

YOUNG_COLLECTION_EVERY = 10_000
"""New container objects between two passes of the collector over its youngest generation
(Python's default: 700). The older generations' thresholds are kept (a middle pass every ten
young ones, a full pass every ten middle ones once enough has survived): a cycle is still
freed, only later (the main job's peak memory grows by 2 MB of its 220)."""


def main() -> None:
    """Load the command line, then run it."""
    from prefill_tuner.stopping import ignore_from_now, install_for_process

    install_for_process()  # SIGTERM too: a stop while it loads is an interrupt
    gc.disable()  # loading makes 180,000 objects that stay: collecting meanwhile frees none
    try:
        from prefill_tuner.cli import main as run

        _collect_for_a_command()  # (a stop meanwhile is one while it loads)
    except KeyboardInterrupt:
        from prefill_tuner.exit_codes import INTERRUPTED

        ignore_from_now()
        print("error: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    try:
        run()
    finally:
        ignore_from_now()


def _collect_for_a_command() -> None:
    """Freeze what is loaded (no pass scans it again: it lives as long as the process) and
    collect the young generation every :data:`YOUNG_COLLECTION_EVERY` new objects."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, middle, old)
    gc.enable()
