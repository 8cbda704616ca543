"""Service-level objectives: ``--slo p99_tpot=50ms``, parsed, checked and scored.

An SLO bounds one statistic of one metric over a run (``p99_tpot=50ms`` is a constraint on
the run's 99th-percentile TPOT, not a per-request limit). Metrics: ``ttft``, ``tpot``, ``itl``,
``e2el``; statistics: ``mean``, ``p50``, ``p90``, ``p95``, ``p99``, ``p99.9``, ``max``; units
``us``, ``ms``, ``s``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.metrics import RunMetrics

METRICS = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "p50", "p90", "p95", "p99", "p99.9", "max")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}

_SLO_RE = re.compile(
    r"(?P<stat>[a-z0-9.]+)_(?P<metric>[a-z0-9]+)=(?P<value>[0-9.eE+-]+)(?P<unit>[a-z]+)"
)


@dataclass(frozen=True, slots=True)
class Slo:
    """An upper bound on one statistic of one latency metric."""

    metric: str
    statistic: str
    limit_s: float

    @property
    def name(self) -> str:
        """``p99_tpot``: the key used for constraints, objectives and reports."""
        return f"{self.statistic}_{self.metric}"

    def value(self, metrics: RunMetrics) -> float:
        """This statistic of the run, in seconds (NaN when nothing was measured)."""
        return getattr(metrics, f"{self.metric}_s")[self.statistic]

    def __str__(self) -> str:
        return f"{self.name}={format_seconds(self.limit_s)}"


def parse_slo(text: str) -> Slo:
    """Parse ``p99_tpot=50ms``; a one-line :class:`TunerError` naming what is wrong."""
    compact = text.strip().lower().replace(" ", "")
    match = _SLO_RE.fullmatch(compact)
    if match is None:
        raise TunerError(
            f"--slo {text!r}: expected STAT_METRIC=VALUEUNIT, e.g. p99_tpot=50ms or p95_ttft=2s"
        )
    stat, metric, unit = match["stat"], match["metric"], match["unit"]
    if metric not in METRICS:
        raise TunerError(
            f"--slo {text!r}: unknown metric {metric!r}; use one of {', '.join(METRICS)}"
        )
    if stat not in STATISTICS:
        raise TunerError(
            f"--slo {text!r}: unknown statistic {stat!r}; use one of {', '.join(STATISTICS)}"
        )
    if unit not in UNITS:
        raise TunerError(f"--slo {text!r}: unknown unit {unit!r}; use us, ms or s")
    try:
        value = float(match["value"])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise TunerError(f"--slo {text!r}: the limit must be a positive number")
    return Slo(metric=metric, statistic=stat, limit_s=value * UNITS[unit])


def parse_slos(texts: list[str]) -> tuple[Slo, ...]:
    """Parse repeated ``--slo`` options; the same statistic twice is an error."""
    slos = tuple(parse_slo(text) for text in texts)
    names = [slo.name for slo in slos]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise TunerError(f"--slo: {', '.join(duplicates)} given more than once")
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
