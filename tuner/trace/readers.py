"""Readers for the public trace formats, with format detection.

Every reader turns bad input into a :class:`TraceError` naming the file, line and field;
nothing else escapes for any byte sequence (the fuzz tests hold us to that). Rows that are
valid but cannot be replayed (failed requests, empty prompts) are dropped and counted.

Formats:

``jsonl`` (aliases ``mooncake``, ``native``)
    One JSON object a line: ``timestamp`` (ms from trace start), ``input_length``,
    ``output_length``, optional ``hash_ids`` (prefix-block ids). Our native format adds optional
    ``id``, ``block_size`` (tokens per prefix block, default 512 as in Mooncake) and ``class``
    (the request's traffic class, :mod:`prefill_tuner.trace.classes`). This is what
    ``vllm bench serve --dataset-name timed_trace`` and GuideLLM's replay read.
``azure``
    Azure LLM inference CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``; absolute wall-clock
    timestamps with up to 9 fractional digits (the 2023 traces have 7), with or without a time
    zone; arrivals are re-based to the first row.
``burstgpt``
    BurstGPT CSV: ``Timestamp`` (seconds), ``Request tokens``, ``Response tokens`` among other
    columns; rows with 0 response tokens are failed requests. Arrivals are re-based to the
    first row.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from prefill_tuner.errors import TraceError
from prefill_tuner.files import read_input
from prefill_tuner.objectives.slo import CLASS_NAME_RULE, is_class_name
from prefill_tuner.trace.model import Adjustment, Request, Trace, TraceSource

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces (and our native default)."""

MAX_TOKENS = 10**9
"""Larger token counts are corrupt data, not requests."""
MAX_TIMESTAMP = 1e15
"""Larger timestamps (in the format's unit) are corrupt data: 1e15 ms is 31,000 years."""

FORMAT_ALIASES: dict[str, str] = {
    "jsonl": "jsonl",
    "native": "jsonl",
    "mooncake": "jsonl",
    "azure": "azure",
    "burstgpt": "burstgpt",
}
"""Names accepted by ``--format``, mapped to the reader that handles them."""


@dataclass(frozen=True, slots=True)
class _Row:
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


def read_trace(path: str | Path, format: str | None = None, *, sort: bool = False) -> Trace:
    """Read a trace file into requests sorted by arrival (seconds from trace start).

    ``format`` is one of :data:`FORMAT_ALIASES` or ``None`` to detect it from the content.
    Unsorted arrivals are an error unless ``sort`` is true, in which case they are sorted
    (stably) and the number of requests that were out of order is recorded.
    """
    path = Path(path)
    data = _read_file(path)
    text = _decode(data, path)
    if not text.strip():
        raise TraceError("the file is empty: a trace needs at least one request", path=path)
    if format is None:
        kind = detect_format_of_text(text, path)
    else:
        alias = FORMAT_ALIASES.get(format.lower())
        if alias is None:
            choices = ", ".join(sorted(FORMAT_ALIASES))
            raise TraceError(f"unknown trace format {format!r}; choose one of: {choices}")
        kind = alias
    reader, ticks_per_second, rebase = _READERS[kind]
    rows, adjustments = reader(text, path)
    if not rows:
        raise TraceError("the file has no replayable requests", path=path)
    requests, reordered = _to_requests(rows, path, ticks_per_second, sort=sort, rebase=rebase)
    notes = [
        *adjustments,
        Adjustment("reordered", "arrived out of order; sorted by arrival", reordered),
    ]
    source = TraceSource(path=str(path), format=kind, sha256=hashlib.sha256(data).hexdigest())
    return Trace(requests=(), source=source).with_requests(requests, *notes)


def detect_format(path: str | Path) -> str:
    """The reader name (``jsonl``, ``azure`` or ``burstgpt``) that fits the file's content."""
    path = Path(path)
    return detect_format_of_text(_decode(_read_file(path), path), path)


def _read_file(path: Path) -> bytes:
    """The trace's bytes (a regular file only: see :func:`~prefill_tuner.files.read_input`)."""
    try:
        return read_input(path)
    except OSError as exc:
        raise TraceError(f"cannot read the file: {exc.strerror or exc}", path=path) from None


def detect_format_of_text(text: str, path: str | Path) -> str:
    """Detect the format from the first non-blank line: a JSON object or a known CSV header."""
    first = next((line.strip() for line in text.split("\n") if line.strip()), "")
    if first.startswith("{"):
        return "jsonl"
    header = {name.strip().lower() for name in _csv_header(first)}
    # One telling column is enough: the reader then names any missing column precisely.
    if header & {"contexttokens", "generatedtokens"}:
        return "azure"
    if header & {"request tokens", "response tokens"}:
        return "burstgpt"
    raise TraceError(
        f"cannot tell the trace format from the first line {first[:80]!r}: expected a JSON "
        "object (Mooncake/native JSONL) or an Azure or BurstGPT CSV header; pass `format`",
        path=path,
        line=1,
    )


