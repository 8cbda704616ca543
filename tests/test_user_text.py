"""What the commands print keeps the user's own text (study names, SLOs with a class, trace
paths with brackets: never read as rich markup), a finished study reads as finished, and
piped prose honours COLUMNS."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefill_tuner.trace.native import write_native
from tests.test_traffic_classes import _mixed_trace

CLASSES = "chat=..1024,doc=8192.."
SLOS = ["--slo", "p99_ttft[chat]=300ms", "--slo", "p99_ttft[doc]=5s", "--slo", "p99_tpot=50ms"]


@pytest.fixture
def bracketed(tmp_path: Path) -> Path:
    """A classed trace whose file name looks like rich markup."""
    path = tmp_path / "[red]x.jsonl"
    write_native(_mixed_trace().requests, path)
    return path


def test_class_slos_and_bracketed_paths_print_as_given(tune, tmp_path: Path, bracketed) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", "--trace", str(bracketed), "--classes", CLASSES, *SLOS, "--trials", "2",
        "--storage", storage, "--study", "s",
    )  # fmt: skip
    assert code in (0, 4), err
    assert f"on {bracketed}" in err
    code, out, err = tune("studies", "--storage", storage)
    assert code == 0, err
    assert "p99_ttft[chat]=300ms, p99_ttft[doc]=5s, p99_tpot=50ms" in out
    code, out, err = tune("trials", "--study", "s", "--storage", storage)
    assert code == 0, err
    assert "[chat]" in out and "[doc]" in out, out  # each class's column says whose it is
    code, out, err = tune("trace", "stats", str(bracketed))
    assert code == 0, err
    assert f"{bracketed} (jsonl" in out
    code, _, err = tune("trace", "convert", str(bracketed), str(tmp_path / "[b]y.jsonl"))
    assert code == 0, err
    assert f"to {tmp_path / '[b]y.jsonl'}" in err


def test_a_finished_study_lists_no_trial_that_never_runs(tune, tmp_path: Path) -> None:
    """The first run queued the baseline and three rule-derived trials whatever --trials
    said: with --trials 2, two of them stayed queued for good. It queues no more than the
    study runs now (a later run with more trials has the sampler propose the rest)."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["run", "--trace", str(_written(tmp_path)), "--slo", "p99_tpot=50ms"]
    code, _, err = tune(*args, "--trials", "2", "--storage", storage, "--study", "s")
    assert code in (0, 4), err
    code, out, err = tune("trials", "--study", "s", "--storage", storage)
    assert code == 0, err
    assert "queued" not in out and "not shown" not in out, out
    code, out, _ = tune("trials", "--study", "s", "--storage", storage, "--json")
    assert '"WAITING"' not in out and out.count('"COMPLETE"') == 2


def test_the_bar_of_a_finished_study_says_it_is_done(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["run", "--trace", str(_written(tmp_path)), "--slo", "p99_tpot=1us"]
    args += ["--storage", storage, "--study", "s"]
    code, _, err = tune(*args, "--trials", "2")
    assert code == 4, err
    assert "done: no trial met the SLOs" in err and "yet" not in err, err
    code, _, err = tune(*args, "--trials", "3")
    assert "done: no trial of this run met the SLOs" in err, err
    code, _, err = tune(*args, "--trials", "3")
    assert "done: the study already has its 3 trials" in err, err


def test_piped_prose_honours_columns(tune, tmp_path: Path, monkeypatch) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    run = ["run", "--trace", str(_written(tmp_path)), "--slo", "p99_tpot=50ms", "--trials", "2"]
    code, _, err = tune(*run, "--storage", storage, "--study", "s")
    assert code == 0, err
    for columns in ("80", None):
        if columns:
            monkeypatch.setenv("COLUMNS", columns)
        else:
            monkeypatch.delenv("COLUMNS", raising=False)
        code, out, err = tune("pareto", "--storage", storage, "--study", "s")
        assert code == 0, err
        prose = [line for line in out.splitlines() if not line.startswith("vllm ")]
        assert any(line.startswith("recommended: trial") for line in prose)
        longest = max(len(line.rstrip()) for line in prose)
        if columns:
            assert longest <= 80, out
        else:
            assert longest > 120, "unwrapped for grep when COLUMNS is not set"


def _written(directory: Path) -> Path:
    path = directory / "trace.jsonl"
    write_native(_mixed_trace().requests, path)
    return path
