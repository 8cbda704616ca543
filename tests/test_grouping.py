"""A real study groups its trials by server (issue 45): a trial the sampler proposes is
followed by ``GROUP - 1`` trials with its start-up settings, which run on its kept server.
The grouping is the study's, whatever the engine: here a simulator said to take two knobs
while running stands in for a real engine's servers (its own ``live_knobs`` is empty)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from prefill_tuner import EngineOptions, build_engine
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.grouping import GROUP, SIBLING_ATTR, startup_params
from prefill_tuner.study.plan import TraceSpec, build_plan
from prefill_tuner.study.run import run_study
from prefill_tuner.trace.shaping import ShapeOptions
from tests.conftest import AZURE

STARTUP = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill")


def test_siblings_share_their_first_trials_start_up_settings(tmp_path: Path) -> None:
    engine = build_engine(EngineOptions())
    with contextlib.closing(engine):
        assert engine.live_knobs == ()  # the simulator starts no server: never grouped
        plan = build_plan(
            engine,
            TraceSpec(path=AZURE, shaping=ShapeOptions(max_requests=150)),
            slos=["p99_tpot=20ms"],
            trials=14,
            storage_url=f"sqlite:///{tmp_path / 't.db'}",
        )
        assert startup_params(plan.space, engine) == []
        engine.live_knobs = ("long_prefill_token_threshold", "scheduler_reserve_full_isl")  # type: ignore[misc]
        assert startup_params(plan.space, engine) == list(STARTUP)
        store = TunerStore(plan.storage_url)
        study = run_study(plan, engine, store)
    trials = study.trials
    assert len(trials) == 14  # never past the study's trials, nothing left queued
    assert all(t.state.name == "COMPLETE" for t in trials)
    siblings = [t for t in trials if SIBLING_ATTR in t.user_attrs]
    assert siblings, "no trial was grouped"
    by_first: dict[int, list] = {}
    for trial in siblings:
        by_first.setdefault(trial.user_attrs[SIBLING_ATTR], []).append(trial)
    for first_number, group in by_first.items():
        first = trials[first_number]
        assert len(group) <= GROUP - 1
        assert SIBLING_ATTR not in first.user_attrs and "baseline" not in first.user_attrs
        for trial in group:
            assert trial.number > first_number
            assert {k: trial.params[k] for k in STARTUP} == {k: first.params[k] for k in STARTUP}
        # Consecutive: a kept server serves them one after another.
        assert [t.number for t in group] == list(
            range(first_number + 1, first_number + 1 + len(group))
        )
    # The per-step knobs are the sampler's: not all copies of the first trial's.
    varied = [
        t
        for t in siblings
        if (
            t.params.get("long_prefill_token_threshold_log2"),
            t.params["scheduler_reserve_full_isl"],
        )
        != (
            trials[t.user_attrs[SIBLING_ATTR]].params.get("long_prefill_token_threshold_log2"),
            trials[t.user_attrs[SIBLING_ATTR]].params["scheduler_reserve_full_isl"],
        )
    ]
    assert varied
