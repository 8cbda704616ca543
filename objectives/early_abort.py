"""The early-abort rule: stop a replay once its SLO verdict can no longer change.

Optuna cannot prune multi-objective trials, so this is our own rule (docs/optuna.md).
While a replay runs, every request's metrics are bounded from below by what has happened so
far: a request sent 3 s ago without a first token has TTFT ≥ 3 s whatever comes next, one still
decoding has TPOT ≥ (now − first token) / (output tokens − 1), a request not sent yet has
≥ 0. Statistics (percentiles with linear interpolation, mean, max) never decrease when a value
grows, and never increase when the largest values are dropped, so evaluating a statistic on the
lower bounds, after dropping the largest ones that the error budget would still let fail, gives
a lower bound of its final value over every possible future. Once that bound is over an SLO's
limit (or more requests failed than the budget allows), the run is infeasible: no outcome of
the rest of the replay can make it pass, and the rest can be skipped.

An SLO of one traffic class (``p99_ttft[interactive]``) is bounded over that class's requests
alone: the same argument holds for any subset of the requests.

ITL is not used: its lower bounds would need every token gap on every check, and a run that
misses an ITL SLO is nearly always caught by TPOT or TTFT as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prefill_tuner.objectives.slo import Slo, format_seconds, split_name

BOUNDED_METRICS = ("ttft", "tpot", "e2el")
"""Metrics with a per-request lower bound during the replay."""


@dataclass(frozen=True)
class Snapshot:
    """Every request of a replay, as seen at ``now_s`` (one clock with the send times).

    Arrays are per request, in trace order; NaN where something has not happened yet.
    """

    now_s: float
    sent_s: np.ndarray
    """When each request was sent (NaN: not yet)."""
    first_token_s: np.ndarray
    """When its first output token arrived (NaN: none yet)."""
    last_token_s: np.ndarray
    """When its latest output token arrived (NaN: none yet)."""
    tokens: np.ndarray
    """Output tokens received so far."""
    expected: np.ndarray
    """Output tokens asked for."""
    failed: np.ndarray
    """True where the request has already failed (an error, a truncated stream)."""
    traffic_class: np.ndarray | None = None
    """Each request's traffic class (an object array, ``None`` where it has none); ``None``
    when the replay has no classes."""

    def of_class(self, name: str) -> Snapshot:
        """The requests of one traffic class alone (none when the replay has no classes)."""
        if self.traffic_class is None:
            mine = np.zeros(len(self.expected), dtype=bool)
        else:
            mine = self.traffic_class == name
        return Snapshot(
            now_s=self.now_s,
            sent_s=self.sent_s[mine],
            first_token_s=self.first_token_s[mine],
            last_token_s=self.last_token_s[mine],
            tokens=self.tokens[mine],
            expected=self.expected[mine],
            failed=self.failed[mine],
        )


@dataclass(frozen=True)
class Certainty:
    """Why a run is already certain to miss its SLOs, with the bounds that prove it."""

    reason: str
    """One line, e.g. ``p99_ttft ≥ 2.31s > 2s``."""
    lower_bounds: dict[str, float]
    """Statistic name (``p99_ttft``, ``p99_ttft[interactive]``) → a lower bound of its final
    value, in seconds."""


@dataclass(frozen=True)
class EarlyAbortRule:
    """The SLOs a run is judged against, and the statistics to bound when it is cut short."""

    slos: tuple[Slo, ...]
    error_budget: float = 0.0
    reported: tuple[str, ...] = ("p99_ttft", "p99_tpot")
    """Statistics whose lower bounds are recorded too (the study's objectives)."""

    def check(self, snapshot: Snapshot) -> Certainty | None:
        """A :class:`Certainty` when no future of the replay can meet every SLO; else None."""
        requests = len(snapshot.expected)
        if requests == 0:
            return None
        failed = int(np.count_nonzero(snapshot.failed))
        allowed = math.floor(self.error_budget * requests + 1e-9)
        bounds = self.lower_bounds(snapshot, droppable=max(allowed - failed, 0))
        if failed > allowed:
            return Certainty(
                f"{failed} of {requests} requests failed; the error budget allows {allowed}",
                bounds,
            )
        for slo in self.slos:
            bound = bounds.get(slo.name, math.nan)
            if bound > slo.limit_s:
                return Certainty(
                    f"{slo.name} ≥ {format_seconds(bound)} > {format_seconds(slo.limit_s)}",
                    bounds,
                )
        return None

    def lower_bounds(self, snapshot: Snapshot, droppable: int) -> dict[str, float]:
        """Lower bounds of the SLO'd and reported statistics (NaN where none can be given)."""
        names = [slo.name for slo in self.slos] + list(self.reported)
        per_class: dict[str | None, dict[str, np.ndarray]] = {}
        bounds: dict[str, float] = {}
        for name in dict.fromkeys(names):
            statistic, metric, traffic_class = split_name(name)
            if metric not in BOUNDED_METRICS:
                continue
            if traffic_class not in per_class:
                own = snapshot if traffic_class is None else snapshot.of_class(traffic_class)
                per_class[traffic_class] = _request_lower_bounds(own)
            values = per_class[traffic_class][metric]
            bounds[name] = _statistic_lower_bound(values, statistic, droppable)
        return bounds


def _request_lower_bounds(snapshot: Snapshot) -> dict[str, np.ndarray]:
    """Per-request lower bounds of TTFT, TPOT and E2E latency (failed requests left out)."""
    live = ~snapshot.failed
    sent, first = snapshot.sent_s[live], snapshot.first_token_s[live]
    last = snapshot.last_token_s[live]
    tokens, expected = snapshot.tokens[live], snapshot.expected[live]
    now = snapshot.now_s
    is_sent = ~np.isnan(sent)
    has_first = ~np.isnan(first)
    finished = tokens >= expected
    elapsed = np.where(is_sent, now - sent, 0.0)
    ttft = np.where(has_first, first - sent, elapsed)
    e2el = np.where(finished & has_first, last - sent, elapsed)
    multi = expected > 1  # TPOT is undefined for one-token outputs
    span = np.where(finished, last - first, now - first)  # the last token is still to come
    tpot = np.where(has_first, span / np.maximum(expected - 1, 1), 0.0)[multi]
    return {
        "ttft": np.maximum(ttft, 0.0),
        "tpot": np.maximum(tpot, 0.0),
        "e2el": np.maximum(e2el, 0.0),
    }


def _statistic_lower_bound(values: np.ndarray, statistic: str, droppable: int) -> float:
    """The statistic of ``values`` with the ``droppable`` largest left out (NaN if none left)."""
    kept = np.sort(values)[: max(values.size - droppable, 0)]
    if kept.size == 0:
        return math.nan
    if statistic == "mean":
        return float(kept.mean())
    if statistic == "max":
        return float(kept[-1])
    return float(np.percentile(kept, float(statistic.removeprefix("p"))))
