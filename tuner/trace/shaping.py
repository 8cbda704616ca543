"""Shaping a trace to what one server can be asked to serve: window, rate, length, count.

The options are part of a trace's identity (a stored trial records them), so they are a
pydantic model with every field documented. Every request that shaping drops or clips is
counted in the trace's adjustments.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prefill_tuner.defaults import MAX_SEED
from prefill_tuner.errors import TraceError
from prefill_tuner.search_spaces.space import MAX_ENGINE_INT
from prefill_tuner.trace.classes import assign_classes, canonical_classes, parse_classes
from prefill_tuner.trace.model import Adjustment, Request, Trace
from prefill_tuner.trace.readers import MAX_TIMESTAMP

MAX_ARRIVAL_S = MAX_TIMESTAMP / 1000
"""The latest arrival a shaped trace may hold, as the readers' (native timestamps: ms)."""
MAX_RATE_SCALE = 10_000.0
"""The largest rate multiplier: 10,000× a trace's rate turns a day into nine seconds."""
MAX_QUANTUM_S = 86_400.0
"""The coarsest timestamp a trace is dequantized over: a day."""


class ShapeOptions(BaseModel):
    """How to shape a trace. Applied in the order of the fields below; the last,
    ``max_concurrency``, is how the trace is replayed (the engines apply it), not a change to
    its requests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The first paragraph of each docstring is its option's help (tune run --help).
    classes: str | None = None
    """Traffic classes by prompt tokens (both ends inclusive), e.g.
    interactive=..1024,longdoc=8192.. (overrides the trace's 'class' field); SLOs may then name
    one: --slo p99_ttft[interactive]=500ms.

    A request in no band gets no class. Stored in one canonical spelling. ``None``: the
    file's classes."""

    dequantize_s: float | Literal["auto"] | None = None
    """Spread coarse timestamps with uniform jitter over a quantum: seconds, or 'auto' (median
    gap between timestamps).

    Every arrival gets uniform jitter in [0, q) seconds (the true arrival lies inside its
    quantum), then the trace is re-sorted; ``"auto"`` takes q as the median gap between
    distinct timestamps (about 3 s in Mooncake). ``None``: off."""
    jitter_seed: int = Field(default=0, ge=0, le=MAX_SEED)
    """Seed for ``dequantize_s`` (the same options give the same arrivals)."""
    start_s: float = Field(default=0.0, ge=0)
    """Window start, seconds from trace start (later arrivals are kept, re-based to 0)."""
    duration_s: float | None = Field(default=None, gt=0)
    """Window length in seconds.

    ``None``: to the end."""
    rate_scale: float = Field(default=1.0, gt=0, le=MAX_RATE_SCALE)
    """Multiply the arrival rate (0.1 = 10× slower, 2 = twice as fast)."""
    max_model_len: int | None = Field(default=None, ge=2)
    """Clip or drop requests whose prompt + output exceed this."""
    over_length: Literal["clip", "drop"] = "clip"
    """clip or drop requests longer than ``max_model_len``.

    ``clip`` shortens the prompt (keeping its leading prefix blocks) and, only if needed, the
    output; ``drop`` removes them."""
    max_requests: int | None = Field(default=None, ge=1)
    """Keep only the first N requests."""
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_ENGINE_INT)
    """Closed-loop load, as vllm bench serve --max-concurrency: at most N requests in flight; a
    request whose arrival has come waits until one finishes, and is sent then, in arrival
    order (TTFT and E2E latency count from its send).

    In flight: sent, last token not yet delivered. The trace's arrival times stay as they are:
    the engines apply the limit as they replay it (the simulator, with replicas over all of
    them; the real replay's client). ``None``: open loop, every request sent at its arrival."""

    @field_validator("dequantize_s", mode="before")
    @classmethod
    def _quantum_text(cls, value: object) -> object:
        """A quantum as text (a flag, a config file): 'auto' or seconds."""
        if not isinstance(value, str) or value == "auto":
            return value
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(f"expected seconds or 'auto', got {value!r}") from None
        if not math.isfinite(seconds):
            raise ValueError(f"{value} is not a finite number of seconds")
        return seconds

    @field_validator("classes")
    @classmethod
    def _canonical_classes(cls, value: str | None) -> str | None:
        return None if value is None else canonical_classes(value)

    @model_validator(mode="after")
    def _check_quantum(self) -> ShapeOptions:
        if isinstance(self.dequantize_s, float) and not (
            math.isfinite(self.dequantize_s) and 0 < self.dequantize_s <= MAX_QUANTUM_S
        ):
            raise ValueError(
                f"dequantize_s must be a positive number of seconds up to {MAX_QUANTUM_S:g} "
                "(a day), or 'auto'"
            )
        return self


def shape(trace: Trace, options: ShapeOptions) -> Trace:
    """Apply ``options`` to ``trace``; raises :class:`TraceError` if nothing is left."""
    if options.classes is not None:
        trace = assign_classes(trace, parse_classes(options.classes))
    if options.dequantize_s is not None:
        trace = dequantize(trace, options.dequantize_s, seed=options.jitter_seed)
    if options.start_s > 0 or options.duration_s is not None:
        trace = window(trace, options.start_s, options.duration_s)
    if options.rate_scale != 1.0:
        trace = scale_rate(trace, options.rate_scale)
    if options.max_model_len is not None:
        trace = limit_length(trace, options.max_model_len, options.over_length)
    if options.max_requests is not None:
        trace = head(trace, options.max_requests)
    if not trace.requests:
        raise TraceError(
            "shaping left no requests (check the window and length limits)",
            path=trace.source.path if trace.source else None,
        )
    return trace


