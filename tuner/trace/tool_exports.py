"""Readers for the per-request records of the benchmark tools operators already run.

``vllm-bench``
    ``vllm bench serve --save-result --save-detailed`` JSON (``vllm/benchmarks/serve.py``):
    ``input_lens``, ``output_lens``, ``errors`` and, from vLLM releases that write them,
    ``start_times`` (the send time, ``time.perf_counter`` seconds) and ``queue_times`` (the wait
    for a ``--max-concurrency`` client slot). Arrival = send time − wait. Without
    ``--save-detailed`` the file holds no per-request records.
``guidellm``
    GuideLLM's report JSON (``guidellm benchmark --output-path x.json``,
    ``GenerativeBenchmarksReport``):
    ``benchmarks[0].requests.{successful,incomplete,errored}``, each request with
    ``prompt_tokens``, ``output_tokens`` and its scheduled start, ``info.timings.targeted_start``
    (0.4 and later; 0.3: ``scheduler_info.targeted_start_time``), Unix seconds.
``aiperf``
    AIPerf's ``profile_export.jsonl`` (``MetricRecordInfo``, one a line): ``metadata`` with
    ``credit_issued_ns`` (when the rate limiter released the request; older releases: only
    ``request_start_ns``, its send time), wall-clock nanoseconds, ``benchmark_phase``; ``metrics``
    with ``input_sequence_length`` and ``output_sequence_length`` (``{"value", "unit"}``).

Failed, cancelled and warm-up requests are dropped and counted: their output length is not
known. The tools list requests in completion order: rows are sorted by arrival. A benchmark whose
send times were set by the old server's speed (a closed-loop client: GuideLLM's synchronous and
concurrent strategies, ``vllm bench serve --request-rate inf --max-concurrency N``) or that
holds no arrival times is replayed only closed-loop (``closed_loop``), every request ready at 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefill_tuner.errors import TraceError
from prefill_tuner.trace.model import Adjustment
from prefill_tuner.trace.parsing import (
    MAX_TIMESTAMP,
    Row,
    check_count,
    ready_at_once,
    require_closed_loop,
)

Rows = tuple[list[Row], list[Adjustment]]


def tool_of_object(obj: object) -> str | None:
    """The tool whose export starts with this JSON value, or ``None``."""
    if not isinstance(obj, dict):
        return None
    keys = set(obj)
    if "benchmarks" in keys:
        return "guidellm"
    if {"metadata", "metrics"} <= keys or "input_config" in keys:
        return "aiperf"
    if (
        "input_lens" in keys
        or {"backend", "completed"} <= keys
        or {"num_prompts", "completed"} <= keys
    ):
        return "vllm-bench"
    return None


def parse_json(text: str) -> object:
    """The JSON value of ``text``; :class:`ValueError` (or RecursionError) if it is not one."""
    return json.loads(text)


def _document(text: str, path: Path, what: str, appended: str) -> dict[str, Any]:
    """The file as one JSON object; ``appended`` explains a file of several."""
    try:
        value = parse_json(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            raise TraceError(appended, path=path, line=exc.lineno) from None
        raise TraceError(f"not valid JSON ({exc.msg})", path=path, line=exc.lineno) from None
    except (ValueError, RecursionError):
        raise TraceError(
            "not valid JSON (nested too deeply or too long a number)", path=path
        ) from None
    if not isinstance(value, dict):
        raise TraceError(f"expected {what} (a JSON object), got {type(value).__name__}", path=path)
    return value


def _count(value: object, field: str, where: dict[str, Any]) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"expected a whole number, got {value!r:.40}", field=field, **where)
    return check_count(value, field, where)


def _time(value: object, field: str, where: dict[str, Any]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"expected a time in seconds, got {value!r:.40}", field=field, **where)
    if abs(value) > MAX_TIMESTAMP:
        raise TraceError(f"implausibly large, {value!r:.40}", field=field, **where)
    return float(value)


def _list(obj: dict[str, Any], key: str, length: int | None, where: dict[str, Any]) -> list[Any]:
    value = obj[key]
    if not isinstance(value, list):
        raise TraceError(f"expected a list, got {type(value).__name__}", field=key, **where)
    if length is not None and len(value) != length:
        raise TraceError(
            f"has {len(value)} entries but input_lens has {length}", field=key, **where
        )
    return value


def _in_order(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda row: row.clock)


# --- vllm bench serve -----------------------------------------------------------------------


def read_vllm_bench(text: str, path: Path, closed_loop: bool) -> Rows:
    """A ``vllm bench serve`` result: see the module's docstring."""
    result = _document(
        text,
        path,
        "a vllm bench serve result",
        "holds several results (vllm bench serve --append-result): keep the one to replay, "
        "one line, in a file of its own",
    )
    where: dict[str, Any] = {"path": path}
    if "input_lens" not in result or "output_lens" not in result:
        raise TraceError(
            "has no per-request records (input_lens, output_lens): vllm bench serve writes "
            "them with --save-result --save-detailed",
            path=path,
        )
    prompts = [
        _count(v, f"input_lens[{i}]", where)
        for i, v in enumerate(_list(result, "input_lens", None, where))
    ]
    n = len(prompts)
    outputs = [
        _count(v, f"output_lens[{i}]", where)
        for i, v in enumerate(_list(result, "output_lens", n, where))
    ]
    errors = _list(result, "errors", n, where) if result.get("errors") is not None else [""] * n
    arrivals = _vllm_arrivals(result, n, where)
    limit = _vllm_limit(result, where)
    rows: list[Row] = []
    failed = empty = 0
    for i in range(n):
        if errors[i]:
            failed += 1
        elif prompts[i] == 0 or outputs[i] == 0:
            empty += 1
        else:
            rows.append(Row(1, str(i), arrivals[i] if arrivals else 0, prompts[i], outputs[i]))
    notes = [
        Adjustment("dropped", "failed in the benchmark: their output length is unknown", failed),
        Adjustment("dropped", "0 input or output tokens: nothing to replay", empty),
    ]
    if arrivals is None:
        require_closed_loop(path, limit, closed_loop)
        rows, note = ready_at_once(rows, "this file has no arrival times")
        return rows, [*notes, note]
    if limit is not None and result.get("request_rate") in ("inf", math.inf):
        require_closed_loop(
            path,
            limit,
            closed_loop,
            f"the benchmark sent every request at once (request rate inf) through {limit} "
            "client slots",
        )
    elif limit is not None and not closed_loop:
        waits = _list(result, "queue_times", n, where) if "queue_times" in result else []
        waited = sum(1 for w in waits if isinstance(w, int | float) and w > 1e-3)
        reason = (
            f"waited in the benchmark for one of its {limit} client slots: replay with "
            f"`max_concurrency` {limit} to send them so"
        )
        notes.append(Adjustment("queued", reason, waited))
    return _in_order(rows), notes


