"""A worker's loop: claim a trial, run it with heartbeats, tell the result; wait while other
workers' trials run; stop when the study has its target of COMPLETE trials."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from prefill_tuner.study.run import StudyProgress, TrialObjective, TrialResult, trial_callbacks
from prefill_tuner.study.screening import load_screening, predictor, refine
from prefill_tuner.worker.claim import Claimed, Done, Wait, claim_trial, give_up
from prefill_tuner.worker.heartbeat import Heartbeat
from prefill_tuner.worker.shared import SharedStudy, quiet_optuna_warnings


@dataclass
class WorkerEvents:
    """Callbacks for a display; all optional."""

    claimed: Callable[[Claimed], None] = lambda claim: None
    finished: Callable[[TrialResult], None] = lambda result: None
    waiting: Callable[[Wait], None] = lambda wait: None
    lost: Callable[[int], None] = lambda number: None
    """A trial this worker was running was failed as stale by another worker (its heartbeats
    were late by more than the grace period) and queued again; this worker's result is dropped."""
    gave_up: Callable[[int | None], None] = lambda number: None
    """Ctrl-C: the running trial (its number) was failed and queued again."""
    screening: Callable[[str], None] = lambda text: None
    """What the screening (of a screened study) is doing in this worker."""


@dataclass(frozen=True)
class WorkerSummary:
    ran: int
    """Trials this worker completed."""
    complete: int
    """COMPLETE trials of the study when the worker stopped."""


def run_worker(
    shared: SharedStudy, heartbeat_interval: float, events: WorkerEvents | None = None
) -> WorkerSummary:
    """Run trials of the shared study until it has its target of COMPLETE trials.

    Ctrl-C (KeyboardInterrupt) propagates after the running trial is failed and queued again
    for the next claim (see :func:`give_up`); nothing else is left behind.
    """
    events = events or WorkerEvents()
    ran = 0
    was_waiting = False
    while True:
        claim = claim_trial(shared, events.screening)
        if isinstance(claim, Done):
            return WorkerSummary(ran=ran, complete=claim.complete)
        if isinstance(claim, Wait):
            if not was_waiting:
                events.waiting(claim)
            was_waiting = True
            time.sleep(heartbeat_interval)  # poll: a dead worker's trial becomes claimable
            continue
        was_waiting = False
        events.claimed(claim)
        completed = _run_trial(shared, claim, heartbeat_interval, events)
        ran += completed
        if completed and shared.plan.screen_trials:
            refine(shared.study, shared.plan, shared.store, events.screening)


def _run_trial(
    shared: SharedStudy, claim: Claimed, heartbeat_interval: float, events: WorkerEvents
) -> bool:
    """Run one claimed trial and tell its result; whether it was completed."""
    study, trial = shared.study, claim.trial
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    objective = TrialObjective(
        shared.plan,
        shared.engine,
        shared.store,
        shared.record,
        StudyProgress(on_trial=events.finished),
        finished,
        predict=predictor(load_screening(study), shared.plan),
    )
    try:
        with Heartbeat(shared.storage, claim.trial_id, heartbeat_interval):
            values = objective(trial)
    except optuna.exceptions.UpdateFinishedTrialError:
        events.lost(trial.number)
        return False
    except KeyboardInterrupt:
        events.gave_up(give_up(shared, trial))
        raise
    except BaseException:
        with quiet_optuna_warnings():
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        raise
    with quiet_optuna_warnings():
        told = study.tell(trial, values, skip_if_finished=True)
    if told.state != TrialState.COMPLETE:
        events.lost(trial.number)
        return False
    for callback in trial_callbacks(shared.plan, shared.engine):
        callback(study, told)  # siblings run on this worker's kept server if it claims them
    return True
