"""The simulation loop: arrivals, scheduler steps, step durations, and what they produce.

Synchronous (vLLM on CPU): a step starts when the previous one's output has been applied (or,
when the engine is idle, at the next arrival), schedules what has arrived by then, lasts as
long as the cost model says (device and host time), and its sampled tokens leave the engine
at its end (their clients read them later: :mod:`.request_path`).

Asynchronous (vLLM's default on GPU since 0.14): the engine core keeps up to two steps in flight
(``EngineCore.step_with_batch_queue``): it schedules step k+1 and launches it, then waits for
step k and applies its output, then schedules step k+2, and so on. The device runs the steps
back to back; the host's share of a step (scheduling, output processing) runs while the
previous step computes and delays the device only when it is the longer of the two.

Time is kept in integer nanoseconds, so a constant step maps arrivals to steps exactly however
long the run.

Closed-loop load (``max_concurrency``, as ``vllm bench serve --max-concurrency``): the client
keeps at most N requests in flight (sent, last token not yet read). A request whose arrival
has come while N are in flight waits, and is sent, in arrival order, the moment the client of
one of them reads its last token (:class:`ClosedLoop`); its latencies count from that send. The
engine sees it through the front end, exactly as it sees an arrival at that time.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.fast_forward import FastForward
from prefill_tuner.engines.sim.request import SimRequest, Status, request_templates
from prefill_tuner.engines.sim.request_path import ServerPath, read_times
from prefill_tuner.engines.sim.scheduler import Scheduler, StepPlan
from prefill_tuner.engines.sim.steps import NS, InFlight, StepRecord
from prefill_tuner.engines.sim.steps import shape as shape_of_plan
from prefill_tuner.engines.sim.steps import ticks as _ns
from prefill_tuner.engines.sim.waves import lockstep

__all__ = ["NS", "SIMULATOR_VERSION", "ClosedLoop", "SimResult", "StepRecord", "simulate"]
from prefill_tuner.objectives.metrics import RequestRecord, RunMetrics, summarize_run
from prefill_tuner.trace.model import Trace
from prefill_tuner.version import __version__

SIMULATOR_VERSION = f"tuner-sim {__version__} (vLLM V1 scheduler, synchronous and async)"


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
    busy_s: float = 0.0
    """Time the engine spent computing steps (the device's, when scheduling asynchronously)."""
    max_concurrency: int | None = None
    """The client's limit the run replayed under (``None``: open loop)."""
    peak_running: int = 0
    """The most requests running at once (on one replica, behind a router). Below
    ``max_num_seqs``, that limit never refused an admission, and the run is the same under
    any limit above it."""
    admitted_together: tuple[int, ...] = ()
    """How many requests each step that admitted any admitted from the waiting queue, in
    order (every replica's, one after another): a closed loop's lockstep waves show here
    (:func:`~prefill_tuner.engines.sim.waves.lockstep`)."""

    def client_waits(self, trace: Trace) -> list[float]:
        """How long each request of ``trace`` waited at the client for a slot (its send less
        its arrival; all 0 in an open loop)."""
        return [
            max(record.sent_s - request.arrival_s, 0.0)
            for record, request in zip(self.records, trace.requests, strict=True)
        ]

    def summary(self, trace: Trace) -> dict[str, object]:
        """Everything worth keeping from a run of ``trace``, JSON-ready (NaN left as is)."""
        waits = self.client_waits(trace)
        waves = lockstep(trace, self.max_concurrency, self.admitted_together)
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
            "max_concurrency": self.max_concurrency,
            "requests_held": sum(1 for wait in waits if wait > 0),
            "client_wait_max_s": max(waits, default=0.0),
            "wall_s": self.wall_s,
            "lockstep_waves": None if waves is None else waves.line(),
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
    max_concurrency: int | None = None,
) -> SimResult:
    """Replay ``trace`` through the simulated engine; ``on_step`` sees every step.

    ``fast_forward`` applies runs of plain decode steps in one go (same results, much faster;
    off only to check exactly that). ``max_concurrency``: the client keeps at most that many
    requests in flight (:class:`ClosedLoop`); ``None``: every request is sent at its arrival.
    """
    started = time.perf_counter()
    requests, accepted, errors = prepare_requests(trace, config)
    if max_concurrency is None:
        loop = _Loop(config, profile, accepted, on_step, fast_forward)
    else:
        loop = _Loop(config, profile, [], on_step, fast_forward)
        client = ClosedLoop(requests, max_concurrency, loop.add, loop.path)
        loop.on_finish = client.release
        loop.on_reject = client.turned_away
        client.fill(0)
    for _ in loop.steps():  # no horizon: it never pauses
        raise AssertionError("the loop paused without a horizon")
    errors.update(loop.turned_away)
    if loop.stalled:
        for request in requests:
            if request.status not in (Status.FINISHED, Status.REJECTED):
                errors[request.index] = "stalled: " + loop.stalled
    records = request_records(requests, errors, loop.path)
    return SimResult(
        config=config,
        profile=profile.name,
        records=records,
        metrics=summarize_run(records),
        steps=loop.step_index,
        peak_kv_blocks=loop.peak_blocks,
        usable_kv_blocks=config.usable_blocks,
        preemptions=loop.preemptions,
        wall_s=time.perf_counter() - started,
        prefix_cache_queries=loop.scheduler.prefix_queries,
        prefix_cache_hits=loop.scheduler.prefix_hits,
        stalled=loop.stalled,
        busy_s=loop.busy / NS,
        max_concurrency=max_concurrency,
        peak_running=loop.scheduler.peak_running,
        admitted_together=tuple(loop.admitted_together),
    )


