"""What a trial's run looked like over time, small enough to keep with the trial.

The report's "baseline vs recommended" plots need more than percentiles: the latency
distributions, and the picture the chunked-prefill lesson asks for, the step latency and each
streaming request's inter-token latency around the moment the trace's longest prompt arrives
(it shows whether the blocking spike was flattened), and the engine's load over the run. A
:func:`build_timeline` document holds exactly that, built the same way for every engine from
its request records and its step records (the simulator's own, or a real server's per-step
log, :func:`real_steps`): about 15 KB of JSON per trial (measured on real and simulated
trials), bounded by the constants below whatever the trace's length. Real trials store it with
their metrics (``details.timeline``); simulated ones are simulated again when a report needs
them (the simulator is deterministic, and a study has hundreds of them:
``prefill_tuner.diagnosis.runs.trial_view`` keeps the records and steps it is built from).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefill_tuner.engines.sim.loop import StepRecord
from prefill_tuner.objectives.metrics import RequestRecord
from prefill_tuner.trace.model import Trace

TIMELINE_VERSION = 1
QUANTILE_POINTS = 101
"""Points of each latency distribution kept (every percentile, 0 to 100): a CDF drawn from
them is exact to the percent, and costs 101 numbers whatever the number of requests."""
STEPS_AROUND = 40
"""Steps kept before the longest prompt's arrival and after its first token: enough to see
the steady state on both sides of the disturbance."""
MAX_WINDOW_STEPS = 1000
"""At most this many steps in the window (a prompt that waits for minutes would otherwise
bring every step of those minutes)."""
MAX_STREAMS = 12
"""Streaming requests whose inter-token latency is drawn: the ones with the most tokens in
the window (a plot with more lines is unreadable)."""
LOAD_POINTS = 300
"""Samples of the load over the whole run (KV use, running, waiting)."""


@dataclass(frozen=True)
class Step:
    """One engine step, as both engines report it (the timeline and the diagnosis read it)."""

    start_s: float | None
    """On the run's clock (0: the first request's scheduled arrival); ``None``: not placed."""
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    running: int | None
    """Requests in the step (the simulator: running after it)."""
    waiting: int | None
    """Requests waiting after it (``None``: the engine does not say)."""
    kv_usage: float | None
    """Share of the KV pool in use (0-1)."""
    preempted: tuple[str, ...] = ()
    """Requests preempted in it."""
    index: int = 0
    """Its number in the engine's step sequence."""
    prefill_chunks: dict[str, int] | None = None
    """Request id → prompt tokens it prefilled in this step; ``None``: not known."""

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


def sim_steps(records: Sequence[StepRecord], usable_blocks: int) -> list[Step]:
    """The simulator's step records as :class:`Step`."""
    return [sim_step(r, usable_blocks) for r in records]


def sim_step(
    record: StepRecord, usable_blocks: int, prefill_chunks: dict[str, int] | None = None
) -> Step:
    """One simulator step record as a :class:`Step` (with its prefill chunks, if known)."""
    return Step(
        start_s=record.start_s,
        duration_s=record.duration_s,
        prefill_tokens=record.prefill_tokens,
        decode_tokens=record.decode_tokens,
        running=record.running_after,
        waiting=record.waiting_after,
        kv_usage=record.kv_blocks_in_use / usable_blocks if usable_blocks else None,
        preempted=record.preempted,
        index=record.index,
        prefill_chunks=prefill_chunks,
    )


