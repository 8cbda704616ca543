"""The simulation loop: arrivals, scheduler steps, step durations, and what they produce.

Time advances step by step: a step starts when the previous one ends (or, when the engine is
idle, at the next arrival), schedules what has arrived by then, lasts as long as the cost
model says, and its sampled tokens are delivered at its end. This is vLLM's synchronous engine
loop (its CPU mode); on GPU vLLM overlaps scheduling with the step (async scheduling), which
delays freeing a finished request's blocks by one step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from prefill_tuner import __version__
from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import StepModel, StepShape, shape_of
from prefill_tuner.engines.sim.request import PrefixInterner, SimRequest, Status
from prefill_tuner.engines.sim.scheduler import Scheduler, StepPlan
from prefill_tuner.objectives.metrics import RequestRecord, RunMetrics, summarize_run
from prefill_tuner.trace.model import Trace

SIMULATOR_VERSION = f"tuner-sim {__version__} (vLLM V1 scheduler, synchronous)"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step, as the per-step trace (``--steps-out``) writes it."""

    index: int
    start_s: float
    duration_s: float
    scheduled: dict[str, int]
    """Tokens scheduled per request id, in scheduling order."""
    admitted: dict[str, int]
    """Requests admitted this step → prompt tokens served by the prefix cache."""
    prefill_tokens: int
    decode_tokens: int
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    running: int
    """Requests running after the step (finished ones removed)."""
    waiting: int
    kv_blocks_used: int
    """KV blocks in use during the step (before finished requests free theirs)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.index,
            "start_s": round(self.start_s, 9),
            "duration_s": round(self.duration_s, 9),
            "scheduled": self.scheduled,
            "admitted": self.admitted,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "preempted": list(self.preempted),
            "finished": list(self.finished),
            "running": self.running,
            "waiting": self.waiting,
            "kv_blocks_used": self.kv_blocks_used,
        }


@dataclass
class SimResult:
    """Everything one simulated run produced."""

    config: SimConfig
    profile: str
    records: list[RequestRecord]
    metrics: RunMetrics
    steps: int
    peak_kv_blocks: int
    usable_kv_blocks: int
    preemptions: int
    wall_s: float
    prefix_cache_queries: int = 0
    """Prompt tokens looked up in the prefix cache at admission."""
    prefix_cache_hits: int = 0
    """Of those, tokens served from the cache."""
    stalled: str | None = None
    """Why the run stopped before serving everything (a request that can never be admitted)."""
    engine_version: str = SIMULATOR_VERSION

    def summary(self, trace: Trace) -> dict[str, object]:
        """Everything worth keeping from a run of ``trace``, JSON-ready (NaN left as is)."""
        return {
            "engine": self.engine_version,
            "profile": self.profile,
            "config": self.config.model_dump(),
            "trace": None if trace.source is None else trace.source.path,
            "adjustments": [str(note) for note in trace.adjustments],
            "metrics": self.metrics.as_dict(),
            "steps": self.steps,
            "preemptions": self.preemptions,
            "peak_kv_blocks": self.peak_kv_blocks,
            "usable_kv_blocks": self.usable_kv_blocks,
            "peak_kv_usage": self.peak_kv_usage,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "stalled": self.stalled,
            "wall_s": self.wall_s,
        }

    @property
    def peak_kv_usage(self) -> float:
        return self.peak_kv_blocks / self.usable_kv_blocks if self.usable_kv_blocks else 0.0


def simulate(
    trace: Trace,
    config: SimConfig,
    profile: StepModel,
    *,
    on_step: Callable[[StepRecord], None] | None = None,
    fast_forward: bool = True,
) -> SimResult:
    """Replay ``trace`` through the simulated engine; ``on_step`` sees every step.

    ``fast_forward`` applies runs of plain decode steps in one go (same results, much faster;
    off only to check exactly that).
    """
    started = time.perf_counter()
    interner = PrefixInterner()
    requests = [SimRequest(i, r, interner) for i, r in enumerate(trace.requests)]
    errors: dict[int, str] = {}
    accepted: list[SimRequest] = []
    for request in requests:
        if request.prompt + request.max_tokens > config.max_model_len:
            request.status = Status.REJECTED
            errors[request.index] = (
                f"rejected: prompt + output tokens exceed max_model_len {config.max_model_len}"
            )
        else:
            accepted.append(request)

    scheduler = Scheduler(config)
    kv = scheduler.kv
    ready = _ready_times(accepted, profile.request_latency_s, profile.request_interval_s)
    clock = ready[0] if accepted else 0.0
    next_arrival = 0
    step_index = 0
    peak_blocks = preemptions = 0
    stalled: str | None = None
    while True:
        while next_arrival < len(accepted) and ready[next_arrival] <= clock:
            scheduler.add_request(accepted[next_arrival])
            next_arrival += 1
        if not scheduler.has_work():
            if next_arrival >= len(accepted):
                break
            clock = ready[next_arrival]
            continue
        arrival = ready[next_arrival] if next_arrival < len(accepted) else None
        run = _decode_run(scheduler, profile, clock, arrival) if fast_forward else None
        if run is not None:
            starts, durations, ends = run
            ids = [r.id for r in scheduler.running] if on_step is not None else []
            used, finished = scheduler.apply_decode_run(len(ends), ends)
            peak_blocks = max(peak_blocks, used[-1])
            if on_step is not None:
                _emit_run(on_step, scheduler, ids, finished, step_index, starts, durations, used)
            step_index += len(ends)
            clock = ends[-1]
            continue
        plan = scheduler.schedule()
        preemptions += len(plan.preempted)
        if not plan.scheduled and not plan.preempted:
            stalled = _stall_reason(scheduler)
            break
        used = kv.num_used_blocks
        peak_blocks = max(peak_blocks, used)
        shape = _shape(plan)
        # A step that only preempted runs no model: vLLM skips execution when no token is due.
        duration = profile.step_seconds(shape) if plan.scheduled else 0.0
        end = clock + duration
        finished = scheduler.finish_step(plan, end)
        if on_step is not None:
            on_step(
                StepRecord(
                    index=step_index,
                    start_s=clock,
                    duration_s=duration,
                    scheduled={r.id: n for r, n in plan.scheduled},
                    admitted=plan.admitted,
                    prefill_tokens=shape.prefill_tokens,
                    decode_tokens=shape.decode_tokens,
                    preempted=tuple(r.id for r in plan.preempted),
                    finished=tuple(r.id for r in finished),
                    running=len(scheduler.running),
                    waiting=len(scheduler.waiting),
                    kv_blocks_used=used,
                )
            )
        step_index += 1
        clock = end

    if stalled:
        for request in requests:
            if request.status not in (Status.FINISHED, Status.REJECTED):
                errors[request.index] = "stalled: " + stalled
    records = [
        RequestRecord(
            id=r.id,
            sent_s=r.arrival_s,
            token_times_s=r.token_times,
            expected_tokens=r.max_tokens,
            error=errors.get(r.index),
            preemptions=r.preemptions,
        )
        for r in requests
    ]
    return SimResult(
        config=config,
        profile=profile.name,
        records=records,
        metrics=summarize_run(records),
        steps=step_index,
        peak_kv_blocks=peak_blocks,
        usable_kv_blocks=config.usable_blocks,
        preemptions=preemptions,
        wall_s=time.perf_counter() - started,
        prefix_cache_queries=scheduler.prefix_queries,
        prefix_cache_hits=scheduler.prefix_hits,
        stalled=stalled,
    )


def _ready_times(requests: list[SimRequest], latency: float, interval: float) -> list[float]:
    """When the scheduler sees each request: ``latency`` after its send, and ``interval``
    after the one before at the soonest (the server's front end takes them one by one)."""
    ready: list[float] = []
    previous = float("-inf")
    for request in requests:
        previous = max(request.arrival_s + latency, previous + interval)
        ready.append(previous)
    return ready


MIN_DECODE_RUN = 4
"""Shorter runs of plain decode steps are cheaper to schedule one by one."""


def _decode_run(
    scheduler: Scheduler,
    profile: StepModel,
    clock: float,
    next_arrival_s: float | None,
) -> tuple[list[float], list[float], list[float]] | None:
    """Start times, durations and end times of the plain decode steps that start now, up to
    the next arrival; ``None`` when fewer than :data:`MIN_DECODE_RUN`."""
    limit = scheduler.decode_run_limit()
    if limit < MIN_DECODE_RUN:
        return None
    running = scheduler.running
    context = sum(r.num_computed + 1 for r in running)
    durations = profile.decode_run_seconds(len(running), context, limit)
    # Sequential float additions, exactly as the step-by-step loop accumulates its clock.
    times = np.cumsum(np.concatenate(([clock], durations)))
    steps = limit
    if next_arrival_s is not None:
        # A step starting at or after the next arrival would admit it: stop before it.
        steps = min(steps, int(np.searchsorted(times[:-1], next_arrival_s, side="left")))
    if steps < MIN_DECODE_RUN:
        return None
    return times[:steps].tolist(), durations[:steps].tolist(), times[1 : steps + 1].tolist()


def _emit_run(
    on_step: Callable[[StepRecord], None],
    scheduler: Scheduler,
    ids: list[str],
    finished: list[SimRequest],
    first_index: int,
    starts: list[float],
    durations: list[float],
    used: list[int],
) -> None:
    """The per-step records of a fast-forwarded run, as stepping would have produced them."""
    waiting = len(scheduler.waiting)
    last = len(starts) - 1
    for offset, (start, duration, blocks) in enumerate(zip(starts, durations, used, strict=True)):
        done = offset == last and finished
        on_step(
            StepRecord(
                index=first_index + offset,
                start_s=start,
                duration_s=duration,
                scheduled=dict.fromkeys(ids, 1),
                admitted={},
                prefill_tokens=0,
                decode_tokens=len(ids),
                preempted=(),
                finished=tuple(r.id for r in finished) if done else (),
                running=len(ids) - len(finished) if done else len(ids),
                waiting=waiting,
                kv_blocks_used=blocks,
            )
        )


def _shape(plan: StepPlan) -> StepShape:
    """Classify the step's tokens for the cost model: a decode is one new token after output
    (``schedule()`` has already counted the step's tokens as computed)."""
    items = []
    for request, num_new in plan.scheduled:
        before = request.num_computed - num_new
        decoding = num_new == 1 and request.num_output > 0 and before == request.num_tokens - 1
        items.append((before, num_new, decoding))
    return shape_of(items, len(plan.scheduled))


def _stall_reason(scheduler: Scheduler) -> str:
    head = scheduler.waiting[0]
    need = -(-head.num_tokens // scheduler.config.block_size)
    return (
        f"request {head.id} can never be admitted: it needs {need} KV blocks at admission and "
        f"the pool has {scheduler.kv.usable_blocks} usable"
        + (
            f" (minus a watermark of {scheduler.kv.watermark_blocks})"
            if scheduler.kv.watermark_blocks
            else ""
        )
    )
