"""The budget refined around the best trial once the rule trials ran (issue 46): a half octave
either side, then a quarter octave around the best of those; never past the study's trials."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
from optuna.trial import TrialState

from prefill_tuner import EngineOptions, build_engine
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.local_search import REFINE_ATTR, STEPS_OCTAVES, worst_ratio
from prefill_tuner.study.plan import TraceSpec, build_plan
from prefill_tuner.study.run import run_study
from prefill_tuner.trace.shaping import ShapeOptions
from tests.conftest import AZURE

TOKENS = "max_num_batched_tokens"


def study_of(tmp_path: Path, trials: int):  # type: ignore[no-untyped-def]
    engine = build_engine(EngineOptions())
    with contextlib.closing(engine):
        plan = build_plan(
            engine,
            TraceSpec(path=AZURE, shaping=ShapeOptions(max_requests=150)),
            slos=["p99_tpot=20ms", "p99_ttft=750ms"],
            trials=trials,
            storage_url=f"sqlite:///{tmp_path / 't.db'}",
        )
        return run_study(plan, engine, TunerStore(plan.storage_url))


def test_rounds_refine_the_best_budget_after_the_rule_trials(tmp_path: Path) -> None:
    trials = study_of(tmp_path, 20).trials
    assert len(trials) == 20 and all(t.state == TrialState.COMPLETE for t in trials)
    rules = [t.number for t in trials if "rule" in t.user_attrs]
    refined = [t for t in trials if REFINE_ATTR in t.user_attrs]
    assert rules and refined
    assert min(t.number for t in refined) > max(rules)  # after every rule trial
    assert sorted({t.user_attrs[REFINE_ATTR][1] for t in refined}, reverse=True) == list(
        STEPS_OCTAVES
    )
    for trial in refined:
        around, step = trial.user_attrs[REFINE_ATTR]
        best = trials[around]
        earlier = [
            t
            for t in trials[
                : min(t.number for t in refined if t.user_attrs[REFINE_ATTR][1] == step)
            ]
        ]
        # Around the best trial run before its round was queued...
        assert worst_ratio(best) == min(worst_ratio(t) for t in earlier)
        # ... its budget a step either side, the rest of its settings kept.
        budget = best.user_attrs["settings"][TOKENS]
        octaves = math.log2(trial.user_attrs["settings"][TOKENS] / budget)
        assert abs(abs(octaves) - step) < 0.01, (budget, trial.user_attrs["settings"][TOKENS])
        for name, value in best.user_attrs["settings"].items():
            if name not in (TOKENS, "max_num_seqs"):
                assert trial.user_attrs["settings"][name] == value, name


@pytest.mark.parametrize("trials", [1, 5, 7])
def test_never_past_the_studys_trials(tmp_path: Path, trials: int) -> None:
    study = study_of(tmp_path, trials)
    assert len(study.trials) == trials
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
