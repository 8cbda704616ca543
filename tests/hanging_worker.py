"""``tune`` whose Nth simulated run never ends: a worker for a test to kill mid-trial.

``python tests/hanging_worker.py MARKER N worker --study ...``: the Nth engine run writes MARKER
(the test's signal that this worker is inside a trial) and then blocks, with the trial's
heartbeat thread still beating, until the test kills the process.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from prefill_tuner.cli import main
from prefill_tuner.engines.sim.adapter import SimEngine


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


if __name__ == "__main__":
    marker, n, *args = sys.argv[1:]
    hang_at(Path(marker), int(n))
    sys.argv = ["tune", *args]
    main()