def _vllm_arrivals(result: dict[str, Any], n: int, where: dict[str, Any]) -> list[float] | None:
    """Each request's arrival: its send time less its wait for a client slot."""
    if result.get("start_times") is None:
        return None
    starts = [
        _time(v, f"start_times[{i}]", where)
        for i, v in enumerate(_list(result, "start_times", n, where))
    ]
    if result.get("queue_times") is None:
        return starts
    waits = [
        _time(v, f"queue_times[{i}]", where)
        for i, v in enumerate(_list(result, "queue_times", n, where))
    ]
    return [start - wait for start, wait in zip(starts, waits, strict=True)]


def _vllm_limit(result: dict[str, Any], where: dict[str, Any]) -> int | None:
    value = result.get("max_concurrency")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(
            f"expected a whole number ≥ 1, got {value!r:.40}", field="max_concurrency", **where
        )
    return value


# --- GuideLLM -------------------------------------------------------------------------------

_CLOSED_STRATEGIES = {"synchronous", "concurrent", "throughput"}


def read_guidellm(text: str, path: Path, closed_loop: bool) -> Rows:
    """A GuideLLM report: see the module's docstring."""
    report = _document(
        text, path, "a GuideLLM report", "holds several JSON documents: a report is one"
    )
    where: dict[str, Any] = {"path": path}
    benchmarks = report.get("benchmarks")
    if not isinstance(benchmarks, list):
        raise TraceError("expected a list of benchmarks", field="benchmarks", **where)
    if not benchmarks:
        raise TraceError("the report holds no benchmarks", path=path)
    if len(benchmarks) > 1:
        kinds = ", ".join(_strategy_text(b) for b in benchmarks)
        raise TraceError(
            f"holds {len(benchmarks)} benchmarks ({kinds}); keep the one to replay, e.g. the "
            f"first: jq '.benchmarks |= [.[0]]' {path.name} > one.json",
            path=path,
        )
    benchmark = benchmarks[0]
    if not isinstance(benchmark, dict) or not isinstance(benchmark.get("requests"), dict):
        raise TraceError(
            "expected request lists by status", field="benchmarks[0].requests", **where
        )
    groups = benchmark["requests"]
    rows: list[Row] = []
    missing_arrival = False
    for index, stats in enumerate(_group(groups, "successful", where)):
        row = _guidellm_row(stats, index, where)
        missing_arrival |= math.isnan(row.clock)
        rows.append(row)
    errored = len(_group(groups, "errored", where))
    incomplete = len(_group(groups, "incomplete", where))
    notes = [
        Adjustment("dropped", "errored in the benchmark: their output length is unknown", errored),
        Adjustment("dropped", "incomplete when the benchmark ended: cut short", incomplete),
        _sampled(benchmark, len(rows) + errored + incomplete),
    ]
    kind, limit = _strategy(benchmark)
    if missing_arrival:
        require_closed_loop(path, limit, closed_loop)
        rows, note = ready_at_once(rows, "this file has no arrival times")
        return rows, [*notes, note]
    rows = _in_order(rows)
    if kind in _CLOSED_STRATEGIES and limit is not None:
        what = f"the benchmark ran {limit} concurrent stream{'s' if limit != 1 else ''} "
        what += f"(GuideLLM {kind}): its send times follow that server's speed"
        require_closed_loop(path, limit, closed_loop, what)
        rows, note = ready_at_once(rows, f"sent by {limit} concurrent streams")
        notes.append(note)
    return rows, notes


