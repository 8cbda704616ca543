"""When no trial meets the SLOs: could any scheduler setting, and at what load would one?

Two answers, both from the simulator's step-time profile:

- **A floor no setting can beat** (:func:`latency_floor`), from two bounds, both order-free
  (they hold whatever the scheduler does first):

  - *Each request alone.* A first token cannot come sooner than the prompt's uncached tokens
    prefilled in one step of an otherwise idle engine (with step times linear in what is
    prefilled, chunking only adds steps; with measured kernels, which can be cheaper per
    token at a smaller size, one step's fixed part plus the prefill's additive work; a prefix
    is cached at best once an earlier request computed it), plus the front end's latency; a
    token after the first, sooner than a decode step of that one request alone. Over this,
    an SLO cannot be met at any load.
  - *Bursts.* Take the requests arriving in a window [t1, t2]. None of their prefill can
    start before t1 (plus the front end's latency), and prefilling them costs the engine at
    least their *work*: the part of a step's time that grows linearly with the tokens and
    query-key pairs prefilled (the profile's arithmetic; additive over requests and chunks,
    so no batching or chunking makes it smaller; a shared prefix counted once, however the
    requests sharing it are ordered). So the j-th of them to get its first token gets it no
    sooner than t1 + the j smallest works, and the j-th smallest TTFT among them is at least
    that minus t2. Windows that do not overlap give a lower bound of every order statistic
    of the trace's TTFTs, so of every percentile; the floor is the largest over window
    widths from the whole trace down to milliseconds. Over this, an SLO cannot be met at
    *this* load: the bursts queue on any setting. N replicas share the work (a request is
    never split): the work is divided by N. Under a client limit (closed-loop load) there is
    no burst floor: a burst waits at the client, and TTFT counts from each request's send.

  Percentiles are over one class's requests for an SLO that names a traffic class. (An
  "ideal server prefilling in arrival order" is *not* a bound for vLLM, which interleaves a
  short prompt with a long one: measured on a bursty trace, its median TTFT was 0.70 s where
  that server gave 1.91 s; the burst bound assumes no order.)
- **The load at which the closest trial would meet them**: capacity mode
  (:func:`~prefill_tuner.study.evaluation.capacity_search`) on its settings: the highest multiplier
  of the trace's request rate at which every SLO holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefill_tuner import defaults
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim.cost_model import StepModel, StepShape
from prefill_tuner.engines.sim.request import PrefixInterner
from prefill_tuner.objectives.slo import Slo, format_seconds
from prefill_tuner.study.evaluation import capacity_search
from prefill_tuner.trace.model import Trace


@dataclass(frozen=True)
class Floor:
    """An SLO's value on an ideal server, against its limit."""

    slo: Slo
    alone_s: float
    """The SLO's statistic over the per-request floors (each request alone: any load)."""
    bursts_s: float = 0.0
    """For TTFT, over the burst floors (this load); 0 for other metrics."""

    @property
    def floor_s(self) -> float:
        return max(self.alone_s, self.bursts_s)

    @property
    def unreachable(self) -> bool:
        return self.floor_s > self.slo.limit_s

    @property
    def bursts(self) -> bool:
        """Whether only the trace's bursts (at this load) put the SLO out of reach, or, when
        it is within reach, whether they set the floor."""
        if self.alone_s > self.slo.limit_s:
            return False
        return self.bursts_s > self.alone_s

    def line(self) -> str:
        """Why the SLO is out of reach: each request alone when that is enough (at any load),
        else the bursts (at this load)."""
        if self.slo.metric != "ttft":
            value, how = self.alone_s, "one request decoding alone: at any load"
        elif self.bursts:
            value = self.bursts_s
            how = (
                "the trace's bursts prefilled at the engine's full arithmetic rate, in any "
                "order: at this load"
            )
        else:
            value = self.alone_s
            how = "each prompt's uncached tokens prefilled in one step of an idle engine"
        return (
            f"{self.slo.name} {format_seconds(value)} at best ({how}); limit "
            f"{format_seconds(self.slo.limit_s)}"
        )


def _statistic(values: np.ndarray, statistic: str) -> float:
    if statistic == "mean":
        return float(values.mean())
    if statistic == "max":
        return float(values.max())
    return float(np.percentile(values, float(statistic.removeprefix("p"))))


def _prefill_device_s(profile: StepModel, tokens: int, pairs: int) -> float:
    """The least device time (an async engine hides the host's share) in which a prompt of
    ``tokens`` tokens and ``pairs`` query-key pairs is prefilled alone: its one step, unless
    chunks could be cheaper (a measured kernel can be faster per token at a smaller size),
    then one step's fixed part plus the prefill's additive work, a bound every chunking meets."""
    shape = StepShape(
        prefill_tokens=tokens,
        requests=1,
        prefill_context_tokens=tokens,
        prefill_attention_pairs=pairs,
        prefill_chunks=((0, tokens),),
    )
    one_step = profile.step_seconds(shape) - profile.host_seconds(1)
    fixed = profile.step_seconds(StepShape(requests=1)) - profile.host_seconds(1)
    return min(one_step, fixed + profile.prefill_work_seconds(tokens, pairs))


def uncached_tokens(trace: Trace) -> list[int]:
    """Per request, the prompt tokens no earlier request's prompt could have cached."""
    interner = PrefixInterner()  # one id per distinct prefix
    seen: set[int] = set()
    tokens = []
    for request in trace.requests:
        size = request.prefix_block_size or 1
        chain = interner.chain(request.prefix_blocks, size)
        shared = 0
        while shared < len(chain) and chain[shared] in seen:
            shared += 1
        seen.update(chain)
        # vLLM computes the last prompt token even on a full hit.
        tokens.append(max(request.prompt_tokens - shared * size, 1))
    return tokens


