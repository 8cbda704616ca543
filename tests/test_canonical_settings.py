"""One canonical form per setting (issue 29): a ``long_prefill_token_threshold`` at or above
``max_num_batched_tokens`` caps nothing, so a trial that samples one runs, and is stored and
shown, with it off; no serve line, export or report carries it; and two trials that would
schedule identically are one measurement."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import optuna
from sqlalchemy import select

from prefill_tuner.cli.display import trial_line
from prefill_tuner.objectives.scoring import Verdict
from prefill_tuner.storage.models import TrialRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.plan import build_plan
from prefill_tuner.study.run import TrialResult
from tests.test_first_trials import ENGINE, TRACE
from tests.test_tuning_loop import run_args, stored

THRESHOLD, BUDGET = "long_prefill_token_threshold", "max_num_batched_tokens"


def flag_values(command: str) -> dict[str, str]:
    words = shlex.split(command)
    return {
        word: words[index + 1]
        for index, word in enumerate(words[:-1])
        if word.startswith("--") and not words[index + 1].startswith("--")
    }


def test_no_trial_serve_line_or_export_carries_a_threshold_the_budget_makes_moot(
    tune, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 14, "--sampler", "random", "--seed", "5"))
    assert code == 0, err
    _, trials = stored(storage)
    capped = 0
    for trial in trials:
        threshold, budget = trial.settings[THRESHOLD], trial.settings[BUDGET]
        assert threshold == 0 or threshold < budget
        capped += threshold > 0
        flags = flag_values(trial.serve_command)
        assert int(flags.get("--long-prefill-token-threshold", 0)) in (0, threshold)
        assert int(flags["--max-num-batched-tokens"]) == budget
    assert capped  # the random points do cap prefills, always below their budget
    assert any(
        t.repairs and "caps nothing: off (0)" in t.repairs[-1] for t in trials
    )  # and some sampled a cap at or above their budget: it ran, and shows, as off
    code, out, err = tune("export", "--storage", storage, "--study", "s", "--format", "shell")
    assert code == 0, err
    for line in out.splitlines():
        if "vllm serve" in line:
            flags = flag_values(line.removeprefix("# "))
            threshold = int(flags.get("--long-prefill-token-threshold", 0))
            assert threshold == 0 or threshold < int(flags["--max-num-batched-tokens"])


def test_a_trial_with_the_settings_of_an_earlier_one_reuses_its_result(
    tune, tmp_path: Path
) -> None:
    """A space of two points (the one budget, capped at half, reserving whole prompts or not),
    and the baseline: the later trials repeat them, and each repeat is recorded with the
    earlier trial's result, not run again."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    space = [
        "--space", "max_num_batched_tokens=512..512",
        "--space", "long_prefill_token_threshold=256..256",
        "--set", "max_num_seqs=64", "--set", "enable_chunked_prefill=true",
    ]  # fmt: skip
    code, out, err = tune(*run_args(storage, 6, *space, "--sampler", "random"))
    assert code == 0, err
    _, trials = stored(storage)
    assert len(trials) == 6
    assert {trial.settings[THRESHOLD] for trial in trials[1:]} == {256}
    optuna_trials = optuna.load_study(study_name="s", storage=storage).trials
    first_of: dict[str, int] = {}
    for trial, frozen in zip(trials, optuna_trials, strict=True):
        key = json.dumps(trial.settings, sort_keys=True)
        if key not in first_of:
            first_of[key] = trial.trial_number
            assert "same_as" not in frozen.user_attrs
            continue
        earlier = trials[first_of[key]]
        assert frozen.user_attrs["same_as"] == earlier.trial_number
        assert trial.objectives == earlier.objectives and trial.metrics == earlier.metrics
        assert frozen.values == optuna_trials[earlier.trial_number].values
        assert f"the same settings as trial {earlier.trial_number}" in trial.repairs[-1]
        line = trial_line(
            TrialResult(trial.trial_number, trial.settings, list(frozen.values),
                        Verdict(trial.constraints, trial.slacks), None, False,
                        same_as=earlier.trial_number),
            build_plan(ENGINE, TRACE, slos=["p99_tpot=20ms", "p99_ttft=1s"]).objectives,
        )  # fmt: skip
        assert f"the settings of trial {earlier.trial_number}: its result reused" in line
    assert len(first_of) == 3  # the baseline and the two points: three engine runs
    # The export lists each setting once.
    code, out, err = tune("export", "--storage", storage, "--study", "s")
    assert code == 0, err
    lines = [line.removeprefix("# ") for line in out.splitlines() if "vllm serve" in line]
    assert lines and len(lines) == len(set(lines))


def test_an_old_studys_dead_threshold_reads_as_off_everywhere(tune, tmp_path: Path) -> None:
    """Trials an earlier version recorded with a threshold at or above their budget ran as if
    it were off: the store reads them so, and no export or report of the study carries it."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 3, "--no-rule-trials"))
    assert code == 0, err
    store = TunerStore(storage)
    record = store.get_study("s")
    assert record is not None
    # Rewrite every trial as the earlier version would have: threshold 8192 over its budget.
    with store.session() as session, session.begin():
        for trial in session.scalars(select(TrialRecord)).all():
            budget = trial.settings[BUDGET]
            trial.settings = {**trial.settings, THRESHOLD: max(8192, budget)}
            words = shlex.split(trial.serve_command)
            at = words.index("--long-prefill-token-threshold") + 1
            words[at] = str(max(8192, budget))
            trial.serve_command = shlex.join(words)
    with store.session() as session:  # as recorded
        raw = session.scalars(select(TrialRecord)).all()
        assert all(t.settings[THRESHOLD] >= t.settings[BUDGET] for t in raw)
    for trial in store.trials(record):
        assert trial.settings[THRESHOLD] == 0
        assert flag_values(trial.serve_command)["--long-prefill-token-threshold"] == "0"
        assert "caps nothing: off (0)" in trial.repairs[-1]
    with store.session() as session:  # reading changed nothing stored
        assert all(
            t.settings[THRESHOLD] >= t.settings[BUDGET]
            for t in session.scalars(select(TrialRecord)).all()
        )
    code, out, err = tune("export", "--storage", storage, "--study", "s")
    assert code == 0, err
    assert "--long-prefill-token-threshold 8192" not in out
    report = tmp_path / "report.html"
    code, _, err = tune("report", "--storage", storage, "--study", "s", "-o", str(report))
    assert code == 0, err
    assert "--long-prefill-token-threshold 8192" not in report.read_text()
    assert "--long-prefill-token-threshold 0" in report.read_text()
    # The study resumes (its stored space is this version's), its new trials canonical.
    code, _, err = tune(*run_args(storage, 5, "--no-rule-trials"))
    assert code == 0, err
    resumed = store.trials(record)
    assert len(resumed) == 5
    for trial in resumed:
        assert trial.settings[THRESHOLD] == 0 or trial.settings[THRESHOLD] < trial.settings[BUDGET]
