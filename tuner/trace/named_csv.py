"""A CSV trace of any origin, read by its header's column names (format ``csv``).

Columns are found by name: case, spaces, hyphens and brackets do not matter
(``Prompt Tokens``, ``prompt-tokens`` and ``prompt_tokens`` are one name; ``Arrival (ms)`` is
``arrival_ms``), and other columns are ignored.

- **prompt tokens** (required): one of :data:`PROMPT_NAMES`;
- **output tokens** (required): one of :data:`OUTPUT_NAMES`;
- **arrival**: a time name from :data:`TIME_NAMES` with its unit as a suffix (``_s``, ``_ms``,
  ``_us``, ``_ns``): ``arrival_s``, ``timestamp_ms``, ``start_time_ns``. A time column without a
  unit must hold date-times (``2024-05-12 00:00:00.25``, as Azure's traces); Vidur's
  ``arrived_at`` is seconds. Arrivals are re-based to the first row. Without an arrival column
  the file is replayed only closed-loop;
- optional ``id`` (or ``request_id``) and ``class`` (the request's traffic class).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from prefill_tuner.errors import TraceError
from prefill_tuner.objectives.slo import CLASS_NAME_RULE, is_class_name
from prefill_tuner.trace.model import Adjustment
from prefill_tuner.trace.parsing import (
    Row,
    csv_header,
    csv_int,
    csv_rows,
    looks_like_wallclock,
    parse_wallclock,
    ready_at_once,
    require_closed_loop,
)

PROMPT_NAMES = (
    "prompt_tokens",
    "input_tokens",
    "prompt_length",
    "input_length",
    "prompt_len",
    "input_len",
    "isl",
    "input_sequence_length",
    "num_prefill_tokens",
    "context_tokens",
)
"""Names of the prompt-tokens column."""
OUTPUT_NAMES = (
    "output_tokens",
    "completion_tokens",
    "generated_tokens",
    "output_length",
    "output_len",
    "osl",
    "output_sequence_length",
    "num_decode_tokens",
    "response_tokens",
)
"""Names of the output-tokens column."""
TIME_NAMES = ("arrival_time", "arrival", "timestamp", "time", "send_time", "start_time")
"""Names of the arrival column, before the unit suffix."""
UNITS = {"s": 10**9, "sec": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
"""Unit suffixes and their nanoseconds."""
_KNOWN_TIMES = {"arrived_at": 10**9}  # Vidur's processed traces: relative seconds
_ID_NAMES = ("id", "request_id")
_CLASS_NAMES = ("class", "traffic_class")
_MAX_NS = Decimal(10**21)  # 1e12 s, the native format's limit (1e15 ms)
_NUMBER_RE = re.compile(r"\+?(\d{1,30}(\.\d{0,30})?|\.\d{1,30})([eE][+-]?\d{1,3})?")


def normalise(name: str) -> str:
    """``Arrival (ms)`` → ``arrival_ms``: lower case, every run of other characters one ``_``."""
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


def is_named_csv(header: list[str]) -> bool:
    """Whether a CSV header names a prompt-tokens and an output-tokens column."""
    names = {normalise(name) for name in header}
    return bool(names & set(PROMPT_NAMES)) and bool(names & set(OUTPUT_NAMES))


def _time_unit(name: str) -> int | bool | None:
    """Nanoseconds per unit of a time column's name, ``None`` for a time column without a unit,
    ``False`` for a column that is not a time."""
    if name in _KNOWN_TIMES:
        return _KNOWN_TIMES[name]
    if name in TIME_NAMES:
        return None
    base, _, unit = name.rpartition("_")
    return UNITS[unit] if base in TIME_NAMES and unit in UNITS else False


def _columns(header: list[str], path: Path) -> dict[str, tuple[str, Any]]:
    """{role: (the header's own spelling, detail)} for prompt, output, time, id and class."""
    found: dict[str, tuple[str, Any]] = {}
    times = []
    for name in header:
        key = normalise(name)
        unit = _time_unit(key)
        if unit is not False:
            times.append((name, unit))
        for role, names in (
            ("prompt", PROMPT_NAMES),
            ("output", OUTPUT_NAMES),
            ("id", _ID_NAMES),
            ("class", _CLASS_NAMES),
        ):
            if key in names and role not in found:
                found[role] = (name, None)
    for role, names in (("prompt", PROMPT_NAMES), ("output", OUTPUT_NAMES)):
        if role not in found:
            raise TraceError(
                f"no column for {role} tokens (one of {', '.join(names)}); found "
                f"{', '.join(repr(name) for name in header)}",
                path=path,
                line=1,
            )
    if len(times) > 1:
        raise TraceError(
            f"more than one arrival column ({', '.join(repr(n) for n, _ in times)}): keep one",
            path=path,
            line=1,
        )
    if times:
        found["time"] = times[0]
    return found


def read_named_csv(text: str, path: Path, closed_loop: bool) -> tuple[list[Row], list[Adjustment]]:
    """Rows of a CSV trace read by column names; arrivals in nanoseconds."""
    columns = _columns(csv_header(text, path), path)
    prompt_col, output_col = columns["prompt"][0], columns["output"][0]
    time_col, unit = columns.get("time", (None, None))
    id_col = columns.get("id", (None, None))[0]
    class_col = columns.get("class", (None, None))[0]
    wanted = [name for name in (prompt_col, output_col, time_col, id_col, class_col) if name]
    rows: list[Row] = []
    empty = 0
    for line, index, cells in csv_rows(text, path, wanted):
        where: dict[str, Any] = {"path": path, "line": line}
        prompt = csv_int(cells[prompt_col], prompt_col, where)
        output = csv_int(cells[output_col], output_col, where)
        clock = 0 if time_col is None else _arrival(cells[time_col], time_col, unit, where)
        ident = cells[id_col].strip() if id_col else ""
        traffic_class = _class(cells[class_col], class_col, where) if class_col else None
        if prompt == 0 or output == 0:
            empty += 1
            continue
        rows.append(Row(line, ident or str(index), clock, prompt, output, (), None, traffic_class))
    notes = [Adjustment("dropped", "0 prompt or output tokens: nothing to replay", empty)]
    if time_col is None:
        require_closed_loop(path, None, closed_loop)
        rows, note = ready_at_once(rows, "this file has no arrival times")
        notes.append(note)
    return rows, notes


def _arrival(value: str, column: str, unit: int | None, where: dict[str, Any]) -> int:
    """Nanoseconds (from an arbitrary origin) of one arrival cell."""
    text = value.strip()
    if unit is None:
        if looks_like_wallclock(text):
            return parse_wallclock(text, where, field=column)[0]
        raise TraceError(
            f"{text!r:.40} states no unit: name the column {normalise(column)}_s or "
            f"{normalise(column)}_ms (or write date-times)",
            field=column,
            **where,
        )
    if not _NUMBER_RE.fullmatch(text):
        raise TraceError(f"expected a number ≥ 0, got {text!r:.40}", field=column, **where)
    try:
        nanos = Decimal(text) * unit
    except InvalidOperation:
        raise TraceError(
            f"expected a number ≥ 0, got {text!r:.40}", field=column, **where
        ) from None
    if nanos > _MAX_NS:
        raise TraceError(f"implausibly large, {text!r:.40}", field=column, **where)
    return int(nanos)


def _class(value: str, column: str, where: dict[str, Any]) -> str | None:
    text = value.strip()
    if not text:
        return None
    if not is_class_name(text):
        raise TraceError(
            f"expected a class name of {CLASS_NAME_RULE}, got {text!r:.40}", field=column, **where
        )
    return text
