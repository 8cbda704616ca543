"""Stop signals: Ctrl-C (SIGINT) and SIGTERM (a stopped container or service) stop a command
the same way, once, whenever they arrive.

The first one raises :class:`KeyboardInterrupt` where the command is, so the running trial's
server is stopped, the trial is failed and queued again, finished trials are kept and a
half-written file is removed. Every later one (people press Ctrl-C twice, systemd sends SIGTERM
again) is ignored until the process exits, so it cannot cut that clean-up short nor end the
process by the signal's default action (exit 143 instead of 130). SIGKILL still ends it at once.

A :class:`KeyboardInterrupt` raised while Python runs a finalizer (a weak-reference callback, a
``__del__``: the garbage collector runs them between any two lines) is printed as "Exception
ignored" and dropped, and the command would go on as if nothing had been asked. Such a lost
interrupt is raised again a moment later (by a timer's SIGALRM: raised while the finalizer's
error is handled, it would be dropped the same way), until it lands in the command's own code.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CLEANING_UP = "stopping: cleaning up the running trial first"
REDELIVERY_DELAY_S = 0.01
"""How long after a finalizer dropped the interrupt it is raised again (by SIGALRM)."""


class StopHandler:
    """The handler of both stop signals for one process (or one block of it)."""

    def __init__(self) -> None:
        self.requested = False
        """Whether a stop signal arrived."""
        self.console: Console | None = None
        """Where to say that a further signal is ignored (the command's stderr)."""
        self._said = False
        self._previous: dict[int, Any] = {}
        self._previous_hook = sys.unraisablehook

    def install(self) -> None:
        self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._redeliver)
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable

    def uninstall(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        sys.unraisablehook = self._previous_hook

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            if self.console is not None and not self._said:
                self.console.print(CLEANING_UP, markup=False)
                self._said = True  # once: a wrapper may repeat its stop until tune exits
            return
        self.requested = True
        raise KeyboardInterrupt

    def _redeliver(self, signum: int, frame: FrameType | None) -> None:
        """The timer :meth:`_unraisable` set: the interrupt a finalizer dropped, again."""
        raise KeyboardInterrupt

    def _unraisable(self, unraisable: Any) -> None:
        if self.requested and isinstance(unraisable.exc_value, KeyboardInterrupt):
            # A moment later, not from here: raised in the hook, it would be dropped again.
            signal.setitimer(signal.ITIMER_REAL, REDELIVERY_DELAY_S)
            return
        self._previous_hook(unraisable)


_process: StopHandler | None = None


def install_for_process() -> StopHandler:
    """Handle stop signals for the rest of the process: the ``tune`` command's entry point
    calls this first (before the second of imports that loads the command line), so that a
    signal between two stages of a command, or a second one after a stage caught the first,
    is handled as one inside them."""
    global _process
    if _process is None:
        _process = StopHandler()
        _process.install()
    return _process


def ignore_from_now() -> None:
    """The command has ended: a stop signal now changes nothing, and is ignored (``SIG_IGN``,
    which Python keeps while it shuts down; it puts back the default action of a handler of
    its own, and a signal in the last moments would end the process by it: exit 143)."""
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


@contextmanager
def stop_signals(console: Console | None = None) -> Iterator[None]:
    """A block in which a stop signal raises :class:`KeyboardInterrupt` once (see the module),
    saying on ``console`` that later ones are ignored. Under :func:`install_for_process` the
    process's handler serves it; otherwise (the command called in-process, as tests do) one is
    installed for the block and the previous handlers are back after it."""
    handler = _process or StopHandler()
    owned = handler is not _process
    previous_console, handler.console = handler.console, console
    if owned:
        handler.install()
    try:
        yield
    finally:
        handler.console = previous_console
        if owned:
            handler.uninstall()