def detect_quantum(trace: Trace) -> float:
    """The median gap between distinct arrival times: the timestamps' resolution."""
    distinct = np.unique(np.fromiter((r.arrival_s for r in trace.requests), dtype=float))
    gaps = np.diff(distinct)
    return float(np.median(gaps)) if gaps.size else 0.0


def dequantize(trace: Trace, quantum_s: float | Literal["auto"], *, seed: int = 0) -> Trace:
    """Add seeded uniform jitter in [0, quantum) to every arrival, then sort stably."""
    quantum = detect_quantum(trace) if quantum_s == "auto" else float(quantum_s)
    if quantum <= 0:
        return trace
    rng = np.random.default_rng(seed)
    jitter = rng.uniform(0.0, quantum, size=len(trace.requests))
    moved = [
        replace(request, arrival_s=request.arrival_s + float(offset))
        for request, offset in zip(trace.requests, jitter, strict=True)
    ]
    moved.sort(key=lambda request: request.arrival_s)
    note = Adjustment(
        "jittered",
        f"arrivals spread uniformly over their {quantum:g} s quantum (seed {seed})",
        len(moved),
    )
    return trace.with_requests(tuple(moved), note)


def window(trace: Trace, start_s: float, duration_s: float | None) -> Trace:
    """Requests arriving in [start, start + duration), re-based so the window starts at 0."""
    end = math.inf if duration_s is None else start_s + duration_s
    kept = tuple(
        replace(r, arrival_s=r.arrival_s - start_s)
        for r in trace.requests
        if start_s <= r.arrival_s < end
    )
    span = f"[{start_s:g} s, {end:g} s)"
    note = Adjustment("dropped", f"outside the time window {span}", len(trace) - len(kept))
    return trace.with_requests(kept, note)


def scale_rate(trace: Trace, factor: float) -> Trace:
    """Multiply the arrival rate by ``factor`` (arrival times are divided by it); refused when
    an arrival would come later than a trace may hold (a tiny factor: ``1e-300``)."""
    last = max((r.arrival_s for r in trace.requests), default=0.0) / factor
    if not last <= MAX_ARRIVAL_S:
        raise TraceError(
            f"`rate_scale` {factor:g}: the last arrival would come at {last:.3g} s, later than "
            f"a trace may hold ({MAX_ARRIVAL_S:.0e} s); give a larger factor",
            path=trace.source.path if trace.source else None,
        )
    return trace.with_requests(
        tuple(replace(r, arrival_s=r.arrival_s / factor) for r in trace.requests)
    )


def limit_length(trace: Trace, max_model_len: int, policy: Literal["clip", "drop"]) -> Trace:
    """Make every request fit ``prompt + output ≤ max_model_len``, by clipping or dropping."""
    kept: list[Request] = []
    changed = 0
    for request in trace.requests:
        if request.prompt_tokens + request.output_tokens <= max_model_len:
            kept.append(request)
            continue
        changed += 1
        if policy == "clip":
            kept.append(clip(request, max_model_len))
    reason = f"prompt + output longer than max_model_len {max_model_len}"
    return trace.with_requests(
        tuple(kept), Adjustment("clipped" if policy == "clip" else "dropped", reason, changed)
    )


def clip(request: Request, max_model_len: int) -> Request:
    """Shorten the prompt's tail to fit (its prefix blocks stay a leading prefix); shorten the
    output only when even a 1-token prompt would not fit."""
    output = min(request.output_tokens, max_model_len - 1)
    prompt = min(request.prompt_tokens, max_model_len - output)
    blocks = request.prefix_blocks
    if blocks and request.prefix_block_size:
        blocks = blocks[: -(-prompt // request.prefix_block_size)]
    return replace(request, prompt_tokens=prompt, output_tokens=output, prefix_blocks=blocks)


def head(trace: Trace, max_requests: int) -> Trace:
    """The first ``max_requests`` requests."""
    kept = trace.requests[:max_requests]
    note = Adjustment(
        "dropped", f"beyond the first {max_requests} requests", len(trace) - len(kept)
    )
    return trace.with_requests(kept, note)


def busiest_window(trace: Trace, duration_s: float) -> tuple[float, Trace]:
    """The ``duration_s`` seconds of ``trace`` with the most work arriving (prompt plus output
    tokens of the requests arriving in it; a window starts at an arrival), re-based to start
    at 0, and where it starts. The whole trace when it is no longer than that."""
    arrivals = np.fromiter((r.arrival_s for r in trace.requests), dtype=float)
    work = np.fromiter((r.prompt_tokens + r.output_tokens for r in trace.requests), dtype=float)
    if not arrivals.size or arrivals[-1] - arrivals[0] < duration_s:
        return 0.0, trace
    order = np.argsort(arrivals, kind="stable")
    arrivals, work = arrivals[order], work[order]
    done = np.concatenate(([0.0], np.cumsum(work)))
    ends = np.searchsorted(arrivals, arrivals + duration_s, side="left")
    totals = done[ends] - done[np.arange(arrivals.size)]
    start = float(arrivals[int(np.argmax(totals))])
    return start, window(trace, start, duration_s)
