"""The public API's example (the package docstring) runs as written, and its study is the one
``tune run`` makes: recorded for workers, resumable by ``tune run``, with a recommendation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import prefill_tuner


def test_the_docstring_example_runs_and_is_tune_run(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    doc = prefill_tuner.__doc__ or ""
    example = re.search(r"::\n\n((?:    .*\n|\n)+)", doc)
    assert example is not None
    code = "\n".join(line[4:] for line in example.group(1).splitlines())
    namespace: dict[str, object] = {}
    exec(compile(code, "prefill_tuner example", "exec"), namespace)
    summary = namespace["summary"]
    assert summary.recommended is not None  # type: ignore[attr-defined]
    record = summary.study  # type: ignore[attr-defined]
    assert record.definition and record.target_trials == 12  # tune worker can join it
    code, out, err = tune("pareto", "--study", record.name, "--storage", "sqlite:///tune.db")
    assert code == 0 and "vllm serve" in out, err
