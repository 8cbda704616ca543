"""Reading and writing the tuner's records; one place for every query."""

from __future__ import annotations

import fcntl
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from prefill_tuner.errors import TunerError
from prefill_tuner.redaction import redact
from prefill_tuner.storage.models import Base, EngineVersion, NightlyRun, StudyRecord, TrialRecord
from sqlalchemy import create_engine, inspect, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, selectinload


def _json_safe(value: Any) -> Any:
    """What a record may hold: no secret (:func:`prefill_tuner.redaction.redact`, whatever
    path the value came by), and no NaN or infinity in JSON (PostgreSQL refuses them: null)."""
    return _finite(redact(value))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


class TunerStore:
    """The tuner's tables in the study database (created on first use)."""

    def __init__(self, url: str) -> None:
        self.url = url
        """The database URL, password included (never print it: :func:`redact_url`)."""
        try:
            self.engine: Engine = create_engine(url, future=True)
            Base.metadata.create_all(self.engine)
            _add_new_columns(self.engine)
        except SQLAlchemyError as exc:
            raise TunerError(
                f"cannot open the storage {redact_url(url)}: {str(exc).splitlines()[0]}"
            ) from None

    def session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    def get_study(self, name: str) -> StudyRecord | None:
        with self.session() as session:
            return session.scalar(select(StudyRecord).where(StudyRecord.name == name))

    def study_names(self) -> list[str]:
        with self.session() as session:
            return list(session.scalars(select(StudyRecord.name).order_by(StudyRecord.id)))

    def create_study(self, **fields: Any) -> StudyRecord:
        record = StudyRecord(**_json_safe(fields), created_at=datetime.now(timezone.utc))
        with self.session() as session, session.begin():
            session.add(record)
        return record

    def record_definition(
        self, study: StudyRecord, target_trials: int, definition: dict[str, Any]
    ) -> None:
        """Record the study's target trial count and what workers need to rebuild its plan."""
        with self.session() as session, session.begin():
            session.execute(
                update(StudyRecord)
                .where(StudyRecord.id == study.id)
                .values(target_trials=target_trials, definition=_json_safe(definition))
            )
        study.target_trials, study.definition = target_trials, definition

    @contextmanager
    def study_lock(self, study: StudyRecord) -> Iterator[None]:
        """Hold the study's lock, across processes and machines, while the block runs.

        PostgreSQL (and other servers): a row lock on the study's ``tuner_studies`` row, in a
        transaction of its own (``FOR NO KEY UPDATE``, so trials can still be inserted while
        it is held). SQLite: an exclusive ``flock`` on ``DATABASE.lock`` beside the file (the
        database's own write lock would block Optuna's writes made inside the block).
        """
        if self.engine.dialect.name != "sqlite":
            with self.session() as session, session.begin():
                session.execute(
                    select(StudyRecord.id)
                    .where(StudyRecord.id == study.id)
                    .with_for_update(key_share=True)
                )
                yield
            return
        database = self.engine.url.database
        if not database or database == ":memory:":
            yield  # one process only
            return
        with open(f"{database}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def add_trial(self, study: StudyRecord, engine: str, version: str, **fields: Any) -> None:
        with self.session() as session, session.begin():
            engine_version = session.scalar(
                select(EngineVersion).where(
                    EngineVersion.engine == engine, EngineVersion.version == version
                )
            )
            if engine_version is None:
                engine_version = EngineVersion(engine=engine, version=version)
                session.add(engine_version)
                session.flush()
            session.add(
                TrialRecord(
                    study_id=study.id, engine_version_id=engine_version.id, **_json_safe(fields)
                )
            )

    def last_nightly(self, family: str) -> NightlyRun | None:
        """The latest ``tune nightly`` run of a study family."""
        with self.session() as session:
            return session.scalar(
                select(NightlyRun)
                .where(NightlyRun.family == family)
                .order_by(NightlyRun.generation.desc())
                .limit(1)
            )

    def add_nightly(self, run: NightlyRun) -> None:
        for column in NightlyRun.__table__.columns:
            setattr(run, column.name, _json_safe(getattr(run, column.name)))
        with self.session() as session, session.begin():
            session.add(run)

    def trials(self, study: StudyRecord) -> Sequence[TrialRecord]:
        with self.session() as session:
            return session.scalars(
                select(TrialRecord)
                .where(TrialRecord.study_id == study.id)
                .options(selectinload(TrialRecord.engine_version))
                .order_by(TrialRecord.trial_number)
            ).all()


def _add_new_columns(engine: Engine) -> None:
    """Bring a database written by an earlier version up to date: columns added since then are
    all nullable, so ``ALTER TABLE ... ADD COLUMN`` is the whole migration."""
    inspector = inspect(engine)
    missing = [
        (table, column)
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if column.name not in {c["name"] for c in inspector.get_columns(table.name)}
    ]
    if not missing:
        return
    with engine.begin() as connection:
        for table, column in missing:
            if not column.nullable:
                raise TunerError(
                    f"the storage's table {table.name} lacks column {column.name}, which cannot "
                    "be added to existing rows: use a new database"
                )
            kind = column.type.compile(dialect=engine.dialect)
            connection.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"))


def redact_url(url: str) -> str:
    """A storage URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
