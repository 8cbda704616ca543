"""Service-level objectives: ``--slo p99_tpot=50ms``, parsed, checked and scored.

An SLO bounds one statistic of one metric over a run (``p99_tpot=50ms`` is a constraint on
the run's 99th-percentile TPOT, not a per-request limit). Metrics: ``ttft``, ``tpot``, ``itl``,
``e2el``; statistics: ``mean``, ``p50``, ``p90``, ``p95``, ``p99``, ``p99.9``, ``max``; units
``us``, ``ms``, ``s``. ``p99_ttft[interactive]=500ms`` bounds the statistic over the requests of
one traffic class only (:mod:`prefill_tuner.trace.classes`); a class-less SLO judges them all.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.metrics import RunMetrics

CLASS_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
"""A traffic class's name: 1-32 letters, digits, ``_`` or ``-`` (SLO names and columns carry
it; the trace's classes, :mod:`prefill_tuner.trace.classes`, are named by the same rule)."""
CLASS_NAME_RULE = "1-32 letters, digits, '_' or '-'"


def is_class_name(value: object) -> bool:
    """Whether ``value`` is a valid class name (:data:`CLASS_NAME`)."""
    return isinstance(value, str) and CLASS_NAME.fullmatch(value) is not None


METRICS = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "p50", "p90", "p95", "p99", "p99.9", "max")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}

_SLO_RE = re.compile(
    r"(?P<stat>[a-z0-9.]+)_(?P<metric>[a-z0-9]+)(?:\[(?P<cls>[^\]]*)\])?"
    r"=(?P<value>[0-9.e+-]+)(?P<unit>[a-z]+)",
    re.IGNORECASE,
)
_NAME_RE = re.compile(r"(?P<stat>[^_]+)_(?P<metric>[^\[]+)(?:\[(?P<cls>[^\]]*)\])?")


@dataclass(frozen=True, slots=True)
class Slo:
    """An upper bound on one statistic of one latency metric."""

    metric: str
    """``ttft``, ``tpot``, ``itl`` or ``e2el``."""
    statistic: str
    """``mean``, ``p50`` ... ``p99.9`` or ``max``."""
    limit_s: float
    """The bound, in seconds."""
    traffic_class: str | None = None
    """Judge only the requests of this traffic class; ``None``: every request."""

    @property
    def name(self) -> str:
        """``p99_tpot`` or ``p99_ttft[interactive]``: the key used for constraints, objectives
        and reports."""
        return statistic_name(self.statistic, self.metric, self.traffic_class)

    def value(self, metrics: RunMetrics) -> float:
        """This statistic of the run (of the class's requests), in seconds; NaN when nothing
        was measured, a class without a completed request included."""
        return statistic_value(metrics, self.name)

    def __str__(self) -> str:
        return f"{self.name}={format_seconds(self.limit_s)}"


def statistic_name(statistic: str, metric: str, traffic_class: str | None = None) -> str:
    """``p99_ttft``, or ``p99_ttft[interactive]`` for one class's requests."""
    name = f"{statistic}_{metric}"
    return name if traffic_class is None else f"{name}[{traffic_class}]"


def split_name(name: str) -> tuple[str, str, str | None]:
    """``p99_ttft[interactive]`` → (``p99``, ``ttft``, ``interactive``); class ``None`` when
    the name has none."""
    match = _NAME_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"not a statistic name: {name!r}")
    return match["stat"], match["metric"], match["cls"]


def statistic_value(metrics: RunMetrics, name: str) -> float:
    """The run's statistic ``name`` in seconds (``p99_ttft[interactive]``: over that class's
    requests; NaN when the class has no completed request in the run)."""
    stat, metric, traffic_class = split_name(name)
    if traffic_class is not None:
        by_class = metrics.by_class.get(traffic_class)
        if by_class is None:
            return math.nan
        metrics = by_class
    return getattr(metrics, f"{metric}_s")[stat]


def parse_slo(text: str) -> Slo:
    """Parse ``p99_tpot=50ms`` or ``p99_ttft[interactive]=500ms``; a one-line
    :class:`TunerError` naming what is wrong."""
    compact = text.strip().replace(" ", "")
    match = _SLO_RE.fullmatch(compact)
    if match is not None and match["cls"] is not None and match["cls"] not in text:
        match = None  # spaces inside the class's brackets: not a class name
    if match is None:
        raise TunerError(
            f"`slos` {text!r}: expected STAT_METRIC=VALUEUNIT or STAT_METRIC[CLASS]=VALUEUNIT, "
            "e.g. p99_tpot=50ms, p95_ttft=2s or p99_ttft[interactive]=500ms"
        )
    stat, metric, unit = match["stat"].lower(), match["metric"].lower(), match["unit"].lower()
    traffic_class = match["cls"]
    if traffic_class is not None and not is_class_name(traffic_class):
        raise TunerError(f"`slos` {text!r}: a traffic class is {CLASS_NAME_RULE}")
    if metric not in METRICS:
        raise TunerError(
            f"`slos` {text!r}: unknown metric {metric!r}; use one of {', '.join(METRICS)}"
        )
    if stat not in STATISTICS:
        raise TunerError(
            f"`slos` {text!r}: unknown statistic {stat!r}; use one of {', '.join(STATISTICS)}"
        )
    if unit not in UNITS:
        raise TunerError(f"`slos` {text!r}: unknown unit {unit!r}; use us, ms or s")
    try:
        value = float(match["value"].lower())
    except ValueError:
        raise TunerError(f"`slos` {text!r}: the limit must be a positive number") from None
    if not math.isfinite(value):
        raise TunerError(f"`slos` {text!r}: the limit is not a finite number")
    if not value > 0:
        raise TunerError(f"`slos` {text!r}: the limit must be a positive number")
    return Slo(
        metric=metric, statistic=stat, limit_s=value * UNITS[unit], traffic_class=traffic_class
    )


def parse_slos(texts: list[str]) -> tuple[Slo, ...]:
    """Parse repeated ``--slo`` options; the same statistic (of the same class) twice is an
    error."""
    slos = tuple(parse_slo(text) for text in texts)
    names = [slo.name for slo in slos]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise TunerError(f"`slos`: {', '.join(duplicates)} given more than once")
    return slos


def format_seconds(seconds: float) -> str:
    """``0.05`` → ``50ms``; ``2.0`` → ``2s``; ``0.0005`` → ``500us``."""
    if math.isnan(seconds):
        return "n/a"
    if seconds >= 1:
        return f"{seconds:.3g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g}ms"
    return f"{seconds * 1e6:.3g}us"
