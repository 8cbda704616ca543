"""The claim step: which trial a worker runs next, decided atomically across all workers.

Under the study's lock (a row lock on PostgreSQL, a file lock beside an SQLite file), a claim

1. fails the trials whose heartbeat is older than the grace period (their worker died); the
   storage's stale-trial callback queues each again as a WAITING trial with the same
   parameters;
2. counts the COMPLETE and RUNNING trials: the study is done at its target of COMPLETE
   trials; while COMPLETE + RUNNING reach the target, the worker waits (a RUNNING trial may
   yet fail and be retried);
3. in a screened study (:mod:`prefill_tuner.study.screening`), proposes nothing before the
   screening: while the baseline runs, the worker waits; the first claim after it runs the
   screening (so exactly once); each claim then queues the next candidate the screening
   found, until they are spent;
4. otherwise asks Optuna for a trial, which takes a WAITING one first (the baseline, a retry,
   a candidate), and records the trial's first heartbeat before the lock is released, so that
   no trial is ever RUNNING without one (Optuna never fails a trial that has no heartbeat).

So the study never has more than its target of COMPLETE trials, no trial is run twice at once,
and a dead worker's trial is run again by a survivor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from prefill_tuner.study.budget import ADMITTED_ATTR
from prefill_tuner.study.run import enqueue_baseline, enqueue_rule_trials, make_sampler
from prefill_tuner.study.runners import WORKER_ATTR
from prefill_tuner.study.screening import (
    baseline_pending,
    enqueue_candidate,
    load_screening,
    next_candidate,
    screen,
)
from prefill_tuner.worker.shared import SharedStudy, quiet_optuna_warnings, trial_id


@dataclass(frozen=True)
class Claimed:
    """Run this trial."""

    trial: optuna.Trial
    trial_id: int
    """The trial's id in the storage (its heartbeats are recorded under it)."""
    retry_of: int | None
    """The number of the trial it retries (whose worker died), if any."""


@dataclass(frozen=True)
class Wait:
    """The target is reached by COMPLETE and RUNNING trials: wait for the running ones (or,
    in a screened study, for the baseline the screening needs)."""

    running: int
    for_baseline: bool = False
    """Waiting for the baseline, which another worker runs, before the screening."""


@dataclass(frozen=True)
class Done:
    """The study has its target of COMPLETE trials."""

    complete: int


Claim = Claimed | Wait | Done


def claim_trial(shared: SharedStudy, say: Callable[[str], None] = lambda text: None) -> Claim:
    """The next trial for this worker, or why there is none (see the module's docstring);
    ``say``: what the screening is doing, when this claim runs it."""
    study, plan = shared.study, shared.plan
    with shared.store.study_lock(shared.record), quiet_optuna_warnings():
        optuna.storages.fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        if not trials:
            enqueue_baseline(study, plan, shared.engine)
            enqueue_rule_trials(study, plan, shared.engine)
            trials = study.get_trials(deepcopy=False)
        complete = sum(t.state == TrialState.COMPLETE for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials)
        if complete >= plan.trials:
            return Done(complete)
        if complete + running >= plan.trials:
            return Wait(running)
        if plan.screen_trials:
            held = _screening_turn(shared, trials, running, say)
            if held is not None:
                return held
        # The seed differs for every trial created, whichever worker creates it: a popped
        # WAITING trial keeps the parameters it was queued with.
        study.sampler = make_sampler(plan.sampler, plan.seed + len(trials), plan.startup_trials)
        trial = study.ask()
        claimed_id = trial_id(shared, trial)
        shared.storage.record_heartbeat(claimed_id)
        trial.set_user_attr(WORKER_ATTR, shared.worker)
        trial.set_user_attr(ADMITTED_ATTR, True)  # counted by tune run's budget checks
        retry_of = RetryHeartbeatStaleTrialCallback.retried_trial_number(
            shared.storage.get_trial(claimed_id)
        )
        return Claimed(trial, claimed_id, retry_of)


def _screening_turn(
    shared: SharedStudy,
    trials: list[optuna.trial.FrozenTrial],
    running: int,
    say: Callable[[str], None],
) -> Wait | None:
    """A screened study's claim (step 3 of the module's docstring), under the lock: a
    :class:`Wait` for the baseline, or ``None`` once the next trial is queued."""
    study = shared.study
    if any(t.state == TrialState.WAITING for t in trials):
        return None  # the baseline, a retry or a candidate goes first
    screening = load_screening(study)
    if screening is None:
        if baseline_pending(study):
            return Wait(running, for_baseline=True)
        screening = screen(shared.plan, shared.store, shared.record, study, say)
    candidate = next_candidate(study, screening)
    if candidate is not None:
        enqueue_candidate(study, candidate)
    return None


def give_up(shared: SharedStudy, trial: optuna.Trial) -> int | None:
    """Fail a trial this worker will not finish (Ctrl-C) and queue its parameters again, under
    the lock, for the next claim of any worker. Returns the failed trial's number, or ``None``
    when another worker had already failed it as stale."""
    with shared.store.study_lock(shared.record), quiet_optuna_warnings():
        # Only claims fail stale trials, under this same lock: the state cannot change here.
        if shared.storage.get_trial(trial_id(shared, trial)).state.is_finished():
            return None
        frozen = shared.study.tell(trial, state=TrialState.FAIL)
        # Not the trial's fault: queued again whatever its retries so far.
        RetryHeartbeatStaleTrialCallback()(shared.study, frozen)
        return frozen.number
