"""Per-request latency metrics and their run summary, as ``vllm bench serve`` defines them.

Every engine (simulated or real) reports each request as a :class:`RequestRecord` (when it
was sent, when each output token arrived, how many were expected, any error) and this module
alone turns records into TTFT, TPOT, ITL and E2E statistics:

- TTFT: sent → first token. E2E latency: sent → last token.
- TPOT per request: (E2E − TTFT) / (output tokens − 1); undefined for one-token outputs,
  which are left out (and counted).
- ITL: every gap between consecutive streamed chunks, pooled over requests (tokens that
  arrived together, in one chunk, make no gap: ``vllm bench serve`` times chunks).
- A request is *completed* when it produced every expected token without error; anything
  else is *failed* and counts against the SLOs (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from prefill_tuner.objectives.percentiles import summarize

SUMMARY_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


@dataclass(slots=True)
class RequestRecord:
    """What one request experienced, in seconds on one clock."""

    id: str
    sent_s: float
    """When the request was sent (the simulator: its arrival)."""
    token_times_s: Sequence[float] | np.ndarray
    """When each output token arrived, in order."""
    expected_tokens: int
    """Output tokens asked for (``max_tokens`` with ``ignore_eos``)."""
    error: str | None = None
    """Why the request failed (rejected, timed out, server error), if it did."""
    preemptions: int = 0
    """Times the engine preempted it (the simulator; 0 where unknown)."""
    traffic_class: str | None = None
    """The request's traffic class (from the trace), so SLOs can judge each class apart."""
    seen_s: float | None = None
    """When the engine first saw the request: its scheduler had it, past the server's front
    end (the simulator fills it; ``None`` where unknown, as on a real server)."""

    @property
    def completed(self) -> bool:
        return self.error is None and len(self.token_times_s) == self.expected_tokens


@dataclass(frozen=True)
class RunMetrics:
    """Summary of one run: latency statistics over completed requests, and counts."""

    requests: int
    completed: int
    failed: int
    """Requests with an error or fewer tokens than expected: they count against the SLOs."""
    duration_s: float
    """First send to last token."""
    output_tokens: int
    request_throughput: float
    """Completed requests per second of the run."""
    output_throughput: float
    """Output tokens per second of the run (all requests)."""
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    itl_s: dict[str, float]
    e2el_s: dict[str, float]
    single_token_requests: int = 0
    """Completed one-token requests, left out of TPOT (it is undefined for them)."""
    preemptions: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    by_class: dict[str, RunMetrics] = field(default_factory=dict)
    """The same summary over each traffic class's requests alone (empty when no request has a
    class; the summaries of classes have none of their own)."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize_run(records: Sequence[RequestRecord]) -> RunMetrics:
    """Aggregate request records into :class:`RunMetrics`, over all requests and over each
    traffic class's."""
    overall = _summarize(records)
    classes: dict[str, list[RequestRecord]] = {}
    for record in records:
        if record.traffic_class is not None:
            classes.setdefault(record.traffic_class, []).append(record)
    if not classes:
        return overall
    return replace(overall, by_class={name: _summarize(own) for name, own in classes.items()})


def _summarize(records: Sequence[RequestRecord]) -> RunMetrics:
    """One summary of ``records``."""
    done = [r for r in records if r.completed]
    # All requests at once (a long simulated trace has millions of tokens): the same float
    # operations, in the same order, as request by request.
    counts = np.fromiter((len(r.token_times_s) for r in done), dtype=np.int64, count=len(done))
    # (Each request's times copied in as a slice: the simulator's are ``array('d')``, read
    # through the buffer protocol, not a float at a time; no more memory than the times.)
    times = np.empty(int(counts.sum()))
    position = 0
    for record, count in zip(done, counts.tolist(), strict=True):
        times[position : position + count] = record.token_times_s
        position += count
    sent = np.fromiter((r.sent_s for r in done), dtype=float, count=len(done))
    firsts = np.cumsum(counts) - counts
    lasts = firsts + counts - 1
    ttft = times[firsts] - sent if len(done) else np.empty(0)
    e2el = times[lasts] - sent if len(done) else np.empty(0)
    several = counts > 1
    tpot = (e2el[several] - ttft[several]) / (counts[several] - 1)
    single = int(len(done) - several.sum())
    # ITL: the gaps within each request, made in place (a long trace's token times take
    # hundreds of MB; a copy per step would double that).
    np.subtract(times[1:], times[:-1], out=times[:-1])
    kept = 0
    for first, count in zip(firsts.tolist(), counts.tolist(), strict=True):
        if count > 1:
            times[kept : kept + count - 1] = times[first : first + count - 1]
            kept += count - 1
    gaps = times[:kept]
    if kept and not gaps.all():  # tokens of one chunk: one arrival, no gap between them
        gaps = gaps[gaps > 0]
    reasons: dict[str, int] = {}
    for record in records:
        if not record.completed:
            reason = record.error or "unfinished (fewer tokens than expected)"
            reasons[reason] = reasons.get(reason, 0) + 1
    starts = [r.sent_s for r in records]
    ends = [r.token_times_s[-1] for r in records if len(r.token_times_s)]
    duration = (max(ends) - min(starts)) if ends else 0.0
    output_tokens = sum(len(r.token_times_s) for r in records)
    per_second = duration if duration > 0 else float("nan")
    return RunMetrics(
        requests=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        duration_s=duration,
        output_tokens=output_tokens,
        request_throughput=len(done) / per_second,
        output_throughput=output_tokens / per_second,
        ttft_s=summarize(ttft, SUMMARY_PERCENTILES),
        tpot_s=summarize(tpot, SUMMARY_PERCENTILES),
        itl_s=summarize(gaps, SUMMARY_PERCENTILES, reorder=True),
        e2el_s=summarize(e2el, SUMMARY_PERCENTILES),
        single_token_requests=single,
        preemptions=sum(r.preemptions for r in records),
        failure_reasons=reasons,
    )