def real_steps(logged: Sequence[dict[str, Any]], started_unix_s: float) -> list[Step]:
    """A real server's per-step log lines (:func:`~prefill_tuner.engines.real.signals.
    parse_iteration_log`) as :class:`Step`, on the replay's clock (a line is logged as its
    step ends; a step starts no earlier than the previous line); lines without a time are
    left out."""
    steps: list[Step] = []
    previous_end = -np.inf
    for line in logged:
        if line.get("logged_at_s") is None:
            continue
        duration = float(line["duration_s"])
        end = float(line["logged_at_s"]) - started_unix_s
        # A step starts once the one before it is logged: vLLM's step timer leaves out
        # scheduling and output processing, so end − duration may fall before that.
        start = max(end - duration, previous_end)
        previous_end = end
        steps.append(
            Step(
                start_s=start,
                duration_s=duration,
                prefill_tokens=int(line["prefill_tokens"]),
                decode_tokens=int(line["decode_tokens"]),
                running=int(line["prefill_requests"]) + int(line["decode_requests"]),
                waiting=None,
                kv_usage=line.get("kv_usage"),
                index=int(line.get("step", len(steps))),
            )
        )
    return steps


def build_timeline(
    trace: Trace, records: Sequence[RequestRecord], steps: Sequence[Step]
) -> dict[str, Any]:
    """The timeline document of one run (module docs); JSON-ready."""
    return {
        "version": TIMELINE_VERSION,
        "quantiles": _quantiles(records),
        "window": _window(trace, records, steps),
        "load": _load(records, steps),
        "preemptions": sum(len(step.preempted) for step in steps),
    }


def _round(values: Sequence[float] | np.ndarray) -> list[float]:
    return [round(float(v), 6) for v in values]


