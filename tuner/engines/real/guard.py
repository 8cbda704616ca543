"""Watching a replay while it runs: stop it when the server dies or hangs, or when the
early-abort rule finds its SLO verdict certain.

A crash or a hang is a failure of the trial (the study learns to avoid that region); an early
abort is not: the trial is complete, infeasible, with lower bounds of what it would have
measured (:mod:`prefill_tuner.objectives.early_abort`).
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import numpy as np

from prefill_tuner import defaults
from prefill_tuner.engines.real.launcher import VllmServer, classify_failure, failure_cause
from prefill_tuner.engines.real.replay import ReplayState
from prefill_tuner.objectives.early_abort import Certainty, EarlyAbortRule

CHECK_INTERVAL_S = 0.5


class ReplayGuard:
    """Runs beside a replay (:meth:`watch`) and stops it through its :class:`ReplayState`."""

    def __init__(
        self,
        server: VllmServer,
        state: ReplayState,
        rule: EarlyAbortRule | None = None,
        hang_timeout_s: float = defaults.HANG_TIMEOUT_S,
    ) -> None:
        self.server, self.state, self.rule = server, state, rule
        self.hang_timeout_s = hang_timeout_s
        self.failure: str | None = None
        """Why the server failed during the replay (exited, hung, stopped answering)."""
        self.certainty: Certainty | None = None
        """Set when the early-abort rule stopped the replay."""

    async def watch(self) -> None:
        """Check every half second until the replay ends."""
        while not self.state.stopped.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.state.stopped.wait(), timeout=CHECK_INTERVAL_S)
                return
            self.check()

    def check(self) -> None:
        """One look at the server and the replay; stops the replay when it must end."""
        if self._server_exited():
            return
        stalled = self.state.stalled_s()
        if stalled > self.hang_timeout_s:
            in_flight = int(np.count_nonzero(~np.isnan(self.state.sent_s) & ~self.state.finished))
            self._fail(
                f"the server hung: no token for {stalled:.0f} s with {in_flight} requests in flight"
            )
            return
        if self.rule is not None:
            certainty = self.rule.check(self.state.snapshot())
            if certainty is not None:
                self.certainty = certainty
                self.state.stop(f"cut short: {certainty.reason}")

    async def confirm_alive(self, timeout_s: float = 10.0) -> None:
        """After the replay: a server that exited or no longer answers ``/health`` failed
        during it (requests failing on a dead server are its symptom, not the cause)."""
        if self.failure is not None or self._server_exited():
            return
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                response = await client.get(f"{self.server.base_url}/health")
            if response.status_code == 200:
                return
            problem = f"answered /health with HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            problem = f"stopped answering ({type(exc).__name__} on /health)"
        if not self._server_exited():
            # The cause is in the log (``EngineDeadError`` and what killed the engine core).
            cause = failure_cause(self.server.spec.log_path)
            self._fail(f"the server {problem} during the replay" + (f": {cause}" if cause else ""))

    def _server_exited(self) -> bool:
        process = self.server.process
        code = process.poll() if process is not None else None
        if code is None:
            return False
        log = self.server.spec.log_path
        self.server.log_settled()  # its last words, the cause, are written
        self._fail(f"the server exited during the replay: {classify_failure(log, code)}")
        return True

    def _fail(self, reason: str) -> None:
        self.failure = self.failure or reason
        self.certainty = None
        self.state.stop(reason)
