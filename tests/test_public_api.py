"""The public API's example (the package docstring) runs as written, and its study is the one
``tune run`` makes: recorded for workers, resumable by ``tune run``, with a recommendation."""

from __future__ import annotations

import json
import re
from contextlib import closing
from pathlib import Path

import pytest

import prefill_tuner
from prefill_tuner.trace import ShapeOptions


@pytest.mark.slow
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


def _stored(tune, study: str, storage: str) -> tuple[dict, list[dict]]:
    """What the storage holds of a study, as ``tune studies --json`` and ``tune trials --json``
    show it, with the study's own name and the times taken out."""
    code, out, err = tune("studies", "--storage", storage, "--json")
    assert code == 0, err
    [record] = [s for s in json.loads(out)["studies"] if s["name"] == study]
    code, out, err = tune("trials", "--study", study, "--storage", storage, "--json")
    assert code == 0, err
    trials = json.loads(out)["trials"]
    return _without(record, study), [_without(trial, study) for trial in trials]


_TIMES = {"created_at", "started_at", "finished_at", "duration_s", "wall_s", "datetime_start"}


def _without(value: object, study: str) -> object:
    if isinstance(value, dict):
        return {k: _without(v, study) for k, v in value.items() if k not in _TIMES}
    if isinstance(value, list):
        return [_without(v, study) for v in value]
    if isinstance(value, str):
        return value.replace(study, "STUDY")
    return value


@pytest.mark.slow
def test_tune_run_and_tune_study_store_the_same_study(tune, tmp_path: Path) -> None:
    """The command is the library's study function: the same options give the same stored
    study (definition, trials, settings, metrics, verdicts), trial for trial."""
    options = dict(trials=6, seed=3)
    storage = f"sqlite:///{tmp_path / 'cli.db'}"
    code, _, err = tune(
        "run", "--slo", "p99_tpot=50ms", "--max-requests", "150", "--study", "by-command",
        "--storage", storage, "--trials", str(options["trials"]), "--seed", str(options["seed"]),
        "--no-report",
    )  # fmt: skip
    assert code == 0, err

    library = f"sqlite:///{tmp_path / 'library.db'}"
    with closing(prefill_tuner.build_engine(prefill_tuner.EngineOptions())) as engine:
        plan = prefill_tuner.build_plan(
            engine,
            prefill_tuner.TraceSpec(
                prefill_tuner.SAMPLE_TRACE, shaping=ShapeOptions(max_requests=150)
            ),
            slos=["p99_tpot=50ms"],
            name="by-library",
            storage_url=library,
            **options,
        )
        summary = prefill_tuner.tune_study(plan, engine, prefill_tuner.TunerStore(library))
    assert summary.recommended is not None

    cli_record, cli_trials = _stored(tune, "by-command", storage)
    library_record, library_trials = _stored(tune, "by-library", library)
    assert len(cli_trials) == options["trials"]
    assert library_trials == cli_trials
    assert library_record == cli_record
