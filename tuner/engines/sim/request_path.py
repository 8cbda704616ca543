"""A request's life on a vLLM server outside the engine's steps (``docs/simulator.md``, "A
request's life"; the terms are :class:`~prefill_tuner.engines.sim.profile_base.RequestPath`'s)::

    sent ─ front end ─▶ scheduler sees it ─ steps ─▶ token sampled ─ way back ─▶ client reads it

The way in: the client's request reaches the API server, which parses it, tokenises the
prompt and hands it to the engine core, one request at a time (one process): the scheduler
sees it ``request_latency`` after its send, no sooner than ``request_interval`` after the one
before it, and later by its prompt's tokenising (``request_token`` a token), which holds up
the requests behind it too. The engine core takes it at its next ``schedule()``.

The way back: a step's outputs leave the engine core together at the step's end; the API
server detokenises and streams them one request after another, in the step's order. A token
reaches its client ``response_latency`` after its step's end, plus ``response_output`` for
every output the server handled before it in that step. The client reads a response's last
token, and a closed-loop client sends its next request ``resend`` later, one response at a
time (one process takes every response's end: a second response ended at the same moment is
resent ``resend`` after the first).

Where a request stands among its step's outputs is known exactly for its first token and its
last (``SimRequest.first_position``, ``last_position``); the tokens between are taken at its
first token's place (a request moves towards the front as older ones finish, so this errs
late by at most its first place's time, and TPOT, timed from the first token to the last,
not at all). Read times never run backwards: a token is read no sooner than the one before.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.request import SimRequest
from prefill_tuner.engines.sim.steps import NS
from prefill_tuner.engines.sim.steps import ticks as _ticks


@dataclass(frozen=True, slots=True)
class ServerPath:
    """A profile's request path in clock ticks (integer nanoseconds)."""

    latency: int
    """From a send to the scheduler seeing the request, the front end being free."""
    interval: int
    """Least time between two requests reaching the scheduler."""
    per_token: float
    """Ticks per prompt token the front end spends on a request."""
    response: int
    """From a step's end to its first output's client reading it."""
    per_output: int
    """Per output the API server handles before a request's in the same step."""
    resend: int = 0
    """A closed-loop client's time from reading a response's last token to its next send,
    one response at a time."""

    @classmethod
    def of(cls, profile: StepModel) -> ServerPath:
        return cls(
            latency=_ticks(profile.request_latency_s),
            interval=_ticks(profile.request_interval_s),
            per_token=profile.request_token_s * NS,
            response=_ticks(profile.response_latency_s),
            per_output=_ticks(profile.response_output_s),
            resend=_ticks(profile.resend_s),
        )

    @property
    def read_late(self) -> bool:
        """Whether a client reads a token later than its step's end."""
        return bool(self.response or self.per_output)

    def ready(self, sent: int, prompt: int, previous: int | None) -> int:
        """When the scheduler sees a request sent at ``sent`` with ``prompt`` tokens, the one
        before it having reached the scheduler at ``previous`` (``None``: none did)."""
        at = sent + self.latency
        if previous is not None:
            at = max(at, previous + self.interval)
        return at + round(prompt * self.per_token)

    def resent(self, read: int, client_free: int) -> int:
        """When a closed-loop client sends the request that a response read at ``read`` lets
        go, its previous such send having been at ``client_free``."""
        return max(read, client_free) + self.resend

    def read_last(self, request: SimRequest, sampled: int) -> int:
        """When the client reads ``request``'s last token, sampled by the step that ended at
        ``sampled``."""
        return sampled + self.response + request.last_position * self.per_output


def read_times(request: SimRequest, path: ServerPath) -> array[float]:
    """When the client read each of ``request``'s tokens, in seconds (the tokens' sampling
    times themselves when the path takes no time; an ``array`` either way, as records hold
    them)."""
    sampled = request.token_times
    if not path.read_late or not sampled:
        return sampled
    times = np.frombuffer(sampled, dtype=np.float64) + path.response / NS
    per_output = path.per_output / NS
    times[:-1] += request.first_position * per_output
    times[-1] += request.last_position * per_output
    read = array("d")
    read.frombytes(np.maximum.accumulate(times).tobytes())
    return read
