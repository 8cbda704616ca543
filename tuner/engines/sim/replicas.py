"""Several replicas of the simulated engine behind a router.

Each replica is the same simulated engine (:mod:`~prefill_tuner.engines.sim.loop`) with
its own scheduler and KV cache. The router picks a replica for each request when it arrives,
from each replica's state at that instant: every replica's loop runs up to the arrival and
pauses there (it makes no decision that a later request could change), the router chooses,
the request is added, and the loops resume. So a replica's schedule is exactly what the
single-engine simulator gives for the requests it was sent, and the routing decisions see
what a real router would (requests in flight: sent, last token not yet returned).

A closed-loop client (``max_concurrency``) holds its limit over all replicas: while every slot
is taken, the next request is sent when the first of the requests in flight, on any replica,
delivers its last token. Until that moment is known the replicas run in time order, none past
a moment at which another could still free a slot (:meth:`_Replicas.next_free`), so each
replica's schedule is still the single engine's for the requests it was sent, when they were
sent.
"""

from __future__ import annotations

import functools
import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.loop import (
    NS,
    SimResult,
    _Loop,
    _ns,
    prepare_requests,
    request_records,
)
from prefill_tuner.engines.sim.request import SimRequest, Status
from prefill_tuner.engines.sim.routing import Router, make_router
from prefill_tuner.objectives.metrics import summarize_run
from prefill_tuner.trace.model import Trace


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """What one replica did in a run."""

    requests: int
    """Requests the router sent it."""
    busy_s: float
    """Time it spent computing steps."""
    steps: int
    preemptions: int
    peak_kv_usage: float
    """Its peak share of usable KV blocks in use."""

    def as_dict(self) -> dict[str, float | int]:
        return {
            "requests": self.requests,
            "busy_s": self.busy_s,
            "steps": self.steps,
            "preemptions": self.preemptions,
            "peak_kv_usage": self.peak_kv_usage,
        }


@dataclass
class ReplicatedResult:
    """A run of N replicas: every request's record, in trace order, and each replica's share."""

    result: SimResult
    """All requests' records and metrics; steps, preemptions and prefix-cache counts summed
    over replicas, peak KV blocks the largest of any replica."""
    replicas: list[ReplicaStats]
    assignment: list[int]
    """Per request, in trace order: the replica the router sent it to (-1: the engine
    rejected it before routing mattered, e.g. longer than ``max_model_len``)."""

    def utilisation(self) -> list[float]:
        """Per replica, the share of the run (first arrival to last token) spent computing."""
        duration = self.result.metrics.duration_s
        return [stats.busy_s / duration if duration > 0 else 0.0 for stats in self.replicas]


