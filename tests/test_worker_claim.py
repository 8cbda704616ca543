"""The claim step of ``tune worker`` on SQLite, in one process: exactly the target of trials,
waiting while trials run, dead workers' trials failed and their parameters retried, Ctrl-C."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from prefill_tuner import defaults
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.worker.claim import Claimed, Done, Wait, claim_trial, give_up
from prefill_tuner.worker.definition import plan_from_record
from prefill_tuner.worker.loop import run_worker
from prefill_tuner.worker.shared import SharedStudy, open_shared_study, trial_id
from tests.support.worker_support import SLOS, STUDY, create_study, tiny_trace

VALUES = [0.5, 0.02]  # p99_ttft, p99_tpot


def open_worker(
    tune: Callable, tmp_path: Path, trials: int, worker: str = "w1", *, rule_trials: bool = False
) -> SharedStudy:
    """A worker on a new study; without the rule-derived first trials unless asked, so the
    queue holds only what a test puts there."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    create_study(tune, storage, tiny_trace(tmp_path), trials, rule_trials=rule_trials)
    store = TunerStore(storage)
    record = store.get_study(STUDY)
    assert record is not None and record.target_trials == trials
    engine = SimEngine(load_profile(defaults.PROFILE))
    plan = plan_from_record(record, storage_url=storage, engine=engine)
    return open_shared_study(
        plan, store, record, engine, worker=worker, heartbeat_interval=1, grace_period=2
    )


def claimed(claim: object) -> optuna.Trial:
    assert isinstance(claim, Claimed), claim
    return claim.trial


def states(shared: SharedStudy) -> list[TrialState]:
    return [t.state for t in shared.study.get_trials(deepcopy=False)]


def test_claims_stop_at_the_target_and_wait_for_running_trials(tune, tmp_path: Path) -> None:
    shared = open_worker(tune, tmp_path, trials=3)
    first = claimed(claim_trial(shared))
    assert first.number == 0 and first.user_attrs["baseline"]  # the engine's defaults
    assert first.user_attrs["worker"] == "w1"
    second, third = claimed(claim_trial(shared)), claimed(claim_trial(shared))
    assert claim_trial(shared) == Wait(running=3)  # never a fourth trial while three run
    shared.study.tell(first, VALUES)
    assert claim_trial(shared) == Wait(running=2)
    shared.study.tell(second, state=TrialState.FAIL)  # a crash: not counted, replaced
    fourth = claimed(claim_trial(shared))
    assert fourth.number == 3
    assert claim_trial(shared) == Wait(running=2)
    shared.study.tell(third, VALUES)
    shared.study.tell(fourth, VALUES)
    assert claim_trial(shared) == Done(complete=3)
    assert states(shared).count(TrialState.COMPLETE) == 3


def backdate_heartbeat(shared: SharedStudy, trial: optuna.Trial) -> None:
    """The trial's worker died long ago (its last heartbeat is from 2000)."""
    engine = create_engine(shared.plan.storage_url)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE trial_heartbeats SET heartbeat = :then WHERE trial_id = :id"),
            {"then": datetime(2000, 1, 1), "id": trial_id(shared, trial)},
        )
    engine.dispose()


def test_a_dead_workers_trial_is_failed_and_retried_by_another(tune, tmp_path: Path) -> None:
    dead = open_worker(tune, tmp_path, trials=2, worker="dead")
    survivor = dataclasses.replace(dead, worker="survivor")
    baseline = claimed(claim_trial(survivor))
    doomed = claimed(claim_trial(dead))
    params = dead.plan.space.suggest(doomed)  # the dead worker got as far as sampling
    assert claim_trial(survivor) == Wait(running=2)  # its heartbeat is fresh: still alive
    backdate_heartbeat(dead, doomed)
    retry = claim_trial(survivor)
    assert isinstance(retry, Claimed) and retry.retry_of == doomed.number
    assert dead.storage.get_trial(trial_id(dead, doomed)).state == TrialState.FAIL
    assert retry.trial.user_attrs["worker"] == "survivor"
    assert dead.plan.space.suggest(retry.trial) == params  # the same configuration again
    survivor.study.tell(baseline, VALUES)
    survivor.study.tell(retry.trial, VALUES)
    assert claim_trial(survivor) == Done(complete=2)
    assert sorted(s.name for s in states(survivor)) == ["COMPLETE", "COMPLETE", "FAIL"]


