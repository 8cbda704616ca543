"""The simulation loop's fast path (``docs/simulator.md``, "Speed"): when the scheduler finds
a run of steps of fixed composition (:mod:`.steady_runs`), time its steps a block at a time
and apply them in one go, in either loop (synchronous, or two batches in flight), exactly as
stepping through them would (``tests/test_sim_engine.py`` checks every kind of run both ways).

:class:`FastForward` is the half of :class:`~prefill_tuner.engines.sim.loop._Loop` that does
it; the loop proper steps one ``schedule()`` at a time, as vLLM's ``EngineCore`` does, and
calls into it where a run can form.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from itertools import accumulate, repeat
from operator import add, sub, truediv

import numpy as np

from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.request import SimRequest
from prefill_tuner.engines.sim.scheduler import Scheduler, SteadyRun, StepPlan
from prefill_tuner.engines.sim.steps import NS, InFlight, StepRecord, shape_with_chunks
from prefill_tuner.engines.sim.steps import ticks as _ns

MIN_RUN = 2
"""Shorter runs of steps of fixed composition are scheduled one by one."""

SCALAR_STEPS = 16
"""A stretch of plain decode steps likely to be cut (by an arrival) within this many steps is
timed without numpy (whose fixed cost per call is that of many steps); a longer one a growing
chunk at a time."""

DURATION_CHUNK = 32
"""Step durations computed at once after those: at least this many, or the steps the next
arrival likely leaves room for and a quarter more (then 4× as many each time)."""


class FastForward:
    """Timing and applying runs of fixed composition, on the loop's state (the attributes
    below are :class:`~prefill_tuner.engines.sim.loop._Loop`'s)."""

    scheduler: Scheduler
    profile: StepModel
    on_step: Callable[[StepRecord], None] | None
    on_finish: Callable[[list[SimRequest], int], None] | None
    step_index: int
    peak_blocks: int
    busy: int

    def _upcoming(self) -> int | None:
        raise NotImplementedError  # the loop's

    def _emit(self, step: InFlight, finished: list[SimRequest]) -> None:
        raise NotImplementedError  # the loop's

    def _run_durations(self, run: SteadyRun, room: int | None) -> Iterator[tuple[list[int], int]]:
        """The steps of ``run``, a block at a time: their total (device and host) times in
        ticks, as stepping would compute them (the same floats), and the requests each of
        the block's steps schedules. ``room``: the ticks until the run must stop (the next
        arrival), if known: how many steps are likely wanted."""
        if not run.chunks:
            return self._decode_durations(run, room)
        return self._chunk_durations(run, room)

    def _decode_durations(
        self, run: SteadyRun, room: int | None
    ) -> Iterator[tuple[list[int], int]]:
        """A plain decode run's steps: a stretch at a time between finishes (the batch shrinks
        by the requests whose last step has passed)."""
        count = len(run.decodes)
        context = sum(r.num_computed + 1 for r in run.decodes)
        leaving: dict[int, list[int]] = {}
        """Step → the requests first not scheduled in it: how many, their contexts' sum."""
        for request, last in zip(run.decodes, run.lasts, strict=True):
            if last < run.steps:
                gone = leaving.setdefault(last, [0, 0])
                gone[0] += 1
                gone[1] += request.num_computed + 1
        start = 0
        for stop in [*sorted(leaving), run.steps]:
            if stop > start:
                for block in self._decode_stretch(
                    count, context + count * start, stop - start, room
                ):
                    yield block, count
                    if room is not None:
                        room -= sum(block)
            if stop in leaving:
                count -= leaving[stop][0]
                context -= leaving[stop][1]
            start = stop

    def _decode_stretch(
        self, count: int, context: int, steps: int, room: int | None
    ) -> Iterator[list[int]]:
        """``steps`` plain decode steps of ``count`` requests whose contexts sum to ``context``
        in the first, a block at a time. When the first step's time says that fewer than
        :data:`SCALAR_STEPS` fit in ``room``, those are timed without numpy (whose fixed cost
        is that of many steps); the rest a growing chunk at a time by the profile's
        ``decode_run_seconds``."""
        (first,) = self.profile.decode_steps_seconds(count, context, 1)
        ticks = _ns(first)
        yield [ticks]
        done = 1
        likely = steps if room is None else min(steps, room // max(ticks, 1) + 1)
        if likely <= SCALAR_STEPS and steps > 1:
            scalar = min(SCALAR_STEPS, steps) - 1
            yield list(map(_ns, self.profile.decode_steps_seconds(count, context + count, scalar)))
            done += scalar
        chunk = max(DURATION_CHUNK, likely + likely // 4 - done)
        while done < steps:
            size = min(chunk, steps - done)
            seconds = self.profile.decode_run_seconds(count, context + count * done, size)
            yield np.rint(seconds * NS).astype(np.int64).tolist()
            done, chunk = done + size, chunk * 4

    def _chunk_durations(self, run: SteadyRun, room: int | None) -> Iterator[tuple[list[int], int]]:
        """The steps of a run with prefill chunks, shaped as :func:`_shape` shapes them, a
        block at a time as a decode stretch's (:meth:`_decode_stretch`): the first step
        alone, the next few without numpy (the profile's ``chunk_steps_seconds``) when an
        arrival is likely to cut the run within :data:`SCALAR_STEPS`, the rest a growing
        chunk at a time by its ``chunk_run_seconds`` (the same floats)."""
        count = len(run.decodes)
        context = sum(r.num_computed + 1 for r in run.decodes)
        requests = len(run.order)
        chunks = [(r.num_computed, chunk) for r, chunk in run.chunks]
        profile, steps = self.profile, run.steps
        (first,) = profile.chunk_steps_seconds(count, requests, context, chunks, 1)
        ticks = _ns(first)
        yield [ticks], requests
        done = 1
        likely = steps if room is None else min(steps, room // max(ticks, 1) + 1)
        if likely <= SCALAR_STEPS and steps > 1:
            done = min(SCALAR_STEPS, steps)
            now = [(before + chunk, chunk) for before, chunk in chunks]
            singles = profile.chunk_steps_seconds(count, requests, context + count, now, done - 1)
            yield list(map(_ns, singles)), requests
        size = max(DURATION_CHUNK, likely + likely // 4 - done)
        while done < steps:
            size = min(size, steps - done)
            now = [(before + chunk * done, chunk) for before, chunk in chunks]
            seconds = profile.chunk_run_seconds(count, requests, context + count * done, now, size)
            yield np.rint(seconds * NS).astype(np.int64).tolist(), requests
            done, size = done + size, size * 4

    def _sync_steady_run(self, clock: int, arrival: int | None) -> int | None:
        """Apply the steps of fixed composition that start now (:meth:`Scheduler.steady_run`),
        up to the next arrival, in one go; returns the clock after them, or ``None`` when
        fewer than :data:`MIN_RUN`."""
        scheduler = self.scheduler
        run = scheduler.steady_run(past_finishes=self.on_finish is None)
        if run is None or run.steps < MIN_RUN:
            return None
        starts: list[int] = []
        ends: list[int] = []
        start = clock
        room = None if arrival is None else arrival - clock
        for block, _ in self._run_durations(run, room):
            marks = list(accumulate(block, initial=start))
            begins = marks[:-1]
            if arrival is not None and begins[-1] >= arrival:
                # A step starting at or after the next arrival would admit it.
                cut = bisect_left(begins, arrival)
                starts += begins[:cut]
                ends += marks[1 : cut + 1]
                break
            starts += begins
            ends += marks[1:]
            start = marks[-1]
        steps = len(starts)
        if steps < MIN_RUN:
            return None
        records = _RunRecords(run, steps) if self.on_step is not None else None
        times = list(map(truediv, ends, repeat(NS)))
        used, finished = scheduler.apply_steady_run(run, steps, times)
        self.peak_blocks = max(self.peak_blocks, max(used))
        self._emit_run(records, starts, ends, used, steps)
        self.busy += ends[-1] - starts[0]  # back to back
        if finished and self.on_finish is not None:
            self.on_finish(finished, ends[-1])  # (at the last step: the run ends with them)
        return ends[-1]

    def _async_steady_run(self, queue: deque[InFlight], host: int) -> tuple[int, int] | None:
        """The async counterpart: with one step in flight (every decoding request's next
        token, and the prefill's chunk before), schedule the steps of fixed composition that
        follow, applying each step's predecessor as the engine core would. Returns the host
        clock and the device's free time after them, or ``None`` when fewer than
        :data:`MIN_RUN`."""
        scheduler, profile = self.scheduler, self.profile
        arrival = self._upcoming()
        previous = queue[0]
        if arrival is not None and arrival <= previous.end:
            return None  # the run's first step starts after it: a run of one step
        run = scheduler.steady_run(past_finishes=self.on_finish is None)
        if run is None or run.steps < MIN_RUN:
            return None
        device_free = previous.end
        starts: list[int] = []
        ends: list[int] = []
        counted, host_part = -1, 0
        room = None if arrival is None else arrival - host
        # Step k launches once the host has applied step k-1's predecessor, its host part
        # done (launch = host + host part), and starts when the device is free too; the host
        # then waits for step k-1's output and applies it, at max(launch, its end), which is
        # step k's start. So each step starts max(device part, host part) after the one
        # before, and the run stops before a step whose schedule() (the host, at the start
        # of the step before) would see the arrival.
        previous_device = busy = 0
        for block, count in self._run_durations(run, room):
            if count != counted:
                counted, host_part = count, _ns(profile.host_seconds(count))
            devices = list(map(sub, block, repeat(host_part, len(block))))
            if starts:
                first = starts[-1] + max(previous_device, host_part)
            else:
                first = max(device_free, host + host_part)
            # The common case: every device part outlasts a host part, so each step starts
            # as the one before ends (the same integers, without a max and a sum per step).
            back_to_back = min(devices) >= host_part
            if back_to_back:
                begins = list(accumulate(devices[:-1], initial=first))
            else:
                gaps = map(max, devices[:-1], repeat(host_part, len(devices) - 1))
                begins = list(accumulate(gaps, initial=first))
            taken = len(begins)
            if arrival is not None and begins[-1] >= arrival:
                taken = bisect_left(begins, arrival) + 1
            del begins[taken:], devices[taken:]
            starts += begins
            if back_to_back:
                ends += begins[1:]
                ends.append(begins[-1] + devices[-1])
            else:
                ends += map(add, begins, devices)
            busy += sum(devices)
            previous_device = devices[-1]
            if arrival is not None and arrival <= starts[-1]:
                break  # the next step's schedule() would see the arrival
        host, device_free = starts[-1], ends[-1]
        steps = len(starts)
        if steps < MIN_RUN:
            return None
        queue.popleft()
        self.busy += busy  # (each step's end less its start)
        records = _RunRecords(run, steps) if self.on_step is not None else None
        self._emit(previous, [])  # (nobody's last token was in it)
        arrived = [previous.end, *ends[:-1]]
        chunks = [(r.num_computed + chunk * (steps - 1), chunk) for r, chunk in run.chunks]
        used, _ = scheduler.apply_steady_run(run, steps, list(map(truediv, arrived, repeat(NS))))
        self.peak_blocks = max(self.peak_blocks, max(used))
        self._emit_run(records, starts, ends, used, steps - 1)
        last = _last_step(run, steps)
        decodes = len(last.scheduled) - len(chunks)
        # (What its record says of it; its time is known.)
        shape = shape_with_chunks(decodes, len(last.scheduled), 0, chunks)
        queue.append(InFlight(self.step_index, last, shape, starts[-1], ends[-1], used[-1]))
        self.step_index += 1
        return host, device_free

    def _emit_run(
        self,
        records: _RunRecords | None,
        starts: list[int],
        ends: list[int],
        used: list[int],
        steps: int,
    ) -> None:
        """The per-step records of a fast-forwarded run's first ``steps`` steps, as stepping
        would have produced them."""
        first = self.step_index
        self.step_index += steps
        if self.on_step is None or records is None:
            return
        on_step, waiting = self.on_step, len(self.scheduler.waiting)
        prefill_tokens, chunks = records.run.prefill_tokens, len(records.run.chunks)
        taken = zip(starts[:steps], ends[:steps], used[:steps], strict=True)
        for offset, (start, end, blocks) in enumerate(taken):
            scheduled, finished = records.step_ids(offset)
            on_step(
                StepRecord(
                    index=first + offset,
                    start_s=start / NS,
                    duration_s=(end - start) / NS,
                    scheduled=scheduled,
                    admitted_cached_tokens={},
                    prefill_tokens=prefill_tokens,
                    decode_tokens=len(scheduled) - chunks,
                    preempted=(),
                    finished=finished,
                    running_after=len(scheduled) - len(finished),
                    waiting_after=waiting,
                    kv_blocks_in_use=blocks,
                )
            )


class _RunRecords:
    """What each step of a fast-forwarded run schedules and finishes (taken before the run
    is applied: the records are made after)."""

    def __init__(self, run: SteadyRun, steps: int) -> None:
        self.run = run
        self.scheduled: dict[SimRequest, int] = dict(run.order)
        self.finishing: dict[int, list[SimRequest]] = {}
        """Step → the requests whose last token it produces (in running order)."""
        for request, last in zip(run.decodes, run.lasts, strict=True):
            if last <= steps:
                self.finishing.setdefault(last - 1, []).append(request)
        self._ends = sorted(self.finishing)
        """The steps that finish someone, in order."""
        self._gone = 0
        """Of those, how many have had their requests dropped from ``scheduled``."""
        self._ids: dict[str, int] | None = None
        """``scheduled`` by request id, until a request leaves it."""

    def step(self, index: int) -> tuple[dict[SimRequest, int], list[SimRequest]]:
        """Step ``index``'s tokens per request and the requests it finishes; steps are asked
        for in order."""
        ends = self._ends
        while self._gone < len(ends) and ends[self._gone] < index:
            for request in self.finishing[ends[self._gone]]:
                del self.scheduled[request]
            self._gone += 1
            self._ids = None
        return self.scheduled, self.finishing.get(index, [])

    def step_ids(self, index: int) -> tuple[dict[str, int], tuple[str, ...]]:
        """:meth:`step` by request id, for a step record: the steps between two finishes
        share one dict (a record's ``scheduled`` is read, never changed)."""
        _, finished = self.step(index)
        if self._ids is None:
            self._ids = {request.id: tokens for request, tokens in self.scheduled.items()}
        return self._ids, tuple(request.id for request in finished) if finished else ()


def _last_step(run: SteadyRun, steps: int) -> StepPlan:
    """The last of a fast-forwarded run's ``steps`` steps as a plan, to be applied as any step
    in flight is: every request of the run but those whose last token an earlier step
    produced (a plain decode run goes on past finishes), each sampling unless it prefills."""
    lasts = run.lasts
    if not lasts or min(lasts) >= steps:
        scheduled = list(run.order)
    else:
        ended = zip(run.decodes, lasts, strict=True)
        gone = {id(request) for request, last in ended if last < steps}
        scheduled = [item for item in run.order if id(item[0]) not in gone]
    if not run.chunks:
        return StepPlan(scheduled=scheduled, samples=[True] * len(scheduled))
    prefilling = {id(request) for request, _ in run.chunks}
    samples = [id(request) not in prefilling for request, _ in scheduled]
    return StepPlan(scheduled=scheduled, samples=samples)