def _group(groups: dict[str, Any], status: str, where: dict[str, Any]) -> list[Any]:
    value = groups.get(status) or []
    if not isinstance(value, list):
        raise TraceError("expected a list", field=f"requests.{status}", **where)
    return value


def _guidellm_row(stats: object, index: int, where: dict[str, Any]) -> Row:
    """One successful request (arrival NaN when the file has none)."""
    if not isinstance(stats, dict):
        raise TraceError("expected a request's statistics (an object)", field="requests", **where)
    ident = stats.get("request_id")
    ident = ident if isinstance(ident, str) and ident else str(index)
    named = {"path": where["path"]}
    counts = []
    for key in ("prompt_tokens", "output_tokens"):
        value = stats.get(key)
        if value is None:
            raise TraceError(
                f"request {ident} has no token count (the server reported no usage)",
                field=key,
                **named,
            )
        counts.append(_count(value, key, named))
    clock = math.nan
    for key, value in _scheduled_starts(stats):
        if value is not None and not (isinstance(value, int | float) and value < 0):
            clock = _time(value, key, named)
            break
    return Row(1, ident, clock, counts[0], counts[1])


def _obj(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a part the file leaves out)."""
    return value if isinstance(value, dict) else {}


def _scheduled_starts(stats: dict[str, Any]) -> list[tuple[str, Any]]:
    """Where each GuideLLM release keeps a request's scheduled start, then its send time."""
    timings = _obj(_obj(stats.get("info")).get("timings"))
    legacy = _obj(stats.get("scheduler_info"))  # GuideLLM 0.3
    return [
        ("info.timings.targeted_start", timings.get("targeted_start")),
        ("scheduler_info.targeted_start_time", legacy.get("targeted_start_time")),
        ("request_start_time", stats.get("request_start_time")),
        ("start_time", stats.get("start_time")),
    ]


