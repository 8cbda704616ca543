"""The traces operators already have: vllm bench serve, GuideLLM and AIPerf exports, a CSV
with named columns, and the seconds-for-milliseconds mistake in a native JSONL trace.

The fixtures in tests/data/tool_exports/ follow each tool's own schema (its README names the
source file and version of each)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from prefill_tuner.errors import TraceError
from prefill_tuner.trace import FORMAT_ALIASES, detect_format, load_trace, read_trace
from prefill_tuner.trace.shaping import ShapeOptions
from tests.conftest import MOONCAKE

DATA = Path(__file__).parent / "data" / "tool_exports"


def error_of(path: Path, **kwargs: object) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_trace(path, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(str(path))
    return info.value


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def reasons(trace_adjustments: object) -> dict[str, int]:
    return {note.reason: note.count for note in trace_adjustments}  # type: ignore[attr-defined]


# --- vllm bench serve ----------------------------------------------------------------------


def test_vllm_bench_detailed_result() -> None:
    path = DATA / "vllm_bench_detailed.json"
    assert detect_format(path) == "vllm-bench"
    trace = read_trace(path)
    result = json.loads(path.read_text())
    # Arrival: the send time less the wait for a client slot (open loop: microseconds).
    arrivals = [s - q for s, q in zip(result["start_times"], result["queue_times"], strict=True)]
    kept = [0, 1, 2, 4, 5]  # request 3 failed: its output length is unknown
    assert [r.id for r in trace.requests] == [str(i) for i in kept]
    assert [r.arrival_s for r in trace.requests] == pytest.approx(
        [arrivals[i] - arrivals[0] for i in kept], abs=1e-9
    )
    assert [r.prompt_tokens for r in trace.requests] == [1024, 2310, 512, 733, 1801]
    assert [r.output_tokens for r in trace.requests] == [128, 64, 256, 32, 200]
    assert [(a.action, a.count) for a in trace.adjustments] == [("dropped", 1)]
    assert "failed" in trace.adjustments[0].reason
    assert trace.source is not None and trace.source.format == "vllm-bench"


def test_vllm_bench_without_save_detailed_says_so() -> None:
    error = error_of(DATA / "vllm_bench_summary.json")
    assert "--save-detailed" in error.message and "per-request" in error.message


def test_vllm_bench_closed_loop_needs_the_client_limit() -> None:
    path = DATA / "vllm_bench_closed_loop.json"
    error = error_of(path)
    assert "`max_concurrency` 2" in error.message and "closed-loop" in error.message
    trace = read_trace(path, closed_loop=True)
    assert len(trace) == 5
    # Every request arrived at once; the benchmark sent them two at a time.
    assert max(r.arrival_s for r in trace.requests) < 1e-3


def test_vllm_bench_without_arrival_times(tmp_path: Path) -> None:
    """Older vllm bench serve results carry lengths but no start_times."""
    result = json.loads((DATA / "vllm_bench_detailed.json").read_text())
    del result["start_times"], result["queue_times"]
    result["max_concurrency"] = 8
    path = write(tmp_path, "old.json", json.dumps(result))
    error = error_of(path)
    assert error.message.startswith("this file has no arrival times")
    assert "closed-loop with `max_concurrency` 8" in error.message
    trace = read_trace(path, closed_loop=True)
    assert [r.arrival_s for r in trace.requests] == [0.0] * 5
    assert [r.prompt_tokens for r in trace.requests] == [1024, 2310, 512, 733, 1801]
    assert any("no arrival times" in note.reason for note in trace.adjustments)


def test_vllm_bench_appended_results_and_bad_fields(tmp_path: Path) -> None:
    line = (DATA / "vllm_bench_detailed.json").read_text().strip()
    appended = write(tmp_path, "a.json", line + "\n" + line + "\n")
    error = error_of(appended, format="vllm-bench")
    assert "--append-result" in error.message and error.line == 2
    result = json.loads(line)
    result["output_lens"] = result["output_lens"][:-1]
    error = error_of(write(tmp_path, "short.json", json.dumps(result)))
    assert error.field == "output_lens" and "6" in error.message and "5" in error.message
    result = json.loads(line)
    result["input_lens"][2] = -4
    error = error_of(write(tmp_path, "neg.json", json.dumps(result)))
    assert error.field == "input_lens[2]" and "negative" in error.message


# --- GuideLLM ------------------------------------------------------------------------------


def test_guidellm_report() -> None:
    path = DATA / "guidellm_benchmarks.json"
    assert detect_format(path) == "guidellm"
    trace = read_trace(path)
    # Listed in completion order; read in arrival (targeted start) order.
    assert [r.id for r in trace.requests] == [f"7f1c9d2e-000{i}" for i in range(4)]
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 0.5, 1.0, 1.5])
    assert [r.prompt_tokens for r in trace.requests] == [1024, 2310, 512, 733]
    assert [r.output_tokens for r in trace.requests] == [128, 64, 256, 32]
    counts = reasons(trace.adjustments)
    assert sorted(counts.values()) == [1, 1]
    assert any("errored" in reason for reason in counts)
    assert any("incomplete" in reason for reason in counts)


def test_guidellm_concurrent_benchmark_replays_closed_loop() -> None:
    path = DATA / "guidellm_concurrent.json"
    error = error_of(path)
    assert "4 concurrent streams" in error.message and "`max_concurrency` 4" in error.message
    trace = read_trace(path, closed_loop=True)
    # Each stream sent its next request as the last finished: in a closed-loop replay every
    # request is ready at once, in the order they were sent.
    assert [r.arrival_s for r in trace.requests] == [0.0] * 4
    assert [r.id for r in trace.requests] == [f"7f1c9d2e-000{i}" for i in range(4)]


def test_guidellm_sweep_and_missing_pieces(tmp_path: Path) -> None:
    report = json.loads((DATA / "guidellm_benchmarks.json").read_text())
    sweep = dict(report, benchmarks=report["benchmarks"] * 3)
    error = error_of(write(tmp_path, "sweep.json", json.dumps(sweep)))
    assert "3 benchmarks" in error.message and "jq" in error.message
    empty = dict(report, benchmarks=[])
    assert "no benchmarks" in error_of(write(tmp_path, "e.json", json.dumps(empty))).message
    broken = json.loads(json.dumps(report))
    broken["benchmarks"][0]["requests"]["successful"][1]["prompt_tokens"] = None
    error = error_of(write(tmp_path, "p.json", json.dumps(broken)))
    assert error.field == "prompt_tokens" and "request 7f1c9d2e-0000" in error.message
    sampled = json.loads(json.dumps(report))
    sampled["benchmarks"][0]["metrics"]["request_totals"]["total"] = 60
    trace = read_trace(write(tmp_path, "s.json", json.dumps(sampled)))
    assert any(note.action == "missing" and note.count == 54 for note in trace.adjustments)


# --- AIPerf --------------------------------------------------------------------------------


def test_aiperf_profile_export() -> None:
    path = DATA / "aiperf_profile_export.jsonl"
    assert detect_format(path) == "aiperf"
    trace = read_trace(path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 1.0, 2.2505], abs=1e-9)
    assert [r.prompt_tokens for r in trace.requests] == [550, 2048, 1200]
    assert [r.output_tokens for r in trace.requests] == [9, 40, 300]
    assert trace.requests[0].id == "7609a2e7-aa53-4ab1-98f4-000000000001"
    counts = reasons(trace.adjustments)
    assert sorted(counts.values()) == [1, 1]
    assert any("warm" in reason for reason in counts)
    assert any("failed" in reason for reason in counts)


def test_aiperf_send_time_and_bad_records(tmp_path: Path) -> None:
    lines = (DATA / "aiperf_profile_export.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for record in records:  # AIPerf before credit_issued_ns: the send time
        del record["metadata"]["credit_issued_ns"]
    path = write(tmp_path, "p.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    assert read_trace(path).requests[1].arrival_s == pytest.approx(1.0, abs=1e-9)
    del records[2]["metrics"]["output_sequence_length"]
    path = write(tmp_path, "q.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    error = error_of(path)
    assert (error.line, error.field) == (3, "metrics.output_sequence_length")
    summary = write(tmp_path, "profile_export_aiperf.json", '{\n  "input_config": {}\n}\n')
    error = error_of(summary, format="aiperf")
    assert "profile_export.jsonl" in error.message


# --- CSV with named columns ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "times", "expected"),
    [
        ("arrival_time_s,prompt_tokens,output_tokens", ("10", "10.25"), 0.25),
        ("timestamp_ms,input_tokens,output_tokens", ("1000", "1250"), 0.25),
        ("Arrival (ms),Prompt Tokens,Completion Tokens", ("0", "250"), 0.25),
        ("time_us,input_length,output_length", ("5", "250005"), 0.25),
        ("start_time_ns,isl,osl", ("1749737703000000000", "1749737703250000000"), 0.25),
        ("arrived_at,num_prefill_tokens,num_decode_tokens", ("0.5", "0.75"), 0.25),
        (
            "timestamp,prompt_len,output_len",
            ("2024-05-12 00:00:00", "2024-05-12 00:00:00.25"),
            0.25,
        ),
    ],
)
def test_csv_with_named_columns(
    tmp_path: Path, header: str, times: tuple[str, str], expected: float
) -> None:
    path = write(tmp_path, "t.csv", f"{header}\n{times[0]},100,10\n{times[1]},200,20\n")
    assert detect_format(path) == "csv"
    trace = read_trace(path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, expected], abs=1e-9)
    assert [(r.prompt_tokens, r.output_tokens) for r in trace.requests] == [(100, 10), (200, 20)]


def test_csv_columns_ids_classes_and_errors(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.csv",
        "request_id,class,arrival_ms,prompt_tokens,output_tokens\n"
        "a,chat,0,100,10\nb,,5,100,0\nc,doc,9,300,7\n",
    )
    trace = read_trace(path)
    assert [(r.id, r.traffic_class) for r in trace.requests] == [("a", "chat"), ("c", "doc")]
    assert [(a.action, a.count) for a in trace.adjustments] == [("dropped", 1)]
    unitless = write(tmp_path, "u.csv", "timestamp,prompt_tokens,output_tokens\n12,5,5\n")
    error = error_of(unitless)
    assert (error.line, error.field) == (2, "timestamp")
    assert "unit" in error.message and "timestamp_ms" in error.message
    missing = write(tmp_path, "m.csv", "arrival_s,prompt_tokens,tokens_out\n1,5,5\n")
    error = error_of(missing, format="csv")
    assert error.line == 1 and "output tokens" in error.message and "output_tokens" in error.message
    bad = write(tmp_path, "b.csv", "arrival_s,prompt_tokens,output_tokens\nsoon,5,5\n")
    assert error_of(bad).field == "arrival_s"
    times = write(
        tmp_path, "two.csv", "arrival_s,arrival_ms,prompt_tokens,output_tokens\n1,1,1,1\n"
    )
    assert "arrival_s" in error_of(times).message and "arrival_ms" in error_of(times).message


def test_csv_without_arrival_times(tmp_path: Path) -> None:
    path = write(tmp_path, "d.csv", "prompt_tokens,output_tokens\n100,10\n300,30\n")
    error = error_of(path)
    assert error.message == (
        "this file has no arrival times: replay it closed-loop with `max_concurrency` N"
    )
    trace = read_trace(path, closed_loop=True)
    assert [r.arrival_s for r in trace.requests] == [0.0, 0.0]
    # load_trace reads it closed-loop when the shaping says so.
    shaped = load_trace(str(path), options=ShapeOptions(max_concurrency=4))
    assert len(shaped) == 2


# --- The native JSONL's unit ---------------------------------------------------------------


def jsonl(path: Path, timestamps: list[float]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 10, "output_length": 2}) + "\n"
            for t in timestamps
        )
    )
    return path


def test_seconds_in_a_jsonl_trace_are_warned_once(tmp_path: Path) -> None:
    seconds = jsonl(tmp_path / "s.jsonl", [i * 0.9 for i in range(1000)])
    trace = read_trace(seconds)
    (warning,) = [note for note in trace.adjustments if note.action == "suspect"]
    assert warning.count == 1000
    assert "seconds" in warning.reason and "milliseconds" in warning.reason
    assert "`rate_scale` 0.001" in warning.reason
    # Milliseconds as meant, a burst at one instant, and a short file: no warning.
    for timestamps in (
        [i * 900.0 for i in range(1000)],
        [0.0] * 1000,
        [i * 0.9 for i in range(50)],
    ):
        quiet = read_trace(jsonl(tmp_path / "q.jsonl", timestamps))
        assert not [note for note in quiet.adjustments if note.action == "suspect"]
    assert not read_trace(MOONCAKE).adjustments


def test_the_cli_prints_the_warning_and_the_flag(
    tmp_path: Path, tune: Callable[..., tuple[int, str, str]]
) -> None:
    seconds = jsonl(tmp_path / "s.jsonl", [i * 0.5 for i in range(200)])
    code, out, err = tune("trace", "stats", str(seconds))
    assert code == 0
    assert out.count("look like seconds") == 1 and "--rate-scale 0.001" in out
    code, out, err = tune("trace", "stats", str(DATA / "vllm_bench_closed_loop.json"))
    assert code == 2 and err.count("\n") == 1
    assert "replay it closed-loop with --max-concurrency 2" in err
    code, out, err = tune("trace", "stats", str(DATA / "aiperf_profile_export.jsonl"))
    assert code == 0 and "3" in out


def test_every_format_has_an_alias() -> None:
    for name in ("vllm-bench", "vllm", "guidellm", "aiperf", "csv"):
        assert name in FORMAT_ALIASES
