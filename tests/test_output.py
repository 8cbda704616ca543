"""What people read and copy: the results table fits 80 columns without cutting a value, and
every serve line is printed whole on one line, in a terminal and piped, so a pasted line runs."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

from rich.console import Console

from prefill_tuner.cli.tables import render_summary
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.summary import summarize_stored
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
    table = text[start : text.index("recommended:")].splitlines()
    assert max(len(line.rstrip()) for line in table) <= 80
    assert [line for line in text.splitlines() if line.startswith("vllm serve")] == piped