def test_ctrl_c_fails_the_running_trial_and_queues_it_again(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = open_worker(tune, tmp_path, trials=4)
    original = SimEngine.run
    calls = {"n": 0}

    def interrupt_the_second_run(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SimEngine, "run", interrupt_the_second_run)
    given_up: list[int | None] = []
    from prefill_tuner.worker.loop import WorkerEvents

    with pytest.raises(KeyboardInterrupt):
        run_worker(shared, 1, WorkerEvents(gave_up=given_up.append))
    assert given_up == [1]
    trials = shared.study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert trials[2].params == trials[1].params
    monkeypatch.setattr(SimEngine, "run", original)
    summary = run_worker(shared, 1)
    assert summary.complete == 4 and summary.ran == 3
    trials = shared.study.get_trials(deepcopy=False)
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 4
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert trials[2].state == TrialState.COMPLETE and trials[2].system_attrs["failed_trial"] == 1
    # Every COMPLETE trial has its record, and only those.
    recorded = [row.trial_number for row in shared.store.trials(shared.record)]
    assert recorded == [t.number for t in trials if t.state == TrialState.COMPLETE]


def test_give_up_leaves_a_trial_already_failed_as_stale_alone(tune, tmp_path: Path) -> None:
    shared = open_worker(tune, tmp_path, trials=2)
    trial = claimed(claim_trial(shared))
    backdate_heartbeat(shared, trial)
    other = dataclasses.replace(shared, worker="other")
    retry = claim_trial(other)
    assert isinstance(retry, Claimed) and retry.retry_of == trial.number
    assert give_up(shared, trial) is None  # already failed and queued once: not twice
    assert states(shared).count(TrialState.WAITING) == 0


def test_the_first_claim_queues_the_rule_trials_after_the_baseline(tune, tmp_path: Path) -> None:
    shared = open_worker(tune, tmp_path, 6, rule_trials=True)
    claim = claim_trial(shared)
    assert isinstance(claim, Claimed) and claim.trial.user_attrs["baseline"]
    waiting = shared.study.get_trials(states=(TrialState.WAITING,))
    assert waiting and all(t.user_attrs.get("rule") for t in waiting)
    assert len(waiting) <= 6 - 1  # never more than the study's trials after the baseline


def test_a_run_joining_workers_keeps_the_study_budget(tune, tmp_path: Path) -> None:
    """Workers hold two of a four-trial study's trials RUNNING when ``tune run`` resumes it:
    the run finishes two, and its next trial is not run (the budget is spent), so the study
    never passes four COMPLETE trials. Before, the run ran four of its own (six in all)."""
    shared = open_worker(tune, tmp_path, trials=4)
    held = [claimed(claim_trial(shared)), claimed(claim_trial(shared))]
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", "--trace", str(tiny_trace(tmp_path)), *SLOS, "--trials", "4", "--storage",
        storage, "--study", STUDY, "--no-rule-trials", "--no-report",
    )  # fmt: skip
    assert code in (0, 4), err
    done = shared.study.get_trials(deepcopy=False)
    assert sum(t.state == TrialState.COMPLETE for t in done) == 2
    assert all(shared.storage.get_trial(trial_id(shared, t)).state == TrialState.RUNNING
               for t in held)  # fmt: skip
    for trial in held:
        shared.study.tell(trial, VALUES)
    assert sum(t.state == TrialState.COMPLETE for t in shared.study.get_trials()) == 4


def test_a_symbolic_link_to_the_database_is_the_same_run_lock(tune, tmp_path: Path) -> None:
    """One database, two paths: the run lock is the file's, so the second run is refused
    (before, each path had a lock of its own and two runs each ran the budget)."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    create_study(tune, storage, tiny_trace(tmp_path), 4)
    (tmp_path / "alias.db").symlink_to(tmp_path / "tune.db")
    store = TunerStore(f"sqlite:///{tmp_path / 'alias.db'}")
    record = store.get_study(STUDY)
    assert record is not None
    with TunerStore(storage).run_lock(record) as held:
        assert held
        probe = (
            "from prefill_tuner.storage.store import TunerStore\n"
            f"s = TunerStore({'sqlite:///' + str(tmp_path / 'alias.db')!r})\n"
            f"with s.run_lock(s.get_study({STUDY!r})) as held: print(held)\n"
        )
        # another process: a process's own locks never block it
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert out.stdout.strip() == "False", out.stderr


def test_a_workers_trials_are_grouped_by_server_never_past_the_target(tune, tmp_path: Path) -> None:
    """As in ``tune run`` (``tests/test_grouping.py``): a worker whose engine takes per-step
    knobs while running queues a sampled trial's siblings, never past the study's target."""
    from prefill_tuner.study.grouping import SIBLING_ATTR

    shared = open_worker(tune, tmp_path, trials=8)
    shared.engine.live_knobs = ("long_prefill_token_threshold", "scheduler_reserve_full_isl")  # type: ignore[misc]
    summary = run_worker(shared, 1)
    trials = shared.study.get_trials(deepcopy=False)
    assert summary.complete == 8 and [t.state for t in trials] == [TrialState.COMPLETE] * 8
    siblings = [t for t in trials if SIBLING_ATTR in t.user_attrs]
    assert siblings, "no trial was grouped"
    for trial in siblings:
        first = trials[trial.user_attrs[SIBLING_ATTR]]
        assert trial.params["max_num_batched_tokens"] == first.params["max_num_batched_tokens"]