def minimum_work_tokens(trace: Trace) -> list[int]:
    """Per request, the prompt tokens it computes whatever the order: all but the prefix it
    shares with any other request (that prefix is computed once, by whichever comes first)."""
    interner = PrefixInterner()
    chains = [interner.chain(r.prefix_blocks, r.prefix_block_size or 1) for r in trace.requests]
    return [
        max(r.prompt_tokens - interner.shared_prefix(chain) * (r.prefix_block_size or 1), 1)
        for r, chain in zip(trace.requests, chains, strict=True)
    ]


def latency_floor(
    trace: Trace,
    profile: StepModel,
    slos: tuple[Slo, ...],
    *,
    replicas: int = 1,
    max_concurrency: int | None = None,
) -> list[Floor]:
    """Each TTFT and TPOT/ITL SLO's value on an ideal server, or on ``replicas`` of them (see
    the module's docs); a class's TTFT floor over that class's requests (whose cached prefixes
    still come from all). With a client limit (``max_concurrency``) only each request alone
    bounds TTFT: the trace's bursts wait at the client, before their TTFTs begin."""
    if not trace.requests:
        return []
    tokens = uncached_tokens(trace)
    ttft = profile.request_latency_s + np.array(
        [_prefill_device_s(profile, n, n * (n + 1) // 2) for n in tokens]
    )
    work = np.array(
        [profile.prefill_work_seconds(n, n * (n + 1) // 2) for n in minimum_work_tokens(trace)]
    ) / max(replicas, 1)
    arrivals = np.array([r.arrival_s for r in trace.requests])
    decode = profile.step_seconds(
        StepShape(decode_tokens=1, requests=1, decode_context_tokens=1)
    ) - profile.host_seconds(1)
    classes = np.array([r.traffic_class for r in trace.requests], dtype=object)
    bounds: dict[str | None, list[np.ndarray]] = {}  # per class: its burst bounds, once
    floors = []
    for slo in slos:
        if slo.metric == "ttft":
            own = slice(None) if slo.traffic_class is None else classes == slo.traffic_class
            alone = ttft[own]
            if not alone.size:  # a class without requests is refused before any trial
                continue
            if max_concurrency is not None:
                bounds[slo.traffic_class] = []  # bursts wait at the client: no floor
            if slo.traffic_class not in bounds:
                order = np.argsort(arrivals[own], kind="stable")  # windows need arrival order
                bounds[slo.traffic_class] = list(
                    _burst_bounds(
                        arrivals[own][order],
                        work[own][order],
                        alone[order],
                        profile.request_latency_s,
                    )
                )
            single = _statistic(alone, slo.statistic)
            queued = max(
                (_statistic(bound, slo.statistic) for bound in bounds[slo.traffic_class]),
                default=single,
            )
            floors.append(Floor(slo, single, queued))
        elif slo.metric in ("tpot", "itl"):
            floors.append(Floor(slo, decode))
    return floors


def _burst_bounds(
    arrivals: np.ndarray, work: np.ndarray, alone: np.ndarray, latency: float
) -> Iterator[np.ndarray]:
    """For each window width (and two alignments), a lower bound of the TTFTs' order
    statistics: per window, the j-th smallest TTFT is at least the window's start, plus the
    front end's latency, plus the j smallest works, minus the window's end, and at least the
    j-th smallest per-request floor. Arrivals ascending (and not empty)."""
    span = float(arrivals[-1] - arrivals[0])
    width = span * 1.000001 or 1.0
    while width >= MIN_WINDOW_S:
        for offset in (0.0, width / 2):
            groups = np.floor((arrivals - arrivals[0] + offset) / width).astype(np.int64)
            firsts = np.flatnonzero(np.diff(groups, prepend=groups[0] - 1))
            sizes = np.diff(np.append(firsts, len(arrivals)))
            starts = arrivals[firsts]
            ends = arrivals[firsts + sizes - 1]
            ordered = work[np.lexsort((work, groups))]
            done = np.cumsum(ordered)
            before = np.repeat(done[firsts] - ordered[firsts], sizes)
            bound = np.repeat(starts + latency - ends, sizes) + done - before
            yield np.maximum(bound, alone[np.lexsort((alone, groups))])
        width /= 2


MIN_WINDOW_S = 0.001
"""The narrowest window :func:`latency_floor` tries (arrivals closer than this are one burst)."""


@dataclass(frozen=True)
class Headroom:
    """The highest load at which a trial's settings meet every SLO."""

    trial_number: int
    multiplier: float
    """Of the trace's request rate; 0 when not even 1/64 of it."""

    def line(self) -> str:
        if self.multiplier <= 0:
            return (
                f"trial {self.trial_number}'s settings miss the SLOs even at 1/64 of the "
                "trace's request rate: a limit no load makes reachable binds"
            )
        return (
            f"trial {self.trial_number}'s settings meet every SLO at up to "
            f"{self.multiplier:.3g}× the trace's request rate (capacity search, within "
            "its tolerance): more replicas, or less traffic per replica, would serve it "
            "(tune plan finds how many)"
        )


def rate_headroom(
    engine: TrialEngine,
    trace: Trace,
    settings: dict[str, Any],
    slos: tuple[Slo, ...],
    *,
    trial_number: int,
    error_budget: float = 0.0,
    tolerance: float = defaults.CAPACITY_TOLERANCE,
    max_concurrency: int | None = None,
) -> Headroom:
    """Capacity mode on a trial's settings (a few simulated runs), under the client's limit
    when there is one."""
    _, _, multiplier = capacity_search(
        engine,
        trace,
        settings,
        slos,
        error_budget,
        tolerance,
        label="headroom",
        max_concurrency=max_concurrency,
    )
    return Headroom(trial_number, multiplier)
