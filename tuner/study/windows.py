"""Windows of the trace a study also judges each trial on (``judge_windows``): the traffic that
is coming is often heavier than the whole trace's average, so a trial meets the SLOs only when
it meets them on the whole trace and on every such window.

A window is ``busiest:SECONDS`` (the SECONDS with the most work arriving:
:func:`~prefill_tuner.trace.shaping.busiest_window`) or ``START..END`` (seconds from the
trace's start). Its verdict's constraints join the trial's as ``NAME@WINDOW``
(``p99_tpot@busiest:300``); its statistics are kept in the trial's details (``windows``), and
the recommendation's ratio of an SLO'd statistic is the worst of the whole trace's and the
windows' (:mod:`prefill_tuner.study.recommend`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prefill_tuner.errors import TunerError
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.shaping import busiest_window, window

WINDOWS_FIELD = "judge_windows"


@dataclass(frozen=True)
class JudgeWindow:
    """One window a trial is judged on besides the whole trace."""

    spec: str
    """As given, canonical: ``busiest:300`` or ``600..1200``."""
    start_s: float
    """Where it starts in the trace (for ``busiest``: where the busiest stretch starts)."""
    trace: Trace

    def words(self) -> str:
        end = self.start_s + (self.trace.requests[-1].arrival_s if self.trace.requests else 0)
        return f"{self.spec} ({len(self.trace)} requests from {self.start_s:g} s to ~{end:.0f} s)"


def _seconds(text: str, spec: str, *, zero_ok: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        low = "0 or more" if zero_ok else "more than 0"
        raise TunerError(
            f"`{WINDOWS_FIELD}` {spec!r}: {text!r} is not a number of seconds ({low}, finite); "
            "give busiest:SECONDS or START..END"
        )
    return value


def parse_window(spec: str) -> tuple[str, float, float]:
    """``("busiest", seconds, 0)`` or ``("span", start, end)``; a one-line error naming
    ``judge_windows`` for anything else."""
    text = spec.strip()
    if text.startswith("busiest:"):
        return "busiest", _seconds(text[len("busiest:") :], spec), 0.0
    if ".." in text:
        first, _, last = text.partition("..")
        start, end = _seconds(first, spec, zero_ok=True), _seconds(last, spec)
        if end <= start:
            raise TunerError(f"`{WINDOWS_FIELD}` {spec!r}: the end must come after the start")
        return "span", start, end
    raise TunerError(
        f"`{WINDOWS_FIELD}` {spec!r}: give busiest:SECONDS (the busiest stretch of that "
        "length) or START..END (seconds from the trace's start)"
    )


def canonical(spec: str) -> str:
    kind, first, second = parse_window(spec)
    return f"busiest:{first:g}" if kind == "busiest" else f"{first:g}..{second:g}"


def check_new_windows(trace: Trace, specs: Sequence[str]) -> None:
    """A new study's windows: a busiest stretch longer than the trace judges nothing the
    whole trace does not (a later trace, as a nightly run's, may be shorter: not refused
    there)."""
    span = trace.requests[-1].arrival_s - trace.requests[0].arrival_s if trace.requests else 0.0
    for spec in specs:
        kind, first, _ = parse_window(spec)
        if kind == "busiest" and first > span:
            raise TunerError(
                f"`{WINDOWS_FIELD}` {spec!r}: longer than the trace ({span:,.0f} s of "
                "arrivals); the whole trace is judged already: give a shorter stretch"
            )


def judge_windows(trace: Trace, specs: Sequence[str]) -> list[JudgeWindow]:
    """The windows ``specs`` name, cut from ``trace`` (a window given twice, or without
    requests, is refused)."""
    result: list[JudgeWindow] = []
    for spec in specs:
        kind, first, second = parse_window(spec)
        if canonical(spec) in [window.spec for window in result]:
            raise TunerError(f"`{WINDOWS_FIELD}` {spec!r}: given twice")
        if kind == "busiest":
            start, part = busiest_window(trace, first)
        else:
            start, part = first, window(trace, first, second - first)
        if not part.requests:
            raise TunerError(f"`{WINDOWS_FIELD}` {spec!r}: no request of the trace arrives in it")
        result.append(JudgeWindow(canonical(spec), start, part))
    return result
