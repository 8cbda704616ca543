"""What every trace reader shares: the parsed row, the limits of plausible data, located
checks of counts and times, CSV rows by column name, and the missing-arrival-times rule.

Every function here turns bad input into a :class:`TraceError` naming the file, line and field.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from prefill_tuner.errors import TraceError
from prefill_tuner.trace.model import Adjustment

MAX_TOKENS = 10**9
"""Larger token counts are corrupt data, not requests."""
MAX_TIMESTAMP = 1e15
"""Larger timestamps (in the format's unit) are corrupt data: 1e15 ms is 31,000 years."""


@dataclass(frozen=True, slots=True)
class Row:
    """A parsed row before shaping: arrival in the format's own clock ticks."""

    line: int
    id: str
    clock: float | int
    """Arrival in the format's ticks (ms for JSONL, ns for Azure, s for BurstGPT)."""
    prompt: int
    output: int
    blocks: tuple[int, ...] = ()
    block_size: int | None = None
    traffic_class: str | None = None


def check_count(value: int, field: str, where: dict[str, Any]) -> int:
    """A token count: a whole number in [0, :data:`MAX_TOKENS`]."""
    if value < 0:
        raise TraceError(f"must not be negative, got {str(value)[:40]}", field=field, **where)
    if value > MAX_TOKENS:
        raise TraceError(f"implausibly large (over {MAX_TOKENS:,})", field=field, **where)
    return value


def require_closed_loop(
    path: Path, limit: int | None, closed_loop: bool, what: str = "this file has no arrival times"
) -> None:
    """A file whose arrival times are missing, or mean nothing open-loop (the old server's speed
    set them), is refused naming the client limit to replay it with (``N`` when the file does
    not say), unless it is to be replayed closed-loop."""
    if not closed_loop:
        count = "N" if limit is None else str(limit)
        raise TraceError(f"{what}: replay it closed-loop with `max_concurrency` {count}", path=path)


def ready_at_once(rows: list[Row], what: str) -> tuple[list[Row], Adjustment]:
    """Every row ready at 0, in the order given (the order they were sent), and the note that
    says so: a closed-loop replay sends each as a client slot frees."""
    ready = [
        Row(r.line, r.id, 0, r.prompt, r.output, r.blocks, r.block_size, r.traffic_class)
        for r in rows
    ]
    reason = f"{what}: each is ready at 0 and sent as a client slot frees (closed loop)"
    return ready, Adjustment("queued", reason, len(ready))


# --- CSV ----------------------------------------------------------------------------------------


def csv_header(text: str, path: Path) -> list[str]:
    """The first CSV record (the header), its names stripped."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        return [name.strip() for name in next(reader, [])]
    except csv.Error as exc:
        raise TraceError(f"malformed CSV ({exc})", path=path, line=reader.line_num) from None


def csv_rows(
    text: str, path: Path, required: Iterable[str]
) -> Iterator[tuple[int, int, dict[str, str]]]:
    """Yield (physical line, 0-based data row, {required column: value}) for each CSV row."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader)
        names = [name.strip().lower() for name in header]
        required = list(required)
        missing = [col for col in required if col.lower() not in names]
        if missing:
            raise TraceError(
                f"missing column(s) {', '.join(repr(c) for c in missing)}; "
                f"found {', '.join(repr(h.strip()) for h in header)}",
                path=path,
                line=reader.line_num,
            )
        positions = {col: names.index(col.lower()) for col in required}
        width = max(positions.values()) + 1
        index = 0
        for record in reader:
            if not record or all(not cell.strip() for cell in record):
                continue
            if len(record) < width:
                raise TraceError(
                    f"expected at least {width} fields, found {len(record)}",
                    path=path,
                    line=reader.line_num,
                )
            yield reader.line_num, index, {col: record[pos] for col, pos in positions.items()}
            index += 1
    except csv.Error as exc:
        raise TraceError(f"malformed CSV ({exc})", path=path, line=reader.line_num) from None


_INT_RE = re.compile(r"[+-]?\d{1,30}")


def csv_int(value: str, field: str, where: dict[str, Any]) -> int:
    """A token count from a CSV cell."""
    text = value.strip()
    if not _INT_RE.fullmatch(text):
        raise TraceError(f"expected a whole number, got {text!r:.40}", field=field, **where)
    return check_count(int(text), field, where)


# --- Wall-clock times ---------------------------------------------------------------------------

_WALLCLOCK_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"\s*(Z|[+-]\d{2}(?::?\d{2})?)?"
)


def looks_like_wallclock(value: str) -> bool:
    """Whether ``value`` is written as a date and time (2023-11-16 18:15:46...)."""
    return _WALLCLOCK_RE.fullmatch(value.strip()) is not None


def parse_wallclock(
    value: str, where: dict[str, Any], field: str = "TIMESTAMP"
) -> tuple[int, bool]:
    """Nanoseconds since the epoch (naive times read as UTC), and whether a zone was given.

    Integer arithmetic throughout: Python's datetime stops at 6 fractional digits and floats
    would blur 100 ns ticks over a week-long trace.
    """
    match = _WALLCLOCK_RE.fullmatch(value.strip())
    if match is None:
        raise TraceError(
            f"expected a time like 2023-11-16 18:15:46.6805900, got {value.strip()!r:.40}",
            field=field,
            **where,
        )
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zone = match.group(7) or "", match.group(8)
    days = _ordinal(year, month, day)
    if days is None or hour > 23 or minute > 59 or second > 59:
        raise TraceError(f"not a valid date and time: {value.strip()!r}", field=field, **where)
    offset_s = 0
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset_s = sign * (int(digits[:2]) * 3600 + int(digits[2:] or 0) * 60)
    seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset_s
    nanos = int(fraction.ljust(9, "0")) if fraction else 0
    return seconds * 1_000_000_000 + nanos, zone is not None


@functools.lru_cache(maxsize=4096)
def _ordinal(year: int, month: int, day: int) -> int | None:
    try:
        return date(year, month, day).toordinal()
    except ValueError:
        return None
