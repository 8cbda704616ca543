"""When no trial meets the SLOs: could any scheduler setting, and at what load would one?

Two answers, both from the simulator's step-time profile:

- **A floor no setting can beat** (:func:`latency_floor`). A request's first token cannot come
  sooner than its prompt's uncached tokens prefilled in one step of an otherwise idle engine
  (chunking only adds steps; a prefix is cached at best once an earlier request computed it),
  plus the front end's latency; a token after the first, sooner than a decode step of that one
  request alone. Percentiles of these per-request floors (over one class's requests for an
  SLO that names a traffic class) are compared with the SLOs: an SLO
  whose floor is over its limit cannot be met by any scheduler setting, at any load. (Queueing
  is left to the next answer: an ideal server prefilling in arrival order is *not* a bound for
  vLLM, which interleaves a short prompt with a long one; measured on a bursty trace, its
  median TTFT was 0.70 s where that "ideal" server gave 1.91 s.)
- **The load at which the closest trial would meet them**: capacity mode
  (:func:`~prefill_tuner.evaluation.capacity_search`) on its settings: the highest multiplier
  of the trace's request rate at which every SLO holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from prefill_tuner import defaults
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim.cost_model import StepModel, StepShape
from prefill_tuner.engines.sim.request import PrefixInterner
from prefill_tuner.evaluation import capacity_search
from prefill_tuner.objectives.slo import Slo, format_seconds
from prefill_tuner.trace.model import Trace


@dataclass(frozen=True)
class Floor:
    """An SLO's value on an ideal server, against its limit."""

    slo: Slo
    floor_s: float
    """The SLO's statistic over the per-request floors."""

    @property
    def unreachable(self) -> bool:
        return self.floor_s > self.slo.limit_s

    def line(self) -> str:
        how = (
            "each prompt's uncached tokens prefilled in one step of an idle engine"
            if self.slo.metric == "ttft"
            else "one request decoding alone"
        )
        return (
            f"{self.slo.name} {format_seconds(self.floor_s)} at best ({how}); limit "
            f"{format_seconds(self.slo.limit_s)}"
        )


def _statistic(values: np.ndarray, statistic: str) -> float:
    if statistic == "mean":
        return float(values.mean())
    if statistic == "max":
        return float(values.max())
    return float(np.percentile(values, float(statistic.removeprefix("p"))))


def _prefill_device_s(profile: StepModel, tokens: int, pairs: int) -> float:
    """One step prefilling ``tokens`` with ``pairs`` query-key pairs, device time only (an
    async engine hides the host's share)."""
    shape = StepShape(
        prefill_tokens=tokens,
        requests=1,
        prefill_context_tokens=tokens,
        prefill_attention_pairs=pairs,
    )
    return profile.step_seconds(shape) - profile.host_seconds(1)


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


def latency_floor(trace: Trace, profile: StepModel, slos: tuple[Slo, ...]) -> list[Floor]:
    """Each TTFT and TPOT/ITL SLO's value on an ideal server (see the module's docs); a class's
    TTFT floor over that class's requests (whose cached prefixes still come from all)."""
    if not trace.requests:
        return []
    tokens = uncached_tokens(trace)
    ttft = profile.request_latency_s + np.array(
        [_prefill_device_s(profile, n, n * (n + 1) // 2) for n in tokens]
    )
    decode = profile.step_seconds(
        StepShape(decode_tokens=1, requests=1, decode_context_tokens=1)
    ) - profile.host_seconds(1)
    classes = np.array([r.traffic_class for r in trace.requests], dtype=object)
    floors = []
    for slo in slos:
        if slo.metric == "ttft":
            own = ttft if slo.traffic_class is None else ttft[classes == slo.traffic_class]
            if own.size:  # a class without requests is refused before any trial
                floors.append(Floor(slo, _statistic(own, slo.statistic)))
        elif slo.metric in ("tpot", "itl"):
            floors.append(Floor(slo, decode))
    return floors


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
            "its tolerance): more replicas, or less traffic per replica, would serve it"
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
) -> Headroom:
    """Capacity mode on a trial's settings (a few simulated runs)."""
    _, _, multiplier = capacity_search(
        engine, trace, settings, slos, error_budget, tolerance, label="headroom"
    )
    return Headroom(trial_number, multiplier)
