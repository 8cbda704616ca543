"""A study's trial budget (its ``trials``), honoured by every process that runs it.

``tune worker`` processes claim trials under the study's lock, counting the COMPLETE and
RUNNING ones (:mod:`prefill_tuner.worker.claim`). ``tune run`` asks Optuna for its trials
without that lock (Optuna's ``optimize`` asks), so each of its trials is *admitted* before its
engine runs: under the same lock, it runs only while the COMPLETE trials and the other
admitted RUNNING ones (a worker's, another run's) leave room in the budget. Otherwise it is
not run: it ends PRUNED, marked :data:`OVER_BUDGET_ATTR`, its parameters queued again when they
were queued ones (the baseline, a retry), and the run stops. So a study never ends with more
COMPLETE trials than its budget, however many processes run it and by whatever path they name
its database.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from prefill_tuner.storage.batched import write_now
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore

ADMITTED_ATTR = "admitted"
"""User attribute of a trial that a budget check let run (workers' claims set it too)."""
OVER_BUDGET_ATTR = "over_budget"
"""User attribute of a trial that was not run: the budget was spent by others' trials."""


def admit(
    trial: optuna.Trial, store: TunerStore, record: StudyRecord, budget: int
) -> tuple[bool, int]:
    """Whether ``trial`` (RUNNING, just asked for) may run within ``budget`` COMPLETE trials,
    and how many others are running; it is marked admitted when it may."""
    study = trial.study
    with store.study_lock(record):
        others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        complete = sum(t.state == TrialState.COMPLETE for t in others)
        running = sum(
            t.state == TrialState.RUNNING and ADMITTED_ATTR in t.user_attrs for t in others
        )
        if complete + running >= budget:
            return False, running
        trial.set_user_attr(ADMITTED_ATTR, True)
        write_now(study)  # with its settings: seen by the next check, whichever process's
    return True, running


def refuse(trial: optuna.Trial, running: int, *, drop: tuple[str, ...]) -> optuna.TrialPruned:
    """End a trial :func:`admit` refused: marked, its queued parameters queued again (without
    the user attributes named in ``drop``: who ran it), and the study stopped. Returns the
    exception the objective raises (Optuna stores the trial PRUNED)."""
    study = trial.study
    fixed = study.get_trials(deepcopy=False)[trial.number].system_attrs.get("fixed_params")
    if fixed:
        attrs = {k: v for k, v in trial.user_attrs.items() if k not in drop}
        study.enqueue_trial(fixed, user_attrs=attrs)
    trial.set_user_attr(OVER_BUDGET_ATTR, True)
    study.stop()
    return optuna.TrialPruned(
        f"the study's budget is spent by other processes' trials ({running} running)"
    )
