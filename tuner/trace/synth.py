"""Seeded synthetic workloads: the classic shapes that expose chunked-prefill trade-offs.

A workload is a mix of request classes (fixed prompt and output lengths) arriving as one
Poisson, gamma (bursty) or evenly spaced process; each arrival draws its class by weight.
The same arguments and seed always give the same trace.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from prefill_tuner.errors import TunerError
from prefill_tuner.trace.model import Request, Trace, TraceSource
from prefill_tuner.trace.readers import MAX_TIMESTAMP, MAX_TOKENS

MAX_REQUESTS = 10_000_000
"""Most requests a synthetic trace may hold (about 1 GB of JSONL)."""
MAX_SECONDS = MAX_TIMESTAMP / 1000
"""Latest arrival a trace may hold: the readers refuse later timestamps (native: ms)."""


@dataclass(frozen=True, slots=True)
class RequestClass:
    """Requests of one fixed shape."""

    name: str
    prompt_tokens: int
    output_tokens: int


PRESETS: dict[str, RequestClass] = {
    preset.name: preset
    for preset in (
        # Streams that only decode: the baseline that chunked prefill must not disturb.
        RequestClass("decode", 16, 512),
        # Chat turns: short prompt, short answer.
        RequestClass("interactive", 256, 64),
        # Long-document prompts (summarise, RAG): one big prefill, a few output tokens.
        RequestClass("longdoc-16k", 16384, 32),
        RequestClass("longdoc-32k", 32768, 32),
    )
}
"""Named request classes; any other class is written ``PROMPTxOUTPUT`` (e.g. ``1024x128``)."""

Arrivals = Literal["poisson", "gamma", "uniform"]


@dataclass(frozen=True, slots=True)
class MixPart:
    """A request class and its relative share of the arrivals."""

    request_class: RequestClass
    weight: float


@dataclass(frozen=True, slots=True)
class Burst:
    """``count`` requests of one class arriving together at ``at_s`` (on top of the mix)."""

    request_class: RequestClass
    at_s: float
    count: int = 1


def parse_burst(text: str) -> Burst:
    """Parse ``longdoc-16k@30`` or ``longdoc-16k@30*4`` (class, time in seconds, count)."""
    match = re.fullmatch(r"\s*([^@\s]+)\s*@\s*([0-9.]+)\s*(?:\*\s*(\d+))?\s*", text)
    if match is None:
        raise TunerError(f"burst {text!r}: expected CLASS@SECONDS or CLASS@SECONDS*COUNT")
    try:
        at_s = float(match.group(2))
    except ValueError:
        raise TunerError(f"burst {text!r}: {match.group(2)!r} is not a time in seconds") from None
    count = int(match.group(3) or 1)
    if count < 1:
        raise TunerError(f"burst {text!r}: the count must be at least 1")
    if count > MAX_REQUESTS:
        raise TunerError(f"burst {text!r}: the count must be at most {MAX_REQUESTS:,}")
    if not at_s <= MAX_SECONDS:
        raise TunerError(f"burst {text!r}: the time must be at most {MAX_SECONDS:g} seconds")
    return Burst(_request_class(match.group(1)), at_s, count)


def parse_mix(text: str) -> tuple[MixPart, ...]:
    """Parse ``decode=0.8,longdoc-16k=0.2`` (weights optional, default 1; normalised later)."""
    parts: list[MixPart] = []
    for item in (piece.strip() for piece in text.split(",")):
        if not item:
            continue
        name, _, weight_text = item.partition("=")
        request_class = _request_class(name.strip())
        try:
            weight = float(weight_text) if weight_text else 1.0
        except ValueError:
            weight = float("nan")
        if not weight > 0 or weight == float("inf"):
            raise TunerError(f"mix part {item!r}: the weight must be a positive number")
        parts.append(MixPart(request_class, weight))
    if not parts:
        raise TunerError("the mix is empty: name at least one request class")
    return tuple(parts)


def _request_class(name: str) -> RequestClass:
    if name in PRESETS:
        return PRESETS[name]
    match = re.fullmatch(r"(\d+)x(\d+)", name)
    if match and int(match.group(1)) > 0 and int(match.group(2)) > 0:
        prompt, output = int(match.group(1)), int(match.group(2))
        if max(prompt, output) > MAX_TOKENS:
            raise TunerError(
                f"request class {name!r}: at most {MAX_TOKENS:,} prompt or output tokens "
                "(what a trace may hold)"
            )
        return RequestClass(name, prompt, output)
    known = ", ".join(PRESETS)
    raise TunerError(
        f"unknown request class {name!r}: use one of {known}, or PROMPTxOUTPUT like 1024x128"
    )


def arrival_times(
    rng: np.random.Generator,
    rate: float,
    *,
    duration_s: float | None,
    count: int | None,
    arrivals: Arrivals = "poisson",
    cv: float = 1.0,
) -> np.ndarray:
    """Arrival times in seconds from 0, at mean ``rate`` per second, until ``duration_s`` or
    ``count`` arrivals (whichever is given; both: the earlier limit).

    ``gamma`` interarrivals have coefficient of variation ``cv`` (> 1 is burstier than
    Poisson, < 1 smoother); ``uniform`` spaces arrivals exactly 1/rate apart, the first at 0.
    """
    if not 0 < rate < math.inf:
        raise TunerError(f"`rate`: must be a positive number of arrivals per second, got {rate}")
    if duration_s is None and count is None:
        raise TunerError("give a duration or a request count")
    if duration_s is not None and not 0 <= duration_s <= MAX_SECONDS:
        raise TunerError(f"`duration`: must be at most {MAX_SECONDS:g} seconds, got {duration_s}")
    if arrivals == "gamma" and not 0 < cv < math.inf:
        raise TunerError(f"`cv`: must be a positive number, got {cv}")
    if duration_s is None:
        expected = float(count or 0)
    else:
        expected = duration_s * rate if count is None else min(count, duration_s * rate)
    if expected > MAX_REQUESTS:
        raise TunerError(
            f"about {expected:,.0f} requests: a synthetic trace holds at most {MAX_REQUESTS:,} "
            "(lower `rate`, `duration` or `count`)"
        )
    # Both limits: draw for the earlier one (a huge `count` with a short `duration` must not
    # allocate the count's arrivals).
    by_time = None if duration_s is None else int(duration_s * rate * 1.5 + 20)
    wanted = min(n for n in (count, by_time) if n is not None)
    times = np.empty(0)
    while True:
        n = max(wanted - times.size, 16)
        if arrivals == "uniform":
            gaps = np.full(n, 1.0 / rate)
        elif arrivals == "gamma":
            shape = 1.0 / cv**2
            gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
        else:
            gaps = rng.exponential(1.0 / rate, size=n)
        start = times[-1] if times.size else 0.0
        steps = np.cumsum(gaps) + start
        if arrivals == "uniform" and not times.size:
            steps -= gaps[0]
        times = np.concatenate([times, steps])
        enough_count = count is not None and times.size >= count
        enough_time = duration_s is not None and times[-1] >= duration_s
        if enough_count or enough_time:
            break
    if duration_s is not None:
        times = times[times < duration_s]
    if count is not None:
        times = times[:count]
    if times.size and times[-1] > MAX_SECONDS:
        raise TunerError(
            f"arrivals run past {MAX_SECONDS:g} seconds, later than a trace may hold "
            "(raise `rate` or lower `count`)"
        )
    return times


def synthesize(
    mix: Sequence[MixPart],
    rate: float,
    *,
    bursts: Sequence[Burst] = (),
    duration_s: float | None = None,
    count: int | None = None,
    arrivals: Arrivals = "poisson",
    cv: float = 1.0,
    seed: int = 0,
) -> Trace:
    """A synthetic trace: the mix's arrivals plus the bursts; ids ``0, 1, …`` in arrival order
    (a burst arriving at the same time as a mix request comes after it). Each request's traffic
    class is its request class's name (``interactive``, ``1024x128``), so SLOs can name it."""
    rng = np.random.default_rng(seed)
    times = arrival_times(rng, rate, duration_s=duration_s, count=count, arrivals=arrivals, cv=cv)
    weights = np.array([part.weight for part in mix], dtype=float)
    picks = rng.choice(len(mix), size=times.size, p=weights / weights.sum())
    shapes = [
        (float(time), mix[pick].request_class) for time, pick in zip(times, picks, strict=True)
    ]
    shapes += [(b.at_s, b.request_class) for b in bursts for _ in range(b.count)]
    shapes.sort(key=lambda shape: shape[0])
    requests = tuple(
        Request(
            id=str(index),
            arrival_s=time,
            prompt_tokens=request_class.prompt_tokens,
            output_tokens=request_class.output_tokens,
            traffic_class=request_class.name,
        )
        for index, (time, request_class) in enumerate(shapes)
    )
    if not requests:
        raise TunerError("the synthetic trace is empty: raise the rate, duration or count")
    label = ",".join(f"{p.request_class.name}={p.weight:g}" for p in mix)
    extra = "".join(f";burst={b.request_class.name}@{b.at_s:g}*{b.count}" for b in bursts)
    description = f"synth:{label};rate={rate:g};arrivals={arrivals};cv={cv:g};seed={seed}{extra}"
    return Trace(requests=requests, source=TraceSource(description, "synthetic", ""))
