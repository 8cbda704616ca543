"""A worker's handles on the shared study: Optuna's storage with heartbeats, whose stale
(dead-worker) trials are failed and queued again, and the tuner's own records."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.storage.batched import optuna_storage
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore, redact_url
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.run import study_directions

MAX_RETRIES = 2
"""Times a dead worker's trial is queued again: a trial that kills every worker that runs it
(e.g. the tuner itself running out of memory) stays failed after this many, and is replaced by
a new one."""


@dataclass(frozen=True)
class SharedStudy:
    """One worker's handles on the shared study."""

    study: optuna.Study
    storage: RDBStorage
    """Optuna's storage, which this worker created: trials' heartbeats are recorded there."""
    study_id: int
    """The study's id in that storage."""
    store: TunerStore
    record: StudyRecord
    plan: StudyPlan
    engine: TrialEngine
    worker: str
    """This worker's name, stored with each trial it claims."""


def open_shared_study(
    plan: StudyPlan,
    store: TunerStore,
    record: StudyRecord,
    engine: TrialEngine,
    *,
    worker: str,
    heartbeat_interval: int,
    grace_period: int,
) -> SharedStudy:
    """Load the study (it must exist) with heartbeats every ``heartbeat_interval`` seconds; a
    RUNNING trial without one for ``grace_period`` seconds is failed and queued again."""
    try:
        with quiet_optuna_warnings():
            storage = optuna_storage(
                plan.storage_url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(MAX_RETRIES),
            )
        study = optuna.load_study(study_name=plan.name, storage=storage)
    except Exception as exc:  # Optuna wraps storage errors in many types
        raise TunerError(
            f"cannot open the Optuna study {plan.name!r} in {redact_url(plan.storage_url)}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if list(study.directions) != study_directions(plan):
        raise TunerError(f"study {plan.name!r} has other objectives than its record says")
    study_id = storage.get_study_id_from_name(plan.name)
    return SharedStudy(study, storage, study_id, store, record, plan, engine, worker)


@contextmanager
def quiet_optuna_warnings() -> Iterator[None]:
    """Optuna flags its heartbeat API as experimental, and heartbeats outside ``optimize``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        yield


def trial_id(shared: SharedStudy, trial: optuna.Trial) -> int:
    """The storage's id of a trial, asked of the storage by study and trial number (Optuna's
    ``Trial`` has no public accessor for it)."""
    return shared.storage.get_trial_id_from_study_id_trial_number(shared.study_id, trial.number)
