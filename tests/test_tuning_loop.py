"""``tune run`` end to end on the simulator: trials recorded with everything a later reader
needs, resume, Ctrl-C, exports, infeasible studies, capacity mode, SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import optuna
import yaml

from prefill_tuner.engines.sim import SimConfig
from prefill_tuner.storage.store import TunerStore
from tests.conftest import AZURE

SMALL = ["--trace", str(AZURE), "--max-requests", "150"]


def run_args(storage: str, trials: int, *extra: str, slos=("p99_tpot=20ms", "p99_ttft=1s")):
    args = ["run", *SMALL, "--trials", str(trials), "--storage", storage, "--study", "s"]
    for slo in slos:
        args += ["--slo", slo]
    return [*args, *extra]


def stored(storage: str, name: str = "s"):
    store = TunerStore(storage)
    record = store.get_study(name)
    assert record is not None
    return record, store.trials(record)


def check_study(tune, storage: str) -> None:
    code, out, err = tune(*run_args(storage, 6))
    assert code == 0, err
    assert "Pareto-optimal settings" in out and "vllm serve meta-llama/" in out
    assert "recommended: trial" in out
    record, trials = stored(storage)
    assert record.trace_sha256 == hashlib.sha256(AZURE.read_bytes()).hexdigest()
    assert record.slos == ["p99_tpot=20ms", "p99_ttft=1s"]
    assert len(trials) == 6 and [t.trial_number for t in trials] == list(range(6))
    baseline = trials[0]
    assert baseline.is_baseline
    assert baseline.settings["max_num_batched_tokens"] == 8192  # the H100 default
    assert baseline.settings["max_num_seqs"] == 1024
    for trial in trials:
        assert trial.engine_version.version.startswith("tuner-sim")
        assert set(SimConfig.model_fields) <= set(trial.resolved_config)
        assert trial.resolved_config["async_scheduling"] is True  # the GPU profile's default
        assert trial.serve_command.startswith("vllm serve ")
        assert trial.metrics["requests"] == 150
        assert trial.shaping["max_requests"] == 150
        assert set(trial.constraints) == {"p99_tpot", "p99_ttft", "errors"}
        assert trial.status == "complete"
    # Resume: the same command with a larger budget runs only the missing trials.
    code, _, err = tune(*run_args(storage, 8))
    assert code == 0, err
    _, trials = stored(storage)
    assert len(trials) == 8
    # A different goal under the same name is refused before any work.
    code, _, err = tune(*run_args(storage, 9, slos=("p99_tpot=30ms",)))
    assert code == 2 and "different SLOs" in err
    assert len(stored(storage)[1]) == 8


def test_study_on_sqlite(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    check_study(tune, storage)
    # Another profile's numbers under the same name are refused: one study, one profile.
    profile = tmp_path / "flat.yaml"
    profile.write_text("kind: constant\nname: flat-10ms\nstep_ms: 10\n")
    code, _, err = tune(*run_args(storage, 9, "--profile", str(profile)))
    assert code == 2 and "different engine" in err and "profile flat-10ms" in err
    assert len(stored(storage)[1]) == 8


def test_study_on_postgresql(tune, postgres_url: str) -> None:
    check_study(tune, postgres_url)


def test_async_scheduling_flag_is_fixed_stored_and_in_the_serve_line(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 2, "--no-async-scheduling"))
    assert code == 0, err
    _, trials = stored(storage)
    for trial in trials:
        assert trial.resolved_config["async_scheduling"] is False
        assert trial.settings["async_scheduling"] is False
        assert "--no-async-scheduling" in trial.serve_command
    code, _, err = tune(*run_args(storage, 2, "--async-scheduling", "--set", "async_scheduling=1"))
    assert code == 2 and "not both" in err and "Traceback" not in err


def test_exports_and_pareto(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    assert tune(*run_args(storage, 5))[0] == 0
    code, out, _ = tune("pareto", "--storage", storage)
    assert code == 0 and "Pareto-optimal" in out
    code, out, _ = tune("export", "--format", "json", "--storage", storage)
    exported = json.loads(out)
    recommended = exported["pareto"][0]
    assert recommended["recommended"] and recommended["serve_command"].startswith("vllm serve")
    code, out, _ = tune("export", "--format", "yaml", "--storage", storage)
    document = yaml.safe_load(out)
    assert document["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert "max-num-batched-tokens" in document
    target = tmp_path / "serve.sh"
    code, _, err = tune("export", "--format", "shell", "--storage", storage, "-o", str(target))
    assert code == 0 and target.read_text().startswith("#!/bin/sh\n")
    code, _, err = tune("export", "--format", "toml", "--storage", storage)
    assert code == 2 and "--format" in err
    code, _, err = tune("pareto", "--storage", storage, "--study", "nope")
    assert code == 2 and "no such study" in err


def test_infeasible_study_says_so_and_names_the_binding_slo(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, out, err = tune(*run_args(storage, 4, slos=("p99_ttft=1us",)))
    assert code == 4, err  # a distinct exit code: nothing to deploy
    assert "No trial met the SLOs" in out and "binding p99_ttft" in out
    # each closest trial's serve line whole, on a line of its own (copy-pasted, it runs)
    printed = [line.strip() for line in out.splitlines() if "vllm serve" in line]
    _, trials = stored(storage)
    assert printed and set(printed) <= {trial.serve_command for trial in trials}
    # Why, and whether any load would do: no setting reaches a 1 µs first token.
    flat = " ".join(err.split())
    assert "no scheduler setting can meet these SLOs on one engine: p99_ttft" in flat
    assert "prefilled in one step of an idle engine" in flat  # a floor at any load
    assert "miss the SLOs even at 1/64 of the trace's request rate" in flat
    code, _, err = tune("export", "--storage", storage)
    assert code == 2 and "no trial met the SLOs" in err


def test_ctrl_c_keeps_finished_trials_and_the_study_resumes(
    tune, tmp_path: Path, monkeypatch
) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    from prefill_tuner.cli import display

    original = display.ProgressDisplay._trial
    calls = {"n": 0}

    def interrupt_after_three(self, result) -> None:
        original(self, result)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(display.ProgressDisplay, "_trial", interrupt_after_three)
    code, _out, err = tune(*run_args(storage, 6))
    assert code == 130 and "interrupted" in err
    study = optuna.load_study(study_name="s", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2  # the third was interrupted inside its objective
    monkeypatch.setattr(display.ProgressDisplay, "_trial", original)
    code, _, err = tune(*run_args(storage, 6))
    assert code == 0, err
    study = optuna.load_study(study_name="s", storage=storage)
    assert len([t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]) == 6


def test_capacity_mode_finds_a_rate_multiplier(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _out, err = tune(
        *run_args(
            storage,
            3,
            "--objective",
            "capacity",
            "--capacity-tolerance",
            "0.1",
            slos=("p99_tpot=30ms",),
        )
    )
    assert code == 0, err
    _, trials = stored(storage)
    multipliers = [t.objectives["rate_multiplier"] for t in trials]
    assert all(m > 1 for m in multipliers)  # 150 Azure requests are far below capacity
    assert all(t.feasible for t in trials)


def test_bad_run_options_are_one_line_errors(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    for extra, words in [
        (("--objective", "speed"), "--objective"),
        (("--engine", "tgi"), "--engine"),
        (("--set", "warp=9"), "not a setting"),
        (("--space", "max_num_seqs=9..1"), "LOW"),
        (("--sampler", "magic"), "--sampler"),
    ]:
        code, _, err = tune(*run_args(storage, 2, *extra))
        assert code == 2 and err.startswith("error: ") and words in err, (extra, err)
    code, _, err = tune(*run_args(storage, 2, slos=("p99_tpot=fast",)))
    assert code == 2 and "--slo" in err
