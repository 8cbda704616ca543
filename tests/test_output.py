"""What people read and copy: the answer first (the recommendation, its serve line, then the
table, then two alternatives); the results table fits 80 columns without cutting a value;
every serve line is printed whole on one line, in a terminal and piped, so a pasted line runs;
piped output is plain; a saturated server is said to be."""

from __future__ import annotations

import io
import random
import re
import shlex
from pathlib import Path

import pytest
from rich.console import Console

from prefill_tuner.cli.tables import render_summary
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.recommend import RULE
from prefill_tuner.study.summary import summarize_stored
from prefill_tuner.trace.model import Request
from prefill_tuner.trace.native import write_native
from tests.test_tuning_loop import run_args


def test_the_table_fits_80_columns_and_serve_lines_are_never_wrapped(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, out, err = tune(*run_args(storage, 8))
    assert code == 0, err
    piped = [line for line in out.splitlines() if line.startswith("vllm serve")]
    assert piped, out
    for line in piped:  # whole: the model, then every knob, ending in the last flag's value
        words = shlex.split(line)
        assert words[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
        assert "--max-num-batched-tokens" in words and "--max-num-seqs" in words
    assert not [line for line in out.splitlines() if line.startswith("--")], "a wrapped line"

    summary = summarize_stored(TunerStore(storage), "s")
    terminal = io.StringIO()
    Console(file=terminal, width=80, force_terminal=True, color_system=None).print(
        render_summary(summary), crop=False
    )
    text = terminal.getvalue()
    assert "…" not in text, "a value was cut"
    start = text.index("Pareto-optimal")
    table = text[start : text.index("alternatives", start)].splitlines()
    assert max(len(line.rstrip()) for line in table) <= 80
    assert [line for line in text.splitlines() if line.startswith("vllm serve")] == piped


def _serve_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("vllm serve")]


def _next_commands(text: str) -> list[list[str]]:
    """The commands the output says to run next, as argument lists (comments dropped)."""
    return [
        shlex.split(line, comments=True) for line in text.splitlines() if line.startswith("  tune ")
    ]


@pytest.mark.slow
def test_the_answer_comes_first_then_the_table_then_two_alternatives(
    tune, tmp_path: Path, monkeypatch
) -> None:
    """Issue 41 item 10: the recommendation and its serve line lead; then the Pareto table;
    then at most two alternatives (--all: every one); the rules only with --explain; where
    the study is kept and the next commands, each of which runs as printed."""
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, out, err = tune(*run_args(storage, 12, slos=("p99_tpot=50ms",)))
    assert code == 0, err
    summary = summarize_stored(TunerStore(storage), "s")
    assert summary.recommended is not None and len(summary.pareto) >= 4, out
    lines = out.splitlines()
    assert lines[0].startswith(f"recommended: trial {summary.recommended.trial_number}; "), out
    assert "against the engine defaults: p99 TPOT " in lines[0] or "already the best" in lines[0]
    assert lines[1] == summary.recommended.serve_command
    assert out.index("Pareto-optimal settings") < out.index("alternatives")
    assert len(_serve_lines(out)) == 3, out
    assert RULE not in " ".join(out.split()) and "headroom rule" not in out
    # Every alternative with --all; the reasoning with --explain.
    code, every, err = tune("pareto", "--storage", storage, "--all")
    assert code == 0, err
    assert sorted(_serve_lines(every)) == sorted(t.serve_command for t in summary.pareto)
    code, explained, err = tune("pareto", "--storage", storage, "--explain")
    assert code == 0, err
    assert RULE in explained and "headroom rule:" in explained
    assert len(_serve_lines(explained)) == 3
    # Where the study is, and what to run next: each command runs as printed.
    assert f"is stored in {storage}; next:" in out
    commands = _next_commands(out)
    # (the tests run with --no-report: tests/conftest.py)
    assert [command[1] for command in commands] == ["export", "diagnose", "report", "pareto"]
    for command in _next_commands(every):
        code, _, err = tune(*command[1:])
        assert code == 0, (command, err)
    yaml_file = tmp_path / "s.yaml"
    assert f"max-num-batched-tokens: {summary.recommended.settings['max_num_batched_tokens']}" in (
        yaml_file.read_text()
    )
    assert (tmp_path / "s-report.html").is_file()
    assert commands == _next_commands(every)


def test_a_column_that_says_nothing_is_left_out(tune, tmp_path: Path) -> None:
    """Issue 41 item 10: tok/s is the same in every row of an open-loop replay the server
    keeps up with: no column; when it differs, it is shown."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 8, slos=("p99_tpot=50ms",)))
    assert code == 0, err
    summary = summarize_stored(TunerStore(storage), "s")
    assert len(summary.pareto) >= 2

    def header() -> str:
        terminal = io.StringIO()
        Console(file=terminal, width=80, color_system=None).print(render_summary(summary))
        text = terminal.getvalue()
        return next(line for line in text.splitlines() if line.startswith("trial "))

    for trial in summary.pareto:  # records read back, never written again
        trial.metrics = {**(trial.metrics or {}), "output_throughput": 315.0}
    assert "tok/s" not in header() and "p99_tpot" in header()
    summary.pareto[1].metrics = {**(summary.pareto[1].metrics or {}), "output_throughput": 300.0}
    assert "tok/s" in header()


def test_piped_output_is_plain_and_a_terminal_gets_80_columns(
    tune, tmp_path: Path, monkeypatch
) -> None:
    """Issue 41 item 13: piped (no COLUMNS), no line is broken inside a sentence nor ends in
    spaces, so a grep for a sentence finds it; in an 80-column terminal every table and
    prose line fits."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 8, slos=("p99_tpot=50ms",)))
    assert code == 0, err
    code, out, err = tune("pareto", "--storage", storage, "--explain")
    assert code == 0, err
    assert [line for line in out.splitlines() if line != line.rstrip()] == []
    assert any(line.endswith(f"chosen by the {RULE}") for line in out.splitlines()), out
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: a terminal, though captured
    monkeypatch.setenv("NO_COLOR", "1")
    code, out, err = tune("pareto", "--storage", storage, "--explain")
    assert code == 0, err
    text = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "Pareto-optimal" in text
    wide = [
        line
        for line in text.splitlines()
        if len(line.rstrip()) > 80 and not line.startswith(("vllm serve", "  tune "))
    ]
    assert wide == []


def test_a_saturated_server_is_said_to_be_with_what_to_do(tune, tmp_path: Path) -> None:
    """Issue 41 item 11: with only a TPOT SLO, a trace that keeps the server busy gets a
    recommendation whose p99 TTFT is mostly queue: the output says so and what to do; the
    same trace at a tenth of the rate does not."""
    rng = random.Random(0)
    arrival, requests = 0.0, []
    for i in range(300):
        arrival += rng.expovariate(30.0)
        requests.append(Request(f"r{i}", arrival, rng.randint(3000, 5000), rng.randint(50, 150)))
    trace = tmp_path / "busy.jsonl"
    write_native(requests, trace)
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["run", "--trace", str(trace), "--slo", "p99_tpot=50ms", "--trials", "6"]
    code, out, err = tune(*args, "--storage", storage, "--study", "busy", "--no-report")
    assert code == 0, err
    saturated = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(saturated) == 1, out
    warning = saturated[0]
    assert warning.startswith("warning: the server is saturated at this load: p99_ttft ")
    assert "--slo p99_ttft=LIMIT" in warning and "tune plan" in warning
    assert out.index(warning) < out.index("Pareto-optimal")
    code, again, err = tune("pareto", "--storage", storage, "--study", "busy")
    assert code == 0 and warning in again, err
    code, out, err = tune(
        *args, "--rate-scale", "0.1", "--storage", storage, "--study", "calm", "--no-report"
    )
    assert code == 0, err
    assert "warning:" not in out, out
