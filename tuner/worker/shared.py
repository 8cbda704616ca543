"""A worker's handles on the shared study: Optuna's storage with heartbeats, whose stale
(dead-worker) trials are failed and queued again, and the tuner's own records."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from pydantic import Field

from prefill_tuner import defaults
from prefill_tuner.declared import check_declared
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.storage.batched import optuna_storage
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore, redact_url
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.run import study_directions


@dataclass(frozen=True)
class Liveness:
    """How a worker shows it is alive, and when a silent one is taken for dead."""

    # The first paragraph of each field's docstring is its option's help (tune worker).
    heartbeat_s: Annotated[int, Field(ge=1, le=defaults.MAX_HEARTBEAT_S)] = defaults.HEARTBEAT_S
    """Seconds between a trial's heartbeats."""
    grace_s: Annotated[int, Field(ge=1, le=defaults.MAX_GRACE_S)] = defaults.GRACE_S
    """Seconds without a heartbeat after which a trial's worker is taken for dead: its trial
    is failed and run again by another worker."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.grace_s <= self.heartbeat_s:
            raise TunerError(
                f"`grace_s` {self.grace_s}: must be longer than `heartbeat_s` {self.heartbeat_s}"
            )


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