def simulate_replicas(
    trace: Trace,
    config: SimConfig,
    profile: StepModel,
    *,
    replicas: int,
    router: str,
    max_concurrency: int | None = None,
) -> ReplicatedResult:
    """Replay ``trace`` through ``replicas`` copies of the engine behind ``router``;
    ``max_concurrency``: the client keeps at most that many requests in flight over all of
    them (``None``: every request is sent at its arrival)."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {replicas}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, not {max_concurrency}")
    started = time.perf_counter()
    requests, _, errors = prepare_requests(trace, config)
    driver = _Replicas(config, profile, replicas, make_router(router, replicas), max_concurrency)
    driver.send_all(requests)
    loops = driver.loops
    stalled = next(
        (f"replica {i}: {loop.stalled}" for i, loop in enumerate(loops) if loop.stalled), None
    )
    if stalled:
        for request in requests:
            if request.status not in (Status.FINISHED, Status.REJECTED):
                errors[request.index] = "stalled: " + stalled
    records = request_records(requests, errors, driver.path)
    result = SimResult(
        config=config,
        profile=profile.name,
        records=records,
        metrics=summarize_run(records),
        steps=sum(loop.step_index for loop in loops),
        peak_kv_blocks=max(loop.peak_blocks for loop in loops),
        usable_kv_blocks=config.usable_blocks,
        preemptions=sum(loop.preemptions for loop in loops),
        wall_s=time.perf_counter() - started,
        prefix_cache_queries=sum(loop.scheduler.prefix_queries for loop in loops),
        prefix_cache_hits=sum(loop.scheduler.prefix_hits for loop in loops),
        stalled=stalled,
        busy_s=sum(loop.busy for loop in loops) / NS,
        max_concurrency=max_concurrency,
        peak_running=max(loop.scheduler.peak_running for loop in loops),
        admitted_together=tuple(n for loop in loops for n in loop.admitted_together),
    )
    stats = [
        ReplicaStats(
            requests=count,
            busy_s=loop.busy / NS,
            steps=loop.step_index,
            preemptions=loop.preemptions,
            peak_kv_usage=loop.peak_blocks / config.usable_blocks if config.usable_blocks else 0.0,
        )
        for loop, count in zip(loops, driver.sent, strict=True)
    ]
    assignment = [driver.assignment.get(request.index, -1) for request in requests]
    return ReplicatedResult(result, stats, assignment)


FAR = 2**62
"""A tick no run reaches: never."""


class _Replicas:
    """The replicas' loops, the router in front of them, and the client's limit."""

    def __init__(
        self,
        config: SimConfig,
        profile: StepModel,
        replicas: int,
        router: Router,
        limit: int | None,
    ) -> None:
        self.loops = [_Loop(config, profile, [], None, True) for _ in range(replicas)]
        self.path = self.loops[0].path
        """The replicas' way back to the client (one profile: the same path for each)."""
        self.runs: list[Iterator[int] | None] = [loop.steps() for loop in self.loops]
        self.router = router
        self.limit = limit
        # Per replica: requests sent whose last token the router does not have yet; and a
        # heap of when each finished request's last token reaches the router.
        self.outstanding = [0] * replicas
        self.returning: list[list[int]] = [[] for _ in range(replicas)]
        self.sent = [0] * replicas
        self.assignment: dict[int, int] = {}
        """Request index → the replica it was sent to."""
        self.in_flight = 0
        """The client's requests in flight (less those whose last token :attr:`frees` holds)."""
        self.frees: list[int] = []
        """A heap: when each finished request delivered its last token, until counted."""
        self.handled: list[int] = []
        """A heap: when the client has handled the end of each response read (its slot frees
        then: :meth:`ServerPath.resent`), until counted."""
        self.client_free = 0
        """When the client last finished handling a response's end."""
        self.seeking = False
        """Set while :meth:`next_free` runs the replicas up to a slot's freeing."""
        for index, loop in enumerate(self.loops):
            loop.scheduler.retired = []
            if limit is not None:
                loop.on_finish = functools.partial(self._finished, index)

    def _finished(self, replica: int, finished: list[SimRequest], at: int) -> None:
        reads = [self.path.read_last(request, at) for request in finished]
        for read in reads:
            heapq.heappush(self.frees, read)
        loop = self.loops[replica]
        if self.seeking and loop.horizon is not None:
            loop.horizon = min(loop.horizon, *reads)  # it pauses there: a slot frees then

    def send_all(self, requests: list[SimRequest]) -> None:
        """Send every request in arrival order, each when the client may (its arrival, or
        when a slot frees), then run the replicas to the end."""
        last = 0
        for request in requests:
            arrival = _ns(request.arrival_s)
            now = max(arrival, last)
            if self.limit is not None:
                slot = self.slot(now)
                if slot is None:
                    break  # every slot is held by a request that can never finish
                now = slot
            last = now
            if now != arrival:
                request.sent_s = now / NS
            if request.status is Status.REJECTED:
                continue  # answered with an error at once: it holds no slot
            self.route(request, now)
        for index, loop in enumerate(self.loops):
            loop.horizon = None
            _advance(self.runs[index])

    def advance_to(self, now: int) -> None:
        """Run every replica until ``now`` (each pauses before any decision that a request
        sent then could change), and count the last tokens the router has by then."""
        for index, loop in enumerate(self.loops):
            loop.horizon = now
            self.runs[index] = _advance(self.runs[index])
            retired, heap = loop.scheduler.retired, self.returning[index]
            if retired:
                for finished in retired:
                    sampled = _ns(finished.token_times[-1])
                    heapq.heappush(heap, self.path.read_last(finished, sampled))
                retired.clear()
            while heap and heap[0] <= now:
                heapq.heappop(heap)
                self.outstanding[index] -= 1

    def route(self, request: SimRequest, now: int) -> None:
        """Send ``request`` at ``now`` to the replica the router picks."""
        self.advance_to(now)
        choice = self.router.choose(request, self.outstanding)
        self.loops[choice].add(request, now)
        self.outstanding[choice] += 1
        self.sent[choice] += 1
        self.assignment[request.index] = choice
        self.in_flight += 1

    def slot(self, now: int) -> int | None:
        """The first moment from ``now`` at which fewer than the limit are in flight;
        ``None`` when that never comes."""
        assert self.limit is not None
        self.advance_to(now)  # every last token delivered before now is known then
        while True:
            self._count_frees(now)
            if self.in_flight < self.limit:
                return now
            free = self.next_free()
            if free is None:
                return None
            now = max(now, free)
            self.advance_to(now)

    def _count_frees(self, now: int) -> None:
        """Count the slots free by ``now``: every last token read by then (all known: the
        replicas ran to ``now``), each once the client has handled its response's end, one
        response at a time in the order they were read."""
        path = self.path
        while self.frees and self.frees[0] <= now:
            read = heapq.heappop(self.frees)
            if not path.resend:
                self.in_flight -= 1
                continue
            self.client_free = path.resent(read, self.client_free)
            heapq.heappush(self.handled, self.client_free)
        while self.handled and self.handled[0] <= now:
            heapq.heappop(self.handled)
            self.in_flight -= 1

    def next_free(self) -> int | None:
        """When the first request in flight will deliver its last token, or the client will
        have handled a response's end (``None``: never).
        Until that is certain the replicas run in time order: the one whose next decision
        comes first runs, but not up to a moment at which another could have freed a slot
        (a step's tokens come after the step is decided) or a known last token does."""
        self.seeking = True
        try:
            while True:
                known = min(
                    self.frees[0] if self.frees else FAR, self.handled[0] if self.handled else FAR
                )
                times = [_next_decision(loop) for loop in self.loops]
                first = min(range(len(times)), key=times.__getitem__)
                if known <= times[first]:
                    return known if known < FAR else None
                others = min((t for i, t in enumerate(times) if i != first), default=FAR)
                self.loops[first].horizon = min(known, others + 1)
                self.runs[first] = _advance(self.runs[first])
        finally:
            self.seeking = False


def _next_decision(loop: _Loop) -> int:
    """When a paused loop next decides anything: where it paused, or, when it waits for
    requests, at the next one it knows of (:data:`FAR`: none)."""
    if not loop.idle:
        return loop.paused_at
    if loop.next_arrival < len(loop.accepted):
        return loop.ready[loop.next_arrival]
    return FAR


def _advance(run: Iterator[int] | None) -> Iterator[int] | None:
    """Run a replica's loop until it pauses at its horizon; ``None`` once it has ended."""
    if run is None:
        return None
    return run if next(run, None) is not None else None
