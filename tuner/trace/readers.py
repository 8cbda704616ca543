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
    ``vllm bench serve --dataset-name timed_trace`` and GuideLLM's replay read. Requests
    arriving faster than 1,000 a second are noted (``suspect``): seconds written for ms.
``azure``
    Azure LLM inference CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``; absolute wall-clock
    timestamps with up to 9 fractional digits (the 2023 traces have 7), with or without a time
    zone; arrivals are re-based to the first row.
``burstgpt``
    BurstGPT CSV: ``Timestamp`` (seconds), ``Request tokens``, ``Response tokens`` among other
    columns; rows with 0 response tokens are failed requests. Arrivals are re-based to the
    first row.
``csv``
    Any CSV whose header names the prompt and output tokens and, with its unit, the arrival
    (:mod:`prefill_tuner.trace.named_csv`).
``vllm-bench`` (alias ``vllm``), ``guidellm``, ``aiperf``
    The per-request records of ``vllm bench serve --save-detailed``, GuideLLM's report and
    AIPerf's ``profile_export.jsonl`` (:mod:`prefill_tuner.trace.tool_exports`).

A file without arrival times (or whose send times a closed-loop benchmark set) is read only for
a closed-loop replay (``closed_loop``), every request ready at 0; otherwise it is refused naming
the client limit to replay it with.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefill_tuner.errors import TraceError
from prefill_tuner.files import read_input
from prefill_tuner.objectives.slo import CLASS_NAME_RULE, is_class_name
from prefill_tuner.trace.model import Adjustment, Request, Trace, TraceSource
from prefill_tuner.trace.named_csv import is_named_csv, read_named_csv
from prefill_tuner.trace.parsing import (
    MAX_TIMESTAMP,
    MAX_TOKENS,
    Row,
    check_count,
    csv_header,
    csv_int,
    csv_rows,
    parse_wallclock,
)
from prefill_tuner.trace.tool_exports import READERS as TOOL_READERS
from prefill_tuner.trace.tool_exports import parse_json, tool_of_object

__all__ = [
    "FORMAT_ALIASES",
    "MAX_TIMESTAMP",
    "MAX_TOKENS",
    "MOONCAKE_BLOCK_SIZE",
    "detect_format",
    "detect_format_of_text",
    "read_trace",
]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per ``hash_ids`` block in the Mooncake traces (and our native default)."""

SUSPECT_RATE = 1000
"""Requests a second above which a JSONL trace's timestamps look like seconds, not ms."""

FORMAT_ALIASES: dict[str, str] = {
    "jsonl": "jsonl",
    "native": "jsonl",
    "mooncake": "jsonl",
    "azure": "azure",
    "burstgpt": "burstgpt",
    "csv": "csv",
    "vllm-bench": "vllm-bench",
    "vllm": "vllm-bench",
    "guidellm": "guidellm",
    "aiperf": "aiperf",
}
"""Names accepted by ``--format``, mapped to the reader that handles them."""


def read_trace(
    path: str | Path, format: str | None = None, *, sort: bool = False, closed_loop: bool = False
) -> Trace:
    """Read a trace file into requests sorted by arrival (seconds from trace start).

    ``format`` is one of :data:`FORMAT_ALIASES` or ``None`` to detect it from the content.
    Unsorted arrivals are an error unless ``sort`` is true, in which case they are sorted
    (stably) and the number of requests that were out of order is recorded (a benchmark tool's
    export, listed as requests finished, is always sorted). ``closed_loop``: the trace is to be
    replayed with a client limit (``max_concurrency``), so a file without arrival times (or
    whose send times a closed-loop benchmark set) is read with every request ready at 0
    instead of refused.
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
    rows, adjustments = reader(text, path, closed_loop)
    if not rows:
        raise TraceError("the file has no replayable requests", path=path)
    if kind == "jsonl":
        adjustments.append(_unit_warning(rows))
    requests, reordered = _to_requests(rows, path, ticks_per_second, sort=sort, rebase=rebase)
    notes = [
        *adjustments,
        Adjustment("reordered", "arrived out of order; sorted by arrival", reordered),
    ]
    source = TraceSource(path=str(path), format=kind, sha256=hashlib.sha256(data).hexdigest())
    return Trace(requests=(), source=source).with_requests(requests, *notes)


def detect_format(path: str | Path) -> str:
    """The reader name (a value of :data:`FORMAT_ALIASES`) that fits the file's content."""
    path = Path(path)
    return detect_format_of_text(_decode(_read_file(path), path), path)


def _read_file(path: Path) -> bytes:
    """The trace's bytes (a regular file only: see :func:`~prefill_tuner.files.read_input`)."""
    try:
        return read_input(path)
    except OSError as exc:
        raise TraceError(f"cannot read the file: {exc.strerror or exc}", path=path) from None