def prepare_requests(
    trace: Trace, config: SimConfig
) -> tuple[list[SimRequest], list[SimRequest], dict[int, str]]:
    """Every request of the trace in the engine's terms, those the engine accepts, and why
    the others were rejected (by index)."""
    requests = [SimRequest(i, t) for i, t in enumerate(request_templates(trace))]
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
    return requests, accepted, errors


def request_records(
    requests: list[SimRequest], errors: dict[int, str], path: ServerPath
) -> list[RequestRecord]:
    """What each request experienced, in trace order: its tokens when its client read them
    (``path``)."""
    return [
        RequestRecord(
            id=r.id,
            sent_s=r.sent_s,
            token_times_s=read_times(r, path),
            expected_tokens=r.max_tokens,
            error=errors.get(r.index),
            preemptions=r.preemptions,
            traffic_class=r.traffic_class,
            seen_s=r.seen_s,
        )
        for r in requests
    ]


class ClosedLoop:
    """The client of a closed-loop benchmark (``vllm bench serve --max-concurrency N``,
    GuideLLM's concurrent profile): at most ``limit`` requests in flight, a request being in
    flight from its send until its last token is delivered. Requests are sent in arrival
    order, each at its arrival or, when every slot is taken then, the moment one frees.

    A request the engine rejects (longer than ``max_model_len``) is answered at once: it waits
    for its turn like any other, and frees its slot as it takes it.

    A request's slot frees when the client reads its last token (``path``: after the step
    that sampled it, and after the outputs the API server streamed before it) and has handled
    its end (``path.resend``, one response at a time), so the requests of one step are sent
    again one after another, not together.
    """

    def __init__(
        self,
        requests: list[SimRequest],
        limit: int,
        send: Callable[[SimRequest, int], None],
        path: ServerPath,
    ) -> None:
        """``requests``: all of them, in arrival order; ``send`` hands one to the engine,
        sent at the given tick; ``path``: the server's way back to the client."""
        if limit < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {limit}")
        self.waiting = deque(requests)
        """Requests not sent yet, in arrival order."""
        self.limit = limit
        self.send = send
        self.path = path
        self.in_flight = 0
        self.last_sent = 0
        self.client_free = 0
        """When the client last finished handling a response's end (:meth:`ServerPath.resent`)."""

    def fill(self, now: int) -> None:
        """Send, from ``now`` on (ticks), every waiting request that a free slot lets go: each
        at its arrival, or ``now`` if that is later."""
        waiting = self.waiting
        while waiting and self.in_flight < self.limit:
            request = waiting.popleft()
            arrival = _ns(request.arrival_s)
            sent = max(arrival, now, self.last_sent)
            self.last_sent = sent
            if sent != arrival:
                request.sent_s = sent / NS
            if request.status is Status.REJECTED:
                continue  # answered with an error at once: the slot is free again
            self.in_flight += 1
            self.send(request, sent)

    def turned_away(self, request: SimRequest, at: int) -> None:
        """The server answered ``request`` with HTTP 503 at ``at`` (ticks): its slot frees
        then."""
        self.in_flight -= 1
        self.client_free = self.path.resent(at + self.path.response, self.client_free)
        self.fill(self.client_free)

    def release(self, finished: list[SimRequest], at: int) -> None:
        """``finished`` had their last tokens sampled by the step that ended at ``at``
        (ticks): each one's slot frees when its client has read that token and handled the
        response's end."""
        path = self.path
        if not path.read_late and not path.resend:
            self.in_flight -= len(finished)
            self.fill(at)
            return
        for read in sorted(path.read_last(request, at) for request in finished):
            self.in_flight -= 1
            self.client_free = path.resent(read, self.client_free)
            self.fill(self.client_free)