def _quantiles(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    ttft, tpot, itl = [], [], []
    for record in records:
        times = np.asarray(record.token_times_s, dtype=float)
        if not record.completed or times.size == 0:
            continue
        ttft.append(times[0] - record.sent_s)
        if times.size > 1:
            gaps = np.diff(times)
            tpot.append(float(gaps.mean()))
            itl.extend(gaps.tolist())
    levels = np.linspace(0.0, 1.0, QUANTILE_POINTS)
    return {
        name: _round(np.quantile(values, levels)) if values else []
        for name, values in (("ttft_s", ttft), ("tpot_s", tpot), ("itl_s", itl))
    }


def _window(
    trace: Trace, records: Sequence[RequestRecord], steps: Sequence[Step]
) -> dict[str, Any] | None:
    """Steps and streams around the arrival of the longest prompt (the first of the
    longest), and that prompt's life: its send (``arrival_s``), when the engine's scheduler
    first had it (``seen_s``), when the first step that scheduled any of it started
    (``admitted_s``) and its first token (``first_token_s``); each ``None`` where unknown (a
    real server says neither when it saw a request nor which requests a step prefilled, and
    timelines stored before these two were kept lack their keys: read them as ``None``)."""
    if not trace.requests or not records:
        return None
    index = max(range(len(trace.requests)), key=lambda i: (trace.requests[i].prompt_tokens, -i))
    long_request, long_record = trace.requests[index], records[index]
    arrival = long_record.sent_s
    first_token = float(long_record.token_times_s[0]) if len(long_record.token_times_s) else None
    starts = np.array([step.start_s for step in steps])
    ends = starts + np.array([step.duration_s for step in steps])
    if len(steps):
        first = max(int(np.searchsorted(ends, arrival)) - STEPS_AROUND, 0)
        anchor = first_token if first_token is not None else arrival
        last = min(int(np.searchsorted(starts, anchor, side="right")) + STEPS_AROUND, len(steps))
        last = min(last, first + MAX_WINDOW_STEPS)
        start_s, end_s = float(starts[first]), float(ends[last - 1]) if last > first else arrival
        window_steps = steps[first:last]
    else:
        start_s = arrival - 1.0
        end_s = (first_token if first_token is not None else arrival) + 1.0
        window_steps = []
    streams = []
    for number, record in enumerate(records):
        times = np.asarray(record.token_times_s, dtype=float)
        if number == index or times.size < 2 or times[0] >= arrival:
            continue
        inside = (times[1:] >= start_s) & (times[1:] <= end_s)
        if inside.sum() >= 2:
            streams.append(
                (int(inside.sum()), record.id, times[1:][inside], np.diff(times)[inside])
            )
    streams.sort(key=lambda s: -s[0])
    admitted = _admitted(long_request.id, steps)
    return {
        "long_prompt": {
            "id": long_request.id,
            "prompt_tokens": long_request.prompt_tokens,
            "arrival_s": round(arrival, 6),
            "seen_s": None if long_record.seen_s is None else round(long_record.seen_s, 6),
            "admitted_s": None if admitted is None else round(admitted, 6),
            "first_token_s": None if first_token is None else round(first_token, 6),
        },
        "start_s": round(start_s, 6),
        "end_s": round(end_s, 6),
        "steps": {
            "start_s": _round([_start(s) for s in window_steps]),
            "duration_s": _round([s.duration_s for s in window_steps]),
            "prefill_tokens": [s.prefill_tokens for s in window_steps],
            "decode_tokens": [s.decode_tokens for s in window_steps],
        },
        "streams": [
            {"id": rid, "token_s": _round(at), "itl_s": _round(gaps)}
            for _, rid, at, gaps in streams[:MAX_STREAMS]
        ],
    }


def _admitted(request_id: str, steps: Sequence[Step]) -> float | None:
    """When the first step that scheduled any of the request's prompt started (``None``:
    none did, or the steps do not say which requests they prefilled, as a real server's log
    does not)."""
    for step in steps:
        if step.prefill_chunks and request_id in step.prefill_chunks:
            return _start(step)
    return None


def _start(step: Step) -> float:
    """A step's start: the timeline is drawn from placed steps only (both engines place
    theirs; a step log read without its clock is diagnosed, not drawn)."""
    if step.start_s is None:
        raise ValueError(f"step {step.index} has no start time: not a timeline step")
    return float(step.start_s)


def _load(records: Sequence[RequestRecord], steps: Sequence[Step]) -> dict[str, Any]:
    """KV use, running and waiting requests and preemptions so far (the engine's steps say
    them; a real server's log does not: zero) sampled over the run. Running and waiting are the
    engine's own counts where its steps say them; otherwise from the requests: decoding
    (first token seen, last not yet) and waiting for their first token."""
    finished = [float(r.token_times_s[-1]) for r in records if len(r.token_times_s)] + [
        _start(s) + s.duration_s for s in steps[-1:]
    ]
    end = max(finished, default=0.0)
    if end <= 0:
        empty: dict[str, Any] = {"t_s": [], "kv_usage": [], "running": [], "waiting": []}
        return {**empty, "preempted": [], "source": "none"}
    grid = np.linspace(0.0, end, LOAD_POINTS)
    result: dict[str, Any] = {"t_s": _round(grid)}
    starts = np.array([s.start_s for s in steps])
    at = np.searchsorted(starts, grid, side="right") - 1  # the step running at each sample

    def sampled(values: list[Any]) -> list[Any]:
        return [values[i] if i >= 0 else None for i in at]

    preempted = np.cumsum([len(s.preempted) for s in steps]).tolist()
    result["preempted"] = [0 if v is None else int(v) for v in sampled(preempted)]
    kv = [s.kv_usage for s in steps]
    result["kv_usage"] = [None if v is None else round(float(v), 4) for v in sampled(kv)]
    if steps and all(s.waiting is not None for s in steps):
        result["running"] = sampled([s.running for s in steps])
        result["waiting"] = sampled([s.waiting for s in steps])
        result["source"] = "engine"
    else:
        sent = np.array([r.sent_s for r in records])
        first = np.array(
            [float(r.token_times_s[0]) if len(r.token_times_s) else np.inf for r in records]
        )
        last = np.array(
            [float(r.token_times_s[-1]) if len(r.token_times_s) else np.inf for r in records]
        )
        result["running"] = [int(((first <= t) & (t < last)).sum()) for t in grid]
        result["waiting"] = [int(((sent <= t) & (t < first)).sum()) for t in grid]
        result["source"] = "requests"
    return result


__all__ = [
    "Step",
    "build_timeline",
    "real_steps",
    "sim_steps",
]