def detect_format_of_text(text: str, path: str | Path) -> str:
    """Detect the format from the first non-blank line: a JSON object (native JSONL, or a
    benchmark tool's export, told by its keys) or a known CSV header."""
    first = next((line.strip() for line in text.split("\n") if line.strip()), "")
    if first.startswith("{"):
        return tool_of_object(_json_or_none(first) or _json_or_none(text)) or "jsonl"
    header = csv_header(first, Path(path)) if first else []
    names = {name.lower() for name in header}
    # One telling column is enough: the reader then names any missing column precisely.
    if names & {"contexttokens", "generatedtokens"}:
        return "azure"
    if names & {"request tokens", "response tokens"}:
        return "burstgpt"
    if is_named_csv(header):
        return "csv"
    raise TraceError(
        f"cannot tell the trace format from the first line {first[:80]!r}: expected a JSON "
        "object (Mooncake/native JSONL, a vllm bench serve, GuideLLM or AIPerf export) or a CSV "
        "header (Azure, BurstGPT, or columns named for prompt and output tokens); pass `format`",
        path=path,
        line=1,
    )


def _json_or_none(text: str) -> object:
    """The JSON value of ``text``, or ``None`` if it is not one."""
    try:
        return parse_json(text)
    except (ValueError, RecursionError):
        return None


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


def _read_jsonl(text: str, path: Path) -> tuple[list[Row], list[Adjustment]]:
    rows: list[Row] = []
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
        rows.append(Row(line, ident, clock, prompt, output, blocks, block_size, traffic_class))
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
    return check_count(value, key, where)


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


def _read_azure(text: str, path: Path) -> tuple[list[Row], list[Adjustment]]:
    rows: list[Row] = []
    empty = 0
    zoned: bool | None = None
    for line, index, cells in csv_rows(
        text, path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    ):
        where: dict[str, Any] = {"path": path, "line": line}
        clock_ns, has_zone = parse_wallclock(cells["TIMESTAMP"], where)
        if zoned is None:
            zoned = has_zone
        elif zoned != has_zone:
            raise TraceError(
                "mixes timestamps with and without a time zone", field="TIMESTAMP", **where
            )
        prompt = csv_int(cells["ContextTokens"], "ContextTokens", where)
        output = csv_int(cells["GeneratedTokens"], "GeneratedTokens", where)
        if prompt == 0 or output == 0:
            empty += 1
            continue
        rows.append(Row(line, str(index), clock_ns, prompt, output))
    return rows, [Adjustment("dropped", "0 context or generated tokens: nothing to replay", empty)]


def _read_burstgpt(text: str, path: Path) -> tuple[list[Row], list[Adjustment]]:
    rows: list[Row] = []
    failed = empty_prompt = 0
    columns = ("Timestamp", "Request tokens", "Response tokens")
    for line, index, cells in csv_rows(text, path, columns):
        where: dict[str, Any] = {"path": path, "line": line}
        clock = _csv_seconds(cells["Timestamp"], where)
        prompt = csv_int(cells["Request tokens"], "Request tokens", where)
        output = csv_int(cells["Response tokens"], "Response tokens", where)
        if output == 0:
            failed += 1
        elif prompt == 0:
            empty_prompt += 1
        else:
            rows.append(Row(line, str(index), clock, prompt, output))
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

_Reader = Callable[[str, Path, bool], tuple[list[Row], list[Adjustment]]]


def _open_loop(reader: Callable[[str, Path], tuple[list[Row], list[Adjustment]]]) -> _Reader:
    """A reader of a format that always has arrival times (``closed_loop`` changes nothing)."""
    return lambda text, path, _closed_loop: reader(text, path)


_READERS: dict[str, tuple[_Reader, int, bool]] = {
    # format: (reader, clock ticks per second, re-base arrivals to the first row)
    "jsonl": (_open_loop(_read_jsonl), 1000, False),
    "azure": (_open_loop(_read_azure), 1_000_000_000, True),
    "burstgpt": (_open_loop(_read_burstgpt), 1, True),
    "csv": (read_named_csv, 1_000_000_000, True),
    **{kind: (reader, ticks, True) for kind, (reader, ticks) in TOOL_READERS.items()},
}


def _unit_warning(rows: list[Row]) -> Adjustment:
    """A JSONL trace (milliseconds) whose requests arrive faster than :data:`SUSPECT_RATE` a
    second: almost always timestamps written in seconds. Counted 0 (no note) otherwise."""
    span_ms = max(row.clock for row in rows) - min(row.clock for row in rows)
    if len(rows) < 100 or span_ms <= 0 or len(rows) / span_ms * 1000 <= SUSPECT_RATE:
        return Adjustment("suspect", "", 0)
    reason = (
        f"all arrive within {span_ms / 1000:.3g} s ({len(rows) / span_ms * 1000:,.0f} a "
        "second): the timestamps look like seconds, but this format counts milliseconds; "
        "multiply them by 1000, or replay with `rate_scale` 0.001"
    )
    return Adjustment("suspect", reason, len(rows))


def _to_requests(
    rows: list[Row], path: Path, ticks_per_second: int, *, sort: bool, rebase: bool
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