class _Loop(FastForward):
    """The engine core's loop around the scheduler, with its clock (integer nanoseconds)."""

    def __init__(
        self,
        config: SimConfig,
        profile: StepModel,
        accepted: list[SimRequest],
        on_step: Callable[[StepRecord], None] | None,
        fast_forward: bool,
    ) -> None:
        self.config = config
        self.profile = profile
        self.accepted = accepted
        self.on_step = on_step
        self.fast_forward = fast_forward
        self.scheduler = Scheduler(config)
        self.path = ServerPath.of(profile)
        """The server's way in (when the scheduler sees a request) and way back."""
        self.scheduler.track_positions = self.path.per_output > 0
        self.ready = _ready_times(accepted, self.path)
        self.horizon: int | None = None
        """Set while requests may still be added (replicas behind a router): the next one
        reaches the router then. The loop pauses (its generator yields) before any decision
        that could depend on it, and treats it as an arrival it may not run past."""
        self.on_finish: Callable[[list[SimRequest], int], None] | None = None
        """Told of the requests each step (or decode run) finished, with the tick their last
        token was sampled (a closed-loop client frees their slots when it reads them)."""
        self.paused_at = 0
        """The clock when the loop last paused at its horizon."""
        self.idle = False
        """Whether it paused waiting for a request (it had nothing it could do before the
        horizon), rather than with work to do."""
        self.next_arrival = 0
        self.step_index = 0
        self.peak_blocks = 0
        self.preemptions = 0
        self.busy = 0
        """Ticks spent computing steps (the device's, when asynchronous)."""
        self.stalled: str | None = None
        self.admitted_together: list[int] = []
        """Per step that admitted requests, how many (:attr:`SimResult.admitted_together`)."""
        self.turned_away: dict[int, str] = {}
        """Why each request a queue limit turned away was (by index)."""
        self.on_reject: Callable[[SimRequest, int], None] | None = None
        """Told of each request turned away, with the tick it was (its client has the 503
        then: a closed-loop client sends the next one)."""

    def _admit_arrivals(self, now: int) -> None:
        """Hand the scheduler every request that reached it by ``now`` (each one noting
        when it did: its ready tick, which may be before ``now``), unless a queue limit
        turns it away (:func:`turned_away`)."""
        ready, accepted, scheduler = self.ready, self.accepted, self.scheduler
        limited = self.config.max_num_queued_reqs is not None or (
            self.config.max_num_queued_tokens is not None
        )
        while self.next_arrival < len(accepted) and ready[self.next_arrival] <= now:
            request = accepted[self.next_arrival]
            at = ready[self.next_arrival]
            self.next_arrival += 1
            refusal = turned_away(self.config, scheduler) if limited else None
            if refusal is None:
                request.seen_s = at / NS
                scheduler.add_request(request)
                continue
            request.status = Status.REJECTED
            self.turned_away[request.index] = refusal
            if self.on_reject is not None:
                self.on_reject(request, at)

    def _upcoming(self) -> int | None:
        """When the next request reaches the scheduler, if one is still to come (at the
        soonest the horizon, when more may be added)."""
        known = self.ready[self.next_arrival] if self.next_arrival < len(self.accepted) else None
        horizon = self.horizon
        if horizon is None or (known is not None and known <= horizon):
            return known
        return horizon

    def add(self, request: SimRequest, sent: int) -> None:
        """A request sent at ``sent`` (ticks), at or after every one added before it."""
        self.idle = False
        self.accepted.append(request)
        self.ready.append(
            self.path.ready(sent, request.prompt, self.ready[-1] if self.ready else None)
        )

    def steps(self) -> Iterator[int]:
        """Run the loop; yields its clock whenever it reaches :attr:`horizon` (never when
        there is none), to be resumed once the requests sent before the new horizon are
        added."""
        return self._run_async() if self.config.async_scheduling else self._run_sync()

    def _paused(self, clock: int) -> bool:
        return self.horizon is not None and clock >= self.horizon

    def _schedule(self) -> StepPlan | None:
        """One ``schedule()`` call; ``None`` when it did nothing at all (nothing can change
        until a request arrives or a step in flight returns)."""
        plan = self.scheduler.schedule()
        if not plan.scheduled and not plan.preempted:
            return None
        self.preemptions += len(plan.preempted)
        if plan.admitted:
            self.admitted_together.append(len(plan.admitted))
        self.peak_blocks = max(self.peak_blocks, self.scheduler.kv.num_used_blocks)
        return plan

    def _stall(self) -> None:
        self.stalled = _stall_reason(self.scheduler)

    def _emit(self, step: InFlight, finished: list[SimRequest]) -> None:
        if self.on_step is None:
            return
        scheduler, plan, shape = self.scheduler, step.plan, step.shape
        self.on_step(
            StepRecord(
                index=step.index,
                start_s=step.start / NS,
                duration_s=(step.end - step.start) / NS,
                scheduled={r.id: n for r, n in plan.scheduled},
                admitted_cached_tokens=plan.admitted,
                prefill_tokens=shape.prefill_tokens,
                decode_tokens=shape.decode_tokens,
                preempted=tuple(r.id for r in plan.preempted),
                finished=tuple(r.id for r in finished),
                running_after=len(scheduler.running),
                waiting_after=len(scheduler.waiting),
                kv_blocks_in_use=step.kv_blocks,
            )
        )

    def _run_sync(self) -> Iterator[int]:
        """vLLM's ``EngineCore.step``: schedule, execute, apply the output, repeat."""
        scheduler, profile = self.scheduler, self.profile
        clock = self.ready[0] if self.accepted else 0
        last = 0  # the last step scheduled one by one: how long it took
        while True:
            while self._paused(clock):
                self.paused_at = clock
                yield clock
            self.idle = False
            self._admit_arrivals(clock)
            arrival = self._upcoming()
            if not scheduler.has_work():
                if arrival is None:
                    return
                clock = arrival
                self.idle = True
                continue
            # A run needs its second step to start before the next arrival, which one nearer
            # than the last step took makes unlikely: not tried then (whether a run is tried
            # never changes a result, only how fast it comes).
            if (
                self.fast_forward
                and (arrival is None or arrival - clock > last)
                and (run := self._sync_steady_run(clock, arrival)) is not None
            ):
                clock = run
                continue
            plan = self._schedule()
            if plan is None:
                if arrival is None:  # nothing left that could change the scheduler's mind
                    self._stall()
                    return
                clock = arrival  # an arrival can unblock it (e.g. the threshold then applies)
                self.idle = True
                continue
            shape = shape_of_plan(plan)
            # A step that only preempted runs no model: vLLM skips execution with no tokens.
            end = clock + (_ns(profile.step_seconds(shape)) if plan.scheduled else 0)
            self.busy += end - clock
            step = InFlight(self.step_index, plan, shape, clock, end, scheduler.kv.num_used_blocks)
            self.step_index += 1
            finished = scheduler.finish_step(plan, end / NS)
            self._emit(step, finished)
            if finished and self.on_finish is not None:
                self.on_finish(finished, end)
            clock, last = end, end - clock

    def _run_async(self) -> Iterator[int]:
        """vLLM's ``EngineCore.step_with_batch_queue`` with two batches in flight: schedule
        and launch a step, and only when two are in flight (or nothing more can be
        scheduled) wait for the older one and apply its output."""
        scheduler, profile = self.scheduler, self.profile
        queue: deque[InFlight] = deque()
        host = self.ready[0] if self.accepted else 0  # the engine core's clock
        device_free = 0  # when the device finishes the last step launched
        while True:
            while self._paused(host):
                self.paused_at = host
                yield host
            self.idle = False
            self._admit_arrivals(host)
            if scheduler.has_work():
                if self.fast_forward and len(queue) == 1 and queue[0].plan.scheduled:
                    run = self._async_steady_run(queue, host)
                    if run is not None:
                        host, device_free = run
                        continue
                plan = self._schedule()
                if plan is not None:
                    shape = shape_of_plan(plan)
                    if plan.scheduled:
                        total = _ns(profile.step_seconds(shape))
                        host_part = _ns(profile.host_seconds(len(plan.scheduled)))
                        host += host_part
                        start = max(device_free, host)
                        end = device_free = start + total - host_part
                        self.busy += end - start
                    else:
                        start = end = host
                    queue.append(
                        InFlight(
                            self.step_index, plan, shape, start, end, scheduler.kv.num_used_blocks
                        )
                    )
                    self.step_index += 1
                    if len(queue) < 2:
                        continue
                elif not queue:
                    arrival = self._upcoming()
                    if arrival is None:
                        self._stall()
                        return
                    host = arrival
                    self.idle = True
                    continue
            elif not queue:
                arrival = self._upcoming()
                if arrival is None:
                    return
                host = arrival
                self.idle = True
                continue
            step = queue.popleft()
            host = max(host, step.end)
            finished = scheduler.finish_step(step.plan, step.end / NS)
            self._emit(step, finished)
            if finished and self.on_finish is not None:
                self.on_finish(finished, step.end)


