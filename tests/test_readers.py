"""Readers: every format's quirks, and a located, one-line error for every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefill_tuner.errors import TraceError
from prefill_tuner.trace import detect_format, read_trace


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


def error_of(path: Path, **kwargs: object) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_trace(path, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    return info.value


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


# --- JSONL -------------------------------------------------------------------------------------


def test_jsonl_ids_blocks_and_native_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.jsonl",
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
        "\n"
        '{"id": "abc", "timestamp": 1500.5, "input_length": 20, "output_length": 1,'
        ' "hash_ids": [7], "block_size": 16}\n'
        '{"timestamp": 2000, "input_length": 20, "output_length": 3}\n',
    )
    trace = read_trace(path)
    first, second, third = trace.requests
    assert (first.id, first.arrival_s, first.prefix_blocks, first.prefix_block_size) == (
        "0",
        0.0,
        (1, 2),
        512,
    )
    assert (second.id, second.arrival_s, second.prefix_block_size) == ("abc", 1.5005, 16)
    # Ids are 0-based data-row indices: the blank line is not a row.
    assert third.id == "3" and third.prefix_blocks == () and third.prefix_block_size is None
    assert detect_format(path) == "jsonl"


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ('{"input_length": 5, "output_length": 5}', "timestamp", "missing"),
        ('{"timestamp": "0", "input_length": 5, "output_length": 5}', "timestamp", "number"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 5}', "timestamp", "≥ 0"),
        ('{"timestamp": 0, "input_length": -5, "output_length": 5}', "input_length", "negative"),
        ('{"timestamp": 0, "input_length": 5.5, "output_length": 5}', "input_length", "whole"),
        ('{"timestamp": 0, "input_length": true, "output_length": 5}', "input_length", "whole"),
        ('{"timestamp": 0, "input_length": 5, "output_length": "7"}', "output_length", "whole"),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1, -2]}',
            "hash_ids",
            "list",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1, 2]}',
            "hash_ids",
            "at most 1",
        ),
        (
            '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1],'
            ' "block_size": 0}',
            "block_size",
            "at least 1",
        ),
        ('{"timestamp": 0, "input_length": 5, "output_length": 5, "id": [1]}', "id", "string"),
    ],
)
def test_jsonl_field_errors_name_line_and_field(
    tmp_path: Path, line: str, field: str, words: str
) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
    error = error_of(write(tmp_path, "t.jsonl", good + line + "\n"))
    assert (error.line, error.field) == (2, field)
    assert words in error.message
    assert str(error).startswith(f"{tmp_path / 't.jsonl'}:2: field '{field}': ")


def test_jsonl_syntax_errors(tmp_path: Path) -> None:
    error = error_of(write(tmp_path, "t.jsonl", '{"timestamp": 0,\n'))
    assert error.line == 1 and "not valid JSON" in error.message
    error = error_of(
        write(
            tmp_path, "t.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n[1, 2]\n'
        ),
        format="jsonl",
    )
    assert error.line == 2 and "JSON object" in error.message


def test_zero_lengths_are_dropped_and_counted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 0}\n'
        '{"timestamp": 1, "input_length": 5, "output_length": 2}\n',
    )
    trace = read_trace(path)
    assert [r.id for r in trace.requests] == ["1"]
    assert [(a.action, a.count) for a in trace.adjustments] == [("dropped", 1)]


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.jsonl",
        '{"id": "a", "timestamp": 0, "input_length": 5, "output_length": 2}\n'
        '{"id": "a", "timestamp": 1, "input_length": 5, "output_length": 2}\n',
    )
    error = error_of(path)
    assert (error.line, error.field) == (2, "id") and "first on line 1" in error.message


def test_unsorted_arrivals_are_refused_or_sorted_on_request(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.jsonl",
        '{"timestamp": 10, "input_length": 5, "output_length": 2}\n'
        '{"timestamp": 5, "input_length": 6, "output_length": 2}\n'
        '{"timestamp": 20, "input_length": 7, "output_length": 2}\n',
    )
    error = error_of(path)
    assert error.line == 2 and "`sort`" in error.message  # the field (--sort on the CLI)
    trace = read_trace(path, sort=True)
    assert [r.id for r in trace.requests] == ["1", "0", "2"]
    assert [(a.action, a.count) for a in trace.adjustments] == [("reordered", 1)]


# --- Azure -------------------------------------------------------------------------------------


def test_azure_timestamps_fractions_and_zones(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "a.csv",
        AZURE_HEADER
        + "2023-11-16 23:59:59.9999999,10,2\r\n"
        + "2023-11-17 00:00:00,11,3\r\n"  # no fraction, next day
        + "2023-11-17 00:00:00.000000001,12,4\r\n",  # 9 digits
    )
    arrivals = [r.arrival_s for r in read_trace(path).requests]
    assert arrivals == [0.0, 1e-7, 1.01e-7]

    zoned = write(
        tmp_path,
        "z.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-12 00:00:00.001163+00:00,10,2\n"
        "2024-05-12T02:00:00.5+02:00,10,2\n"  # same instant + 0.498837 s
        "2024-05-12 00:00:01Z,10,2\n",
    )
    arrivals = [r.arrival_s for r in read_trace(zoned).requests]
    assert arrivals == pytest.approx([0.0, 0.498837, 0.998837], abs=1e-12)


def test_azure_extra_columns_in_any_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "m.csv",
        "GeneratedTokens,NumImages,TIMESTAMP,ContextTokens\n4,1,2025-01-01 00:00:00,9\n",
    )
    (request,) = read_trace(path).requests
    assert (request.prompt_tokens, request.output_tokens) == (9, 4)


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ("2023-11-16 18:15:46,-1,5", "ContextTokens", "negative"),
        ("2023-11-16 18:15:46,12.5,5", "ContextTokens", "whole"),
        ("2023-11-16 18:15:46,12,", "GeneratedTokens", "whole"),
        ("16/11/2023 18:15,12,5", "TIMESTAMP", "expected a time"),
        ("2023-02-30 18:15:46,12,5", "TIMESTAMP", "not a valid date"),
        ("2023-11-16 18:15:46+01:00,12,5", "TIMESTAMP", "time zone"),
    ],
)
def test_azure_row_errors(tmp_path: Path, row: str, field: str, words: str) -> None:
    path = write(tmp_path, "a.csv", AZURE_HEADER + "2023-11-16 18:15:40,1,1\r\n" + row + "\r\n")
    error = error_of(path)
    assert (error.line, error.field) == (3, field)
    assert words in error.message


def test_csv_structure_errors(tmp_path: Path) -> None:
    error = error_of(write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:40,1\n"))
    assert error.line == 1 and "'GeneratedTokens'" in error.message
    error = error_of(write(tmp_path, "a.csv", AZURE_HEADER + "2023-11-16 18:15:40,1\r\n"))
    assert error.line == 2 and "3 fields" in error.message
    error = error_of(write(tmp_path, "a.csv", AZURE_HEADER))
    assert "no replayable requests" in error.message
    error = error_of(write(tmp_path, "a.csv", AZURE_HEADER + '2023-11-16 18:15:40,1,"1\r\n'))
    assert "malformed CSV" in error.message


# --- BurstGPT ----------------------------------------------------------------------------------


def test_burstgpt_with_session_columns_and_failures(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.csv",
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,"
        "Log Type\n"
        "100,s1,0,ChatGPT,10,5,15,Conversation log\n"
        "101.5,s1,1,ChatGPT,10,0,10,Conversation log\n"
        "103,s2,0,GPT-4,0,7,7,API log\n"
        "110,s2,3,GPT-4,20,8,28,API log\n",
    )
    trace = read_trace(path)
    assert detect_format(path) == "burstgpt"
    assert [(r.id, r.arrival_s) for r in trace.requests] == [("0", 0.0), ("3", 10.0)]
    assert sorted((a.reason, a.count) for a in trace.adjustments) == [
        ("0 request tokens: nothing to prefill", 1),
        ("failed requests (0 response tokens)", 1),
    ]


def test_burstgpt_bad_timestamp(tmp_path: Path) -> None:
    error = error_of(write(tmp_path, "b.csv", BURST_HEADER + "soon,ChatGPT,1,1,2,x\n"))
    assert (error.line, error.field) == (2, "Timestamp")


# --- Files and detection -----------------------------------------------------------------------


def test_file_level_errors(tmp_path: Path) -> None:
    assert "empty" in error_of(write(tmp_path, "e.jsonl", "")).message
    assert "empty" in error_of(write(tmp_path, "e.csv", "\r\n  \n")).message
    assert "cannot read" in error_of(tmp_path / "missing.jsonl").message
    error = error_of(write(tmp_path, "u.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\n"))
    assert error.line == 2 and "UTF-8" in error.message
    error = error_of(write(tmp_path, "x.csv", "a,b\n1,2\n"))
    assert "`format`" in error.message  # the field (--format on the CLI)
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(write(tmp_path, "y.jsonl", "{}\n"), format="parquet")


def test_bom_and_explicit_format(tmp_path: Path) -> None:
    path = write(tmp_path, "b.txt", "\ufeff" + AZURE_HEADER + "2023-11-16 18:15:40,3,4\r\n")
    assert read_trace(path).requests[0].prompt_tokens == 3
    assert read_trace(path, format="azure").source.format == "azure"
    error = error_of(path, format="burstgpt")
    assert "missing column" in error.message and "'Request tokens'" in error.message