def _strategy_of(benchmark: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's scheduling strategy (``config``: GuideLLM 0.4 and later; ``args``: 0.3)."""
    return _obj(_obj(benchmark.get("config") or benchmark.get("args")).get("strategy"))


def _strategy(benchmark: dict[str, Any]) -> tuple[str | None, int | None]:
    """The benchmark's strategy and its client limit (``None``: open loop or unlimited)."""
    strategy = _strategy_of(benchmark)
    kind = strategy.get("type_")
    limit = (
        1 if kind == "synchronous" else strategy.get("streams") or strategy.get("max_concurrency")
    )
    valid = isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1
    return (kind if isinstance(kind, str) else None), (limit if valid else None)


def _strategy_text(benchmark: object) -> str:
    """``constant 2 req/s``, ``concurrent 4``, ``synchronous``: for a list of benchmarks."""
    benchmark = _obj(benchmark)
    kind, limit = _strategy(benchmark)
    rate = _strategy_of(benchmark).get("rate")
    if isinstance(rate, int | float) and not isinstance(rate, bool):
        return f"{kind} {rate:g} req/s"
    return f"{kind} {limit}" if limit is not None and kind != "synchronous" else str(kind)


def _sampled(benchmark: dict[str, Any], listed: int) -> Adjustment:
    """Requests the benchmark made that its file does not keep (``--sample-requests``)."""
    total = _obj(_obj(benchmark.get("metrics")).get("request_totals")).get("total")
    missing = total - listed if isinstance(total, int) and not isinstance(total, bool) else 0
    reason = (
        f"the benchmark made {total} requests, the file keeps {listed} (GuideLLM "
        "--sample-requests): the replay is thinner than the benchmark"
    )
    return Adjustment("missing", reason, max(missing, 0))


# --- AIPerf ---------------------------------------------------------------------------------


def read_aiperf(text: str, path: Path, closed_loop: bool) -> Rows:
    """AIPerf's ``profile_export.jsonl``: see the module's docstring."""
    _refuse_summary(text, path)
    rows: list[Row] = []
    warm = failed = empty = 0
    missing_arrival = False
    for index, raw in enumerate(text.split("\n")):
        if not raw.strip():
            continue
        where: dict[str, Any] = {"path": path, "line": index + 1}
        record = _record(raw, where)
        metadata = record["metadata"]
        if metadata.get("benchmark_phase") == "warmup":
            warm += 1
            continue
        if record.get("error") is not None or metadata.get("was_cancelled") is True:
            failed += 1
            continue
        metrics = record.get("metrics")
        if not isinstance(metrics, dict):
            raise TraceError("expected an object of metrics", field="metrics", **where)
        prompt = _metric(metrics, "input_sequence_length", where)
        output = _metric(metrics, "output_sequence_length", where)
        clock = _aiperf_clock(metadata, where)
        missing_arrival |= clock is None
        ident = metadata.get("x_request_id")
        ident = ident if isinstance(ident, str) and ident else str(index)
        if prompt == 0 or output == 0:
            empty += 1
            continue
        rows.append(Row(index + 1, ident, clock or 0, prompt, output))
    notes = [
        Adjustment("dropped", "warm-up requests (AIPerf's warmup phase)", warm),
        Adjustment(
            "dropped", "failed or cancelled in the benchmark: output length unknown", failed
        ),
        Adjustment("dropped", "0 input or output tokens: nothing to replay", empty),
    ]
    if missing_arrival:
        require_closed_loop(path, None, closed_loop)
        rows, note = ready_at_once(rows, "this file has no arrival times")
        return rows, [*notes, note]
    return _in_order(rows), notes


def _refuse_summary(text: str, path: Path) -> None:
    """``profile_export_aiperf.json`` (one indented object of statistics) is not requests."""
    first = text.lstrip()[:1]
    if first != "{" or "\n" not in text.strip():
        return
    try:
        value = parse_json(text)
    except (ValueError, RecursionError):
        return
    if isinstance(value, dict) and "metadata" not in value:
        raise TraceError(
            "holds AIPerf's summary statistics, not its requests: pass the "
            "profile_export.jsonl beside it",
            path=path,
        )


def _record(raw: str, where: dict[str, Any]) -> dict[str, Any]:
    try:
        record = parse_json(raw.strip())
    except json.JSONDecodeError as exc:
        raise TraceError(f"not valid JSON ({exc.msg})", **where) from None
    except (ValueError, RecursionError):
        raise TraceError(
            "not valid JSON (nested too deeply or too long a number)", **where
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("metadata"), dict):
        raise TraceError("expected an AIPerf record with its metadata", field="metadata", **where)
    return record


def _metric(metrics: dict[str, Any], tag: str, where: dict[str, Any]) -> int:
    field = f"metrics.{tag}"
    entry = metrics.get(tag)
    if not isinstance(entry, dict) or "value" not in entry:
        raise TraceError("missing (a successful record carries it)", field=field, **where)
    return _count(entry["value"], field, where)


def _aiperf_clock(metadata: dict[str, Any], where: dict[str, Any]) -> int | None:
    """Wall-clock nanoseconds: the credit's issue (the arrival), else the send."""
    for key in ("credit_issued_ns", "request_start_ns"):
        value = metadata.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**21:
            raise TraceError(
                f"expected nanoseconds, a whole number ≥ 0, got {value!r:.40}",
                field=f"metadata.{key}",
                **where,
            )
        return value
    return None


READERS: dict[str, tuple[Callable[[str, Path, bool], Rows], int]] = {
    # format: (reader, clock ticks per second); arrivals are re-based to the first request
    "vllm-bench": (read_vllm_bench, 1),
    "guidellm": (read_guidellm, 1),
    "aiperf": (read_aiperf, 1_000_000_000),
}