QUEUE_FULL = "rejected: HTTP 503, max_num_queued_reqs reached"
PREFILL_BACKLOG = "rejected: HTTP 503, max_num_queued_tokens reached"


def turned_away(config: SimConfig, scheduler: Scheduler) -> str | None:
    """Why vLLM's API server answers a new request HTTP 503 (``AsyncLLM.check_admission``,
    vLLM 0.32 on), or ``None`` when it takes it: ``max_num_queued_reqs`` counts the unfinished
    requests (waiting or running), the new one included; ``max_num_queued_tokens`` the whole
    prompts of those not yet past their first token, the new one not included. The API server
    learns of a first or last token when its output reaches it; here, as the engine has them
    when it first sees the new request (the same where the server adds no way back)."""
    waiting, running = scheduler.waiting, scheduler.running
    limit = config.max_num_queued_reqs
    if limit is not None and len(waiting) + len(running) + 1 > limit:
        return QUEUE_FULL
    limit = config.max_num_queued_tokens
    if limit is not None:
        backlog = sum(r.prompt for r in waiting if not r.num_output)
        backlog += sum(r.prompt for r in running if not r.num_output)
        if backlog >= limit:
            return PREFILL_BACKLOG
    return None


def _ready_times(requests: list[SimRequest], path: ServerPath) -> list[int]:
    """When the scheduler sees each request, sent at its arrival (:meth:`ServerPath.ready`:
    the server's front end takes them one by one)."""
    ready: list[int] = []
    previous: int | None = None
    for request in requests:
        previous = path.ready(_ns(request.arrival_s), request.prompt, previous)
        ready.append(previous)
    return ready


def _stall_reason(scheduler: Scheduler) -> str:
    if not scheduler.waiting:
        return f"{len(scheduler.running)} running request(s) can never be scheduled"
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