def _csv_header(line: str) -> list[str]:
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return []


def _decode(data: bytes, path: Path) -> str:
    """UTF-8 (a BOM is allowed); a bad byte is reported with its line number."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            path=path,
            line=line,
        ) from None


# --- JSONL (Mooncake and native) --------------------------------------------------------------


def _read_jsonl(text: str, path: Path) -> tuple[list[_Row], list[Adjustment]]:
    rows: list[_Row] = []
    empty = 0
    for index, raw in enumerate(text.split("\n")):
        line = index + 1
        stripped = raw.strip()
        if not stripped:
            continue
        try:
            obj = json.loads(stripped)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            if isinstance(exc, ValueError) and not isinstance(exc, json.JSONDecodeError):
                detail = "a number with too many digits"
            raise TraceError(f"not valid JSON ({detail})", path=path, line=line) from None
        if not isinstance(obj, dict):
            raise TraceError(
                f"expected a JSON object, got {type(obj).__name__}", path=path, line=line
            )
        where: dict[str, Any] = {"path": path, "line": line}
        clock = _json_number(obj, "timestamp", where)
        prompt = _json_int(obj, "input_length", where)
        output = _json_int(obj, "output_length", where)
        block_size = None
        blocks: tuple[int, ...] = ()
        if obj.get("hash_ids") is not None:
            blocks = _json_blocks(obj, where)
            block_size = MOONCAKE_BLOCK_SIZE
            if obj.get("block_size") is not None:
                block_size = _json_int(obj, "block_size", where)
                if block_size < 1:
                    raise TraceError("must be at least 1", field="block_size", **where)
            needed = -(-prompt // block_size)
            if len(blocks) > needed:
                raise TraceError(
                    f"{len(blocks)} prefix blocks, but input_length {prompt} fills at most "
                    f"{needed} blocks of {block_size} tokens",
                    field="hash_ids",
                    **where,
                )
        ident = _json_id(obj, index, where)
        traffic_class = _json_class(obj, where)
        if prompt == 0 or output == 0:
            empty += 1
            continue
        rows.append(_Row(line, ident, clock, prompt, output, blocks, block_size, traffic_class))
    return rows, [Adjustment("dropped", "0 input or output tokens: nothing to replay", empty)]


def _json_number(obj: dict[str, Any], key: str, where: dict[str, Any]) -> float:
    value = _json_required(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"expected a number, got {value!r:.40}", field=key, **where)
    if not 0 <= value <= MAX_TIMESTAMP:  # also false for NaN and infinities
        raise TraceError(f"must be a finite number ≥ 0, got {value!r:.40}", field=key, **where)
    return value


def _json_int(obj: dict[str, Any], key: str, where: dict[str, Any]) -> int:
    value = _json_required(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"expected a whole number, got {value!r:.40}", field=key, **where)
    return _check_count(value, key, where)


def _check_count(value: int, field: str, where: dict[str, Any]) -> int:
    if value < 0:
        raise TraceError(f"must not be negative, got {str(value)[:40]}", field=field, **where)
    if value > MAX_TOKENS:
        raise TraceError(f"implausibly large (over {MAX_TOKENS:,})", field=field, **where)
    return value


def _json_required(obj: dict[str, Any], key: str, where: dict[str, Any]) -> Any:
    if key not in obj:
        raise TraceError("missing", field=key, **where)
    return obj[key]


def _json_blocks(obj: dict[str, Any], where: dict[str, Any]) -> tuple[int, ...]:
    value = obj["hash_ids"]
    if not isinstance(value, list) or any(
        isinstance(item, bool) or not isinstance(item, int) or item < 0 for item in value
    ):
        raise TraceError(
            "expected a list of whole numbers ≥ 0 (prefix-block ids)", field="hash_ids", **where
        )
    return tuple(value)


def _json_id(obj: dict[str, Any], index: int, where: dict[str, Any]) -> str:
    value = obj.get("id")
    if value is None:
        return str(index)
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise TraceError(
            f"expected a non-empty string or integer, got {value!r:.40}", field="id", **where
        )
    return str(value)


def _json_class(obj: dict[str, Any], where: dict[str, Any]) -> str | None:
    value = obj.get("class")
    if value is None:
        return None
    if not is_class_name(value):
        raise TraceError(
            f"expected a class name of {CLASS_NAME_RULE}, got {value!r:.40}",
            field="class",
            **where,
        )
    return str(value)


# --- CSV (Azure, BurstGPT) --------------------------------------------------------------------


def _csv_rows(
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


def _csv_int(value: str, field: str, where: dict[str, Any]) -> int:
    text = value.strip()
    if not _INT_RE.fullmatch(text):
        raise TraceError(f"expected a whole number, got {text!r:.40}", field=field, **where)
    return _check_count(int(text), field, where)


def _read_azure(text: str, path: Path) -> tuple[list[_Row], list[Adjustment]]:
    rows: list[_Row] = []
    empty = 0
    zoned: bool | None = None
    for line, index, cells in _csv_rows(
        text, path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    ):
        where: dict[str, Any] = {"path": path, "line": line}
        clock_ns, has_zone = _parse_wallclock(cells["TIMESTAMP"], where)
        if zoned is None:
            zoned = has_zone
        elif zoned != has_zone:
            raise TraceError(
                "mixes timestamps with and without a time zone", field="TIMESTAMP", **where
            )
        prompt = _csv_int(cells["ContextTokens"], "ContextTokens", where)
        output = _csv_int(cells["GeneratedTokens"], "GeneratedTokens", where)
        if prompt == 0 or output == 0:
            empty += 1
            continue
        rows.append(_Row(line, str(index), clock_ns, prompt, output))
    return rows, [Adjustment("dropped", "0 context or generated tokens: nothing to replay", empty)]


_WALLCLOCK_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"\s*(Z|[+-]\d{2}(?::?\d{2})?)?"
)


def _parse_wallclock(value: str, where: dict[str, Any]) -> tuple[int, bool]:
    """Nanoseconds since the epoch (naive times read as UTC), and whether a zone was given.

    Integer arithmetic throughout: Python's datetime stops at 6 fractional digits and floats
    would blur 100 ns ticks over a week-long trace.
    """
    match = _WALLCLOCK_RE.fullmatch(value.strip())
    if match is None:
        raise TraceError(
            f"expected a time like 2023-11-16 18:15:46.6805900, got {value.strip()!r:.40}",
            field="TIMESTAMP",
            **where,
        )
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zone = match.group(7) or "", match.group(8)
    days = _ordinal(year, month, day)
    if days is None or hour > 23 or minute > 59 or second > 59:
        raise TraceError(
            f"not a valid date and time: {value.strip()!r}", field="TIMESTAMP", **where
        )
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


def _read_burstgpt(text: str, path: Path) -> tuple[list[_Row], list[Adjustment]]:
    rows: list[_Row] = []
    failed = empty_prompt = 0
    columns = ("Timestamp", "Request tokens", "Response tokens")
    for line, index, cells in _csv_rows(text, path, columns):
        where: dict[str, Any] = {"path": path, "line": line}
        clock = _csv_seconds(cells["Timestamp"], where)
        prompt = _csv_int(cells["Request tokens"], "Request tokens", where)
        output = _csv_int(cells["Response tokens"], "Response tokens", where)
        if output == 0:
            failed += 1
        elif prompt == 0:
            empty_prompt += 1
        else:
            rows.append(_Row(line, str(index), clock, prompt, output))
    return rows, [
        Adjustment("dropped", "failed requests (0 response tokens)", failed),
        Adjustment("dropped", "0 request tokens: nothing to prefill", empty_prompt),
    ]


def _csv_seconds(value: str, where: dict[str, Any]) -> float:
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_TIMESTAMP:  # also false for NaN
        raise TraceError(
            f"expected seconds as a finite number ≥ 0, got {value.strip()!r:.40}",
            field="Timestamp",
            **where,
        )
    return seconds


# --- Common -----------------------------------------------------------------------------------

_Reader = Callable[[str, Path], tuple[list[_Row], list[Adjustment]]]

_READERS: dict[str, tuple[_Reader, int, bool]] = {
    # format: (reader, clock ticks per second, re-base arrivals to the first row)
    "jsonl": (_read_jsonl, 1000, False),
    "azure": (_read_azure, 1_000_000_000, True),
    "burstgpt": (_read_burstgpt, 1, True),
}


def _to_requests(
    rows: list[_Row], path: Path, ticks_per_second: int, *, sort: bool, rebase: bool
) -> tuple[tuple[Request, ...], int]:
    """Check order (or sort), reject duplicate ids, convert clocks to seconds from trace start."""
    out_of_order = 0
    for previous, row in itertools.pairwise(rows):
        if row.clock < previous.clock:
            if not sort:
                raise TraceError(
                    f"arrival goes back in time (before the previous request's, line "
                    f"{previous.line}); arrivals must be sorted, or pass `sort`",
                    path=path,
                    line=row.line,
                )
            out_of_order += 1
    if out_of_order:
        rows = sorted(rows, key=lambda row: row.clock)
    seen: dict[str, int] = {}
    for row in rows:
        if row.id in seen:
            raise TraceError(
                f"duplicate request id {row.id!r} (first on line {seen[row.id]})",
                path=path,
                line=row.line,
                field="id",
            )
        seen[row.id] = row.line
    origin = rows[0].clock if rebase else 0
    requests = tuple(
        Request(
            id=row.id,
            arrival_s=(row.clock - origin) / ticks_per_second,
            prompt_tokens=row.prompt,
            output_tokens=row.output,
            prefix_blocks=row.blocks,
            prefix_block_size=row.block_size,
            traffic_class=row.traffic_class,
        )
        for row in rows
    )
    return requests, out_of_order
