"""A trial's heartbeat, recorded from a thread while the trial runs (Optuna's ``optimize`` does
this itself; a worker claims trials with ``ask`` and so records them here)."""

from __future__ import annotations

import threading
from types import TracebackType

from optuna.storages import BaseStorage


class Heartbeat:
    """``with Heartbeat(storage, trial_id, interval):`` beats every ``interval`` seconds.

    The claim recorded the first beat. A failed write (the database briefly unreachable) is
    kept in :attr:`error` and retried at the next beat; a trial whose beats stop for longer
    than the grace period is failed and retried by another worker.
    """

    def __init__(self, storage: BaseStorage, trial_id: int, interval: float) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, interval
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                # An RDB storage with heartbeats: Optuna types it BaseStorage.
                self.storage.record_heartbeat(self.trial_id)  # type: ignore[attr-defined]
                self.error = None
            except Exception as exc:  # keep beating: the next write may succeed
                self.error = exc
