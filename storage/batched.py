"""Optuna's storage for a study this process runs: a trial's writes in one transaction, and
SQLite in WAL mode with ``synchronous=NORMAL``.

Optuna's ``RDBStorage`` commits every write on its own: a trial's parameters, its
constraints and each user attribute, some twenty commits a trial (each a disk sync in SQLite's
default mode). :class:`BatchedStorage` keeps a running trial's parameter and attribute writes
in memory and writes them in the transaction that finishes the trial (its state and values),
which is what Optuna's own cached storage promises and no more: a trial's attributes reach the
database no later than its state, and :func:`write_now` writes them earlier when asked (the
study does once a trial's settings are drawn, before its engine runs). Reads see the kept
writes (every ``FrozenTrial`` the storage builds has them), so nothing in the process can tell
the difference. A crash (even SIGKILL)
loses only the trial in flight: it stays RUNNING, with the settings written before its run,
and is queued again on resume like any other orphan
(:func:`prefill_tuner.study.run.recover_orphans`).

SQLite (every engine the tuner opens on a file: this one and
:class:`~prefill_tuner.storage.store.TunerStore`'s): write-ahead logging with
``synchronous=NORMAL``. A commit appends to the ``-wal`` file with ``write()`` and does not wait
for the disk; the file is synced at checkpoints. What a commit wrote is then in the operating
system's page cache, which a process crash (SIGKILL included) does not touch: the next opener
replays the WAL, so a killed process loses nothing it committed. Only an operating-system
crash or a power cut can lose the last commits (never corrupting the database: SQLite's
documented guarantee for WAL + NORMAL). The default (rollback journal, ``FULL``) syncs the disk
two or three times a commit, which on a busy machine is where a study spent its seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import sqlite3
import weakref
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import event
from sqlalchemy.engine import Engine

SQLITE_JOURNAL_MODE = "WAL"
SQLITE_SYNCHRONOUS = "NORMAL"


def tune_sqlite(engine: Engine) -> None:
    """Every new connection of ``engine`` (a SQLite one; others are left alone) in WAL mode
    with ``synchronous=NORMAL`` (see the module's docstring). WAL mode is kept in the file, so
    setting it again is a no-op; the sync level is each connection's own."""
    if engine.dialect.name != "sqlite":
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            # a file SQLite cannot change (a read-only medium) keeps its journal: slower
            with contextlib.suppress(sqlite3.OperationalError):
                cursor.execute(f"PRAGMA journal_mode={SQLITE_JOURNAL_MODE}")
            cursor.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
        finally:
            cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened before the listener are opened again with it
    _OPEN.add(engine)


_OPEN: weakref.WeakSet[Engine] = weakref.WeakSet()
"""The SQLite engines tuned here that may still hold connections."""


@atexit.register
def close_databases() -> None:
    """Close every tuned engine's pooled connections (the ``tune`` command does as it ends,
    and any process as it exits): SQLite checkpoints the WAL into the database when its last
    connection closes and removes the ``-wal`` and ``-shm`` files, so a study left by a
    finished command is one self-contained file again, which can be copied alone (a killed
    process leaves them, and the next opener replays them)."""
    for engine in list(_OPEN):
        engine.dispose()


def optuna_storage(url: str, **options: Any) -> RDBStorage:
    """Optuna's storage on ``url`` (``options``: ``RDBStorage``'s), its SQLite connections tuned
    as the tuner's own and closed with them (:func:`close_databases`): every study the tuner
    loads goes through here or :class:`BatchedStorage`, never a bare URL, whose connections
    would keep the WAL beside the database until they were collected."""
    storage = RDBStorage(url, **options)
    tune_sqlite(storage.engine)
    return storage


class _Pending:
    """One running trial's writes not yet in the database."""

    __slots__ = ("params", "system_attrs", "user_attrs")

    def __init__(self) -> None:
        self.params: dict[str, tuple[float, BaseDistribution, BaseDistribution | None]] = {}
        self.user_attrs: dict[str, Any] = {}
        self.system_attrs: dict[str, Any] = {}


class BatchedStorage(RDBStorage):
    """``RDBStorage`` that writes a trial's parameters and attributes with its state (see the
    module's docstring)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        tune_sqlite(self.engine)
        self._pending: dict[int, _Pending] = {}

    def __getstate__(self) -> dict[Any, Any]:
        self.flush()
        return super().__getstate__()

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        tune_sqlite(self.engine)

    def _kept(self, trial_id: int) -> _Pending:
        pending = self._pending.get(trial_id)
        if pending is None:
            pending = self._pending[trial_id] = _Pending()
        return pending

    # --- writes kept until the trial's state changes ---------------------------------------

    def _set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
        previous_distribution: BaseDistribution | None,
    ) -> None:
        if previous_distribution is not None:  # the check Optuna makes, made now
            from optuna.distributions import check_distribution_compatibility

            check_distribution_compatibility(previous_distribution, distribution)
        self._kept(trial_id).params[param_name] = (
            param_value_internal,
            distribution,
            previous_distribution,
        )

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._kept(trial_id).user_attrs[key] = value

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._kept(trial_id).system_attrs[key] = value

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
        """The kept writes and the state in one transaction (Optuna's session is the thread's
        one scoped session: what is added here commits with the state, or not at all)."""
        pending = self._pending.pop(trial_id, None)
        if pending is not None:
            try:
                self._write(pending, trial_id)
            except BaseException:
                self.scoped_session().rollback()
                self._pending[trial_id] = pending
                raise
        try:
            return super().set_trial_state_values(trial_id, state, values)
        except BaseException:
            if pending is not None and trial_id not in self._pending:
                self._pending[trial_id] = pending  # nothing was committed: keep them
            raise

    def _write(self, pending: _Pending, trial_id: int) -> None:
        from optuna.storages._rdb import models

        session = self.scoped_session()
        for name, (value, distribution, previous) in pending.params.items():
            self._set_trial_param_without_commit(
                session, trial_id, name, value, distribution, previous
            )
        for key, value in pending.user_attrs.items():
            self._set_trial_attr_without_commit(
                session, models.TrialUserAttributeModel, trial_id, key, value
            )
        for key, value in pending.system_attrs.items():
            self._set_trial_attr_without_commit(
                session, models.TrialSystemAttributeModel, trial_id, key, value
            )

    def flush(self) -> None:
        """Write every kept write now (each trial's in one transaction)."""
        from optuna.storages._rdb.storage import _create_scoped_session

        while self._pending:
            trial_id, pending = next(iter(self._pending.items()))
            with _create_scoped_session(self.scoped_session):  # the session _write adds to
                self._write(pending, trial_id)
            del self._pending[trial_id]

    # --- reads see the kept writes ---------------------------------------------------------

    def get_trial_user_attrs(self, trial_id: int) -> dict[str, Any]:
        attrs = super().get_trial_user_attrs(trial_id)
        pending = self._pending.get(trial_id)
        return {**attrs, **pending.user_attrs} if pending else attrs

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        attrs = super().get_trial_system_attrs(trial_id)
        pending = self._pending.get(trial_id)
        return {**attrs, **pending.system_attrs} if pending else attrs

    def get_trial_param(self, trial_id: int, param_name: str) -> float:
        pending = self._pending.get(trial_id)
        if pending is not None and param_name in pending.params:
            return pending.params[param_name][0]
        return super().get_trial_param(trial_id, param_name)

    def _build_frozen_trial_from_trial_model(self, trial: Any) -> FrozenTrial:
        frozen = super()._build_frozen_trial_from_trial_model(trial)
        pending = self._pending.get(frozen._trial_id)
        if pending is None:
            return frozen
        params, distributions = dict(frozen.params), dict(frozen.distributions)
        for name, (value, distribution, _) in pending.params.items():
            params[name] = distribution.to_external_repr(value)
            distributions[name] = distribution
        frozen.params, frozen.distributions = params, distributions
        frozen.user_attrs = {**frozen.user_attrs, **pending.user_attrs}
        frozen.system_attrs = {**frozen.system_attrs, **pending.system_attrs}
        return frozen


def write_now(study: Any) -> None:
    """Write the kept writes of ``study`` (an ``optuna.Study``) now, when its storage is a
    :class:`BatchedStorage` (Optuna wraps it in its cache, ``_CachedStorage``, whose
    ``_backend`` it is); any other storage has written them already."""
    storage = getattr(study, "_storage", None)
    backend = getattr(storage, "_backend", storage)
    if isinstance(backend, BatchedStorage):
        backend.flush()
