"""Several replicas of the simulated engine behind a router.

Each replica is the same simulated engine (:mod:`~prefill_tuner.engines.sim.loop`) with
its own scheduler and KV cache. The router picks a replica for each request when it arrives,
from each replica's state at that instant: every replica's loop runs up to the arrival and
pauses there (it makes no decision that a later request could change), the router chooses,
the request is added, and the loops resume. So a replica's schedule is exactly what the
single-engine simulator gives for the requests it was sent, and the routing decisions see
what a real router would (requests in flight: sent, last token not yet returned).
"""

from __future__ import annotations

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
from prefill_tuner.engines.sim.request import Status
from prefill_tuner.engines.sim.routing import make_router
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
    trace: Trace, config: SimConfig, profile: StepModel, *, replicas: int, router: str
) -> ReplicatedResult:
    """Replay ``trace`` through ``replicas`` copies of the engine behind ``router``."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {replicas}")
    started = time.perf_counter()
    requests, accepted, errors = prepare_requests(trace, config)
    policy = make_router(router, replicas)
    loops = [_Loop(config, profile, [], None, True) for _ in range(replicas)]
    for loop in loops:
        loop.scheduler.retired = []
    runs: list[Iterator[int] | None] = [loop.steps() for loop in loops]
    # Per replica: requests sent whose last token the router does not have yet; and a heap of
    # when each finished request's last token reaches the router.
    outstanding = [0] * replicas
    returning: list[list[int]] = [[] for _ in range(replicas)]
    sent = [0] * replicas
    assignment = [-1] * len(requests)
    for request in accepted:
        now = _ns(request.arrival_s)
        for index, loop in enumerate(loops):
            loop.horizon = now
            runs[index] = _advance(runs[index])
            retired, heap = loop.scheduler.retired, returning[index]
            if retired:
                for finished in retired:
                    heapq.heappush(heap, _ns(finished.token_times[-1]))
                retired.clear()
            while heap and heap[0] <= now:
                heapq.heappop(heap)
                outstanding[index] -= 1
        choice = policy.choose(request, outstanding)
        loops[choice].add(request, now)
        outstanding[choice] += 1
        sent[choice] += 1
        assignment[request.index] = choice
    for index, loop in enumerate(loops):
        loop.horizon = None
        _advance(runs[index])
    stalled = next(
        (f"replica {i}: {loop.stalled}" for i, loop in enumerate(loops) if loop.stalled), None
    )
    if stalled:
        for request in requests:
            if request.status not in (Status.FINISHED, Status.REJECTED):
                errors[request.index] = "stalled: " + stalled
    records = request_records(requests, errors)
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
    )
    stats = [
        ReplicaStats(
            requests=count,
            busy_s=loop.busy / NS,
            steps=loop.step_index,
            preemptions=loop.preemptions,
            peak_kv_usage=loop.peak_blocks / config.usable_blocks if config.usable_blocks else 0.0,
        )
        for loop, count in zip(loops, sent, strict=True)
    ]
    return ReplicatedResult(result, stats, assignment)


def _advance(run: Iterator[int] | None) -> Iterator[int] | None:
    """Run a replica's loop until it pauses at its horizon; ``None`` once it has ended."""
    if run is None:
        return None
    return run if next(run, None) is not None else None
