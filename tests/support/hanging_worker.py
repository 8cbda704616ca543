"""``tune`` whose Nth simulated run never ends: a worker (or ``tune run``) for a test to kill
mid-trial.

``python tests/support/hanging_worker.py MARKER N worker --study ...``: the Nth engine run
writes MARKER (the test's signal that this worker is inside a trial) and then blocks, with the
trial's heartbeat thread still beating, until the test kills the process.

With ``HANG_IN=ask``, it blocks instead inside Optuna's ``ask`` of its Nth trial, once the trial
is RUNNING and before the objective has it: a stop there reaches no code of ours.

With ``SECOND_SIGNAL=SIGTERM`` (or ``SIGINT``) in the environment, the process sends itself
that signal again at the start of its clean-up (re-queueing the interrupted trial): exactly
the moment a second Ctrl-C, or systemd's second SIGTERM, would land.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import optuna

from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.entry import main
from prefill_tuner.study import runners
from prefill_tuner.worker import loop


def hang_at(marker: Path, n: int) -> None:
    original = SimEngine.run
    calls = 0

    def run(self: SimEngine, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == n:
            marker.write_text("inside a trial\n")
            threading.Event().wait()
        return original(self, *args, **kwargs)

    SimEngine.run = run  # type: ignore[method-assign]


def hang_in_ask(marker: Path, n: int) -> None:
    original = optuna.Study.ask
    calls = 0

    def ask(self: optuna.Study, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        trial = original(self, *args, **kwargs)
        calls += 1
        if calls == n:
            marker.write_text("inside ask\n")
            threading.Event().wait()
        return trial

    optuna.Study.ask = ask  # type: ignore[method-assign]


def signal_again_during_clean_up(signum: int) -> None:
    def again(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            os.kill(os.getpid(), signum)
            return original(*args, **kwargs)

        return wrapper

    loop.give_up = again(loop.give_up)  # type: ignore[assignment]
    runners.requeue = again(runners.requeue)  # type: ignore[assignment]


if __name__ == "__main__":
    if os.environ.get("SECOND_SIGNAL"):
        signal_again_during_clean_up(signal.Signals[os.environ["SECOND_SIGNAL"]])
    marker, n, *args = sys.argv[1:]
    if os.environ.get("HANG_IN") == "ask":
        hang_in_ask(Path(marker), int(n))
    else:
        hang_at(Path(marker), int(n))
    sys.argv = ["tune", *args]
    main()
