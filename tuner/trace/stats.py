"""What a trace asks of a server: rate, burstiness, lengths, offered load, prefix reuse."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from prefill_tuner.objectives.percentiles import summarize
from prefill_tuner.trace.classes import class_counts
from prefill_tuner.trace.model import Trace

TOKEN_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class TraceStats:
    """Summary statistics of a trace (definitions as in docs/traces.md)."""

    requests: int
    duration_s: float
    """Last arrival minus first arrival."""
    mean_rate: float
    """(requests − 1) / duration: arrivals per second between the first and the last."""
    index_of_dispersion: float
    """Variance / mean of request counts in 1-second bins: 1 for Poisson, ≫ 1 when bursty."""
    max_per_second: int
    """Most requests arriving in one 1-second bin."""
    prompt_tokens: dict[str, float]
    """mean, p50, p90, p99, max of prompt lengths."""
    output_tokens: dict[str, float]
    """mean, p50, p90, p99, max of output lengths."""
    prompt_tokens_per_s: float
    """Offered prompt tokens per second over the duration."""
    output_tokens_per_s: float
    """Offered output tokens per second over the duration."""
    prefix_blocks: int
    """Prefix blocks over all requests (0 when the trace has none)."""
    prefix_reuse: float | None
    """Share of prefix blocks already seen in an earlier request: an upper bound on the
    prefix-cache hit rate with an unbounded cache. ``None`` when the trace has no prefix ids."""
    classes: dict[str, int] = field(default_factory=dict)
    """Requests per traffic class (empty when no request has a class)."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def trace_stats(trace: Trace) -> TraceStats:
    """Compute :class:`TraceStats`; the trace must hold at least one request."""
    requests = trace.requests
    arrivals = np.fromiter((r.arrival_s for r in requests), dtype=float, count=len(requests))
    prompts = np.fromiter((r.prompt_tokens for r in requests), dtype=float, count=len(requests))
    outputs = np.fromiter((r.output_tokens for r in requests), dtype=float, count=len(requests))
    duration = float(arrivals[-1] - arrivals[0]) if len(arrivals) else 0.0
    # Requests per one-second bin, empty bins included, without allocating a bin per second
    # (a trace may span 10^12 seconds).
    _, counts = np.unique(np.floor(arrivals - arrivals[0]), return_counts=True)
    bins = math.floor(duration) + 1
    mean = len(requests) / bins
    dispersion = float(max(float((counts.astype(float) ** 2).sum()) / bins - mean**2, 0.0) / mean)
    seen: set[int] = set()
    total_blocks = reused = 0
    for request in requests:
        for block in request.prefix_blocks:
            total_blocks += 1
            if block in seen:
                reused += 1
            else:
                seen.add(block)
    per_second = duration if duration > 0 else float("nan")
    return TraceStats(
        requests=len(requests),
        duration_s=duration,
        mean_rate=(len(requests) - 1) / per_second if duration > 0 else float("nan"),
        index_of_dispersion=dispersion,
        max_per_second=int(counts.max()),
        prompt_tokens=summarize(prompts, TOKEN_PERCENTILES),
        output_tokens=summarize(outputs, TOKEN_PERCENTILES),
        prompt_tokens_per_s=float(prompts.sum()) / per_second,
        output_tokens_per_s=float(outputs.sum()) / per_second,
        prefix_blocks=total_blocks,
        prefix_reuse=reused / total_blocks if total_blocks else None,
        classes=class_counts(trace),
    )


def peak_in_flight(trace: Trace, seconds_per_output_token: float) -> int:
    """The most requests in flight at once if each, from its arrival, streamed its output at
    ``seconds_per_output_token`` (a TPOT limit) and took no other time: the decode batch of
    the trace's busiest moment, a burst's. A server meeting that TPOT limit that admits fewer
    requests at once keeps the rest of a burst waiting for a slot (0 for an empty trace)."""
    if not trace.requests:
        return 0
    arrivals = np.fromiter((r.arrival_s for r in trace.requests), dtype=float)
    outputs = np.fromiter((max(r.output_tokens, 1) for r in trace.requests), dtype=float)
    order = np.argsort(arrivals, kind="stable")
    starts = arrivals[order]
    ends = np.sort(starts + outputs[order] * seconds_per_output_token)
    # In flight at the i-th arrival: the i + 1 arrived so far, less those already done.
    done = np.searchsorted(ends, starts, side="right")
    return int((np.arange(1, len(starts) + 1) - done).max())
