"""Reading and writing the tuner's records; one place for every query."""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import re
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy import create_engine, inspect, select, text, update
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, selectinload

from prefill_tuner.errors import TunerError
from prefill_tuner.files import SQLITE_HEADER, declare_inputs
from prefill_tuner.redaction import redact
from prefill_tuner.search_spaces.render import canonical_command
from prefill_tuner.search_spaces.rules import canonical
from prefill_tuner.storage.batched import tune_sqlite
from prefill_tuner.storage.models import Base, EngineVersion, NightlyRun, StudyRecord, TrialRecord


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


@dataclass(frozen=True)
class TrialRow:
    """One finished trial as :meth:`TunerStore.add_trial` records it: the columns of
    :class:`~prefill_tuner.storage.models.TrialRecord` that the study gives (each documented
    there), typed."""

    trial_number: int
    params: dict[str, Any]
    settings: dict[str, Any]
    repairs: list[str]
    serve_command: str
    resolved_config: dict[str, Any]
    trace_sha256: str
    shaping: dict[str, Any]
    metrics: dict[str, Any] | None
    objectives: dict[str, float]
    constraints: dict[str, float]
    slacks: dict[str, float]
    feasible: bool
    status: str
    started_at: datetime
    wall_s: float
    is_baseline: bool = False
    failure_reason: str | None = None
    log_path: str | None = None
    startup_s: float | None = None


class TunerStore:
    """The tuner's tables in the study database (created on first use)."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        """Open the storage (``create``: a new SQLite file may be made; else it must exist)."""
        self.url = url
        """The database URL, password included (never print it: :func:`redact_url`)."""
        parsed = check_storage_url(url, must_exist=not create)
        declare_inputs(inputs_of(url))  # no output of this command may replace them
        try:
            self.engine: Engine = create_engine(parsed, future=True)
            if parsed.get_backend_name() == "sqlite":
                _check_sqlite_file(self.engine)
                tune_sqlite(self.engine)  # WAL, synchronous=NORMAL: see storage/batched.py
            Base.metadata.create_all(self.engine)
            _add_new_columns(self.engine)
        except SQLAlchemyError as exc:
            raise TunerError(
                f"cannot open the storage {redact_url(url)}: {storage_error(exc, url)}"
            ) from None

    def checkpoint(self) -> None:
        """SQLite: copy what the write-ahead log holds into the database file and empty the
        log (``PRAGMA wal_checkpoint(TRUNCATE)``), so that the file alone holds everything
        committed (one copied or checked without its ``-wal`` is whole). SQLite does this
        itself when a file's last connection closes; a job ends with this instead of
        relying on that. Nothing for other databases."""
        if self.engine.dialect.name != "sqlite":
            return
        with self.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

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

    def set_trace_path(self, study: StudyRecord, path: str) -> None:
        """Record where the study's trace now is (its bytes checked by the caller)."""
        with self.session() as session, session.begin():
            session.execute(
                update(StudyRecord).where(StudyRecord.id == study.id).values(trace_path=path)
            )
        study.trace_path = path

    def record_headroom(self, study: StudyRecord, headroom: dict[str, Any] | None) -> None:
        """Keep the study's headroom checks (:attr:`StudyRecord.headroom`)."""
        with self.session() as session, session.begin():
            session.execute(
                update(StudyRecord)
                .where(StudyRecord.id == study.id)
                .values(headroom=_json_safe(headroom))
            )
        study.headroom = headroom

    @contextmanager
    def study_lock(self, study: StudyRecord) -> Iterator[None]:
        """Hold the study's lock, across processes and machines, while the block runs.

        PostgreSQL (and other servers): a row lock on the study's ``tuner_studies`` row, in a
        transaction of its own (``FOR NO KEY UPDATE``, so trials can still be inserted while
        it is held). SQLite: an exclusive ``flock`` on ``DATABASE.lock`` beside the file (the
        database's own write lock would block Optuna's writes made inside the block). The
        file lock is the whole database's, so a block inside another (any study of the same
        file) holds it already.
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
        path = lock_path(database, ".lock")
        if path in _STUDY_LOCKS_HELD:
            yield  # this process holds it (a screening's study, inside a claim)
            return
        with open(path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _STUDY_LOCKS_HELD.add(path)
            try:
                yield
            finally:
                _STUDY_LOCKS_HELD.discard(path)
                fcntl.flock(lock, fcntl.LOCK_UN)

    @contextmanager
    def run_lock(self, study: StudyRecord) -> Iterator[bool]:
        """Hold the study's run lock while the block runs: the block gets ``True`` when it
        holds it (or this process already did: the block is inside another), ``False`` when
        another process does (it is not waited for).

        One process at a time runs a study's trials by its own count (``tune run``): two would
        each run ``--trials`` of them. The lock is the operating system's or the database
        server's, so it ends with its process however that ends (a SIGKILL included).
        PostgreSQL: a session-level advisory lock, on a connection of its own for the block.
        SQLite: a POSIX record lock, at the study's id, on ``DATABASE.runs.lock`` beside the
        file (the :meth:`study_lock` file is ``flock``'d: the two kinds never block each
        other)."""
        database = self.engine.url.database
        sqlite = self.engine.dialect.name == "sqlite"
        if sqlite and (not database or database == ":memory:"):
            yield True  # one process only
            return
        where = lock_path(database, ".runs.lock") if sqlite and database else redact_url(self.url)
        if (where, study.id) in _RUNS_HELD:
            yield True
            return
        acquired = _postgres_run_lock if not sqlite else _sqlite_run_lock
        with acquired(self.engine, where, study.id) as held:
            if held:
                _RUNS_HELD.add((where, study.id))
            try:
                yield held
            finally:
                _RUNS_HELD.discard((where, study.id))

    def add_trial(self, study: StudyRecord, engine: str, version: str, row: TrialRow) -> None:
        """Record a finished trial of ``study``, run on ``engine`` at ``version`` (the engine
        version's row is made on first sight)."""
        fields = {field.name: getattr(row, field.name) for field in dataclasses.fields(row)}
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
        """The study's trials, in trial order, each as recorded but with its settings and serve
        line in their canonical form (:func:`_canonical_trial`)."""
        with self.session() as session:
            rows = session.scalars(
                select(TrialRecord)
                .where(TrialRecord.study_id == study.id)
                .options(selectinload(TrialRecord.engine_version))
                .order_by(TrialRecord.trial_number)
            ).all()
        for row in rows:  # detached: nothing changed here is written back
            _canonical_trial(row)
        return rows


def _canonical_trial(row: TrialRecord) -> None:
    """An earlier version recorded some trials with a ``long_prefill_token_threshold`` at or
    above their budget, where it caps nothing: they ran exactly as with it off, so they read
    as off (settings, serve line, and a note among the repairs), and no report or export of
    an old study carries the dead flag."""
    settings, notes = canonical(row.settings or {})
    if notes:
        row.settings = settings
        row.serve_command = canonical_command(row.serve_command)
        row.repairs = [*(row.repairs or []), *notes]


_STUDY_LOCKS_HELD: set[str] = set()
"""The study-lock files this process holds (their ``flock`` would block a second open)."""
_RUN_LOCK_FILES: dict[str, Any] = {}
"""The run-lock files this process opened, kept open: closing any descriptor of a file drops
every POSIX lock the process holds on it (another study's run lock among them)."""
_RUNS_HELD: set[tuple[str, int]] = set()
"""(where, study id) of the run locks this process holds (see :meth:`TunerStore.run_lock`)."""

RUN_LOCK_NAMESPACE = 0x7475_6E65
"""The first key of PostgreSQL's advisory run locks ("tune"); the second is the study's id."""


@contextmanager
def _postgres_run_lock(engine: Engine, where: str, study_id: int) -> Iterator[bool]:
    with engine.connect() as connection:
        keys = {"a": RUN_LOCK_NAMESPACE, "b": study_id}
        held = bool(connection.scalar(text("SELECT pg_try_advisory_lock(:a, :b)"), keys))
        connection.commit()
        try:
            yield held
        finally:
            if held:
                connection.execute(text("SELECT pg_advisory_unlock(:a, :b)"), keys)
                connection.commit()


@contextmanager
def _sqlite_run_lock(engine: Engine, where: str, study_id: int) -> Iterator[bool]:
    lock = _RUN_LOCK_FILES.get(where)
    if lock is None:
        lock = _RUN_LOCK_FILES[where] = open(where, "a")  # noqa: SIM115 (see _RUN_LOCK_FILES)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, study_id)
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        fcntl.lockf(lock, fcntl.LOCK_UN, 1, study_id)


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


STORAGE_FORMS = "sqlite:///FILE or postgresql+psycopg://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
POSTGRES_EXTRA = "pip install 'vllm-prefill-tuner[postgres]'"
DRIVERS = {"postgresql": "psycopg", "sqlite": "pysqlite"}
"""The driver the tuner supports for each kind of database."""


SIDE_FILES = ("-journal", "-wal", "-shm", ".lock", ".runs.lock")
"""What lives beside a SQLite database: SQLite's rollback journal, write-ahead log and its
index, and our study and run locks (:meth:`TunerStore.study_lock`, :meth:`TunerStore.run_lock`)."""


def inputs_of(url: str) -> list[Path]:
    """The file a SQLite storage URL names, whether or not it exists yet, and the files beside
    it (:data:`SIDE_FILES`, by the name given and by the file's resolved name); none for a
    database server, an in-memory database or a URL that is no storage URL: what an output
    option must never replace (:func:`prefill_tuner.files.check_output`)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return []
    database = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if not database or database == ":memory:":
        return []
    names = dict.fromkeys([database, os.path.realpath(database)])
    return [Path(database)] + [Path(f"{name}{side}") for name in names for side in SIDE_FILES]


def lock_path(database: str, side: str) -> str:
    """The lock file beside a SQLite database, named after the file itself (a symbolic link's
    target), so that every path to one database finds the same lock."""
    return f"{os.path.realpath(database)}{side}"


def check_storage_url(url: str, *, must_exist: bool = False) -> URL:
    """The one reading of a storage URL, for every command and every open: a URL SQLAlchemy
    parses, with a numeric port, of a kind of database it knows, whose driver is installed;
    for SQLite, a file whose folder exists (``must_exist``: the file itself). Anything else is
    a one-line :class:`TunerError` naming the URL with its password masked."""
    shown = f"`storage_url` {redact_url(url)}"
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 (parsed on access: 'host:abc' fails here)
    except (ArgumentError, ValueError, TypeError):
        raise TunerError(f"{shown}: not a database URL; expected {STORAGE_FORMS}") from None
    try:
        dialect = parsed.get_dialect()
    except (NoSuchModuleError, ArgumentError):
        raise TunerError(
            f"{shown}: unknown kind of database {parsed.drivername!r}; expected {STORAGE_FORMS}"
        ) from None
    backend = parsed.get_backend_name()
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        driver = parsed.get_driver_name()
        if backend == "postgresql" and driver == DRIVERS["postgresql"]:
            hint = f"install it with {POSTGRES_EXTRA}"
        elif backend == "postgresql":
            hint = f"use postgresql+psycopg://... ({POSTGRES_EXTRA})"
        else:
            hint = f"the tuner supports {STORAGE_FORMS}"
        raise TunerError(
            f"{shown}: the {backend} driver {driver!r} is not installed (no module "
            f"{exc.name or driver!r}); {hint}"
        ) from None
    if backend == "sqlite":
        _check_sqlite_path(parsed, shown, must_exist)
    return parsed


def _check_sqlite_path(parsed: URL, shown: str, must_exist: bool) -> None:
    database = parsed.database or ""
    if parsed.query:  # ?mode=ro and the like: SQLAlchemy hands none of them to SQLite's file
        raise TunerError(
            f"{shown}: SQLite takes no URL options here ({', '.join(sorted(parsed.query))}); "
            "give sqlite:///FILE"
        )
    if not database or database == ":memory:":
        raise TunerError(
            f"{shown}: names no file, and an in-memory database keeps nothing (each "
            "connection sees its own); give sqlite:///FILE"
        )
    if database.startswith("file:"):
        return  # an SQLite URI: SQLite reads it
    path = Path(database)
    try:
        info: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:  # a link that loops, a folder we may not enter, a name too long
        raise TunerError(f"{shown}: cannot open {path}: {exc.strerror}") from None
    if info is None:
        if must_exist:
            raise TunerError(f"{shown}: no such database ({path} does not exist)")
        folder = path.parent if str(path.parent) else Path(".")
        if not os.path.isdir(folder):
            raise TunerError(f"{shown}: the folder {str(folder)!r} does not exist")
        return
    if stat.S_ISDIR(info.st_mode):
        raise TunerError(f"{shown}: {path} is a folder, not a database file")
    if not stat.S_ISREG(info.st_mode):
        raise TunerError(f"{shown}: {path} is not a regular file (a device, FIFO or socket)")
    if info.st_size == 0:
        if must_exist:  # SQLite would make it a database: a command that reads writes nothing
            raise TunerError(f"{shown}: {path} is an empty file, not a database")
        return  # a new database, as SQLite makes one (nothing in the file is lost)
    try:
        with open(path, "rb") as stream:
            header = stream.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise TunerError(f"{shown}: cannot read {path}: {exc.strerror}") from None
    if header.strip(b"\0") == b"":  # a zeroed first page, as a torn write leaves
        raise TunerError(
            f"the database {path} is damaged (its first page is zeroed): restore it from a "
            "backup or use another `storage_url`"
        )
    if header != SQLITE_HEADER:
        raise TunerError(
            f"{shown}: {path} is not a SQLite database (its first bytes are not "
            "'SQLite format 3'); nothing was written to it"
        )


"""How every SQLite database file begins (https://www.sqlite.org/fileformat.html)."""


def _check_sqlite_file(engine: Engine) -> None:
    """A damaged SQLite file (zeroed or torn pages) is refused at once, with what SQLite says,
    rather than failing later in whichever query reads the damage; one SQLite cannot open or
    read is said to be so, with SQLite's reason (it may not be damaged at all)."""
    try:
        with engine.connect() as connection:
            rows = [str(row[0]) for row in connection.exec_driver_sql("PRAGMA quick_check")]
    except DatabaseError as exc:
        reason = str(exc.orig or exc).splitlines()[0]
        if reason in _CANNOT_OPEN:
            raise TunerError(f"cannot open the database {engine.url.database}: {reason}") from None
        rows = [reason]
    if rows != ["ok"]:
        found = " ".join(" ".join(rows).replace("*** in database main ***", "").split())
        raise TunerError(
            f"the database {engine.url.database} is damaged ({found[:200]}): restore it from "
            "a backup or use another `storage_url`"
        )


_CANNOT_OPEN = {
    "unable to open database file",
    "disk I/O error",
    "attempt to write a readonly database",
}
"""SQLite's reasons that say the file could not be opened or read, not that it is damaged."""


def storage_error(exc: BaseException, url: str) -> str:
    """A database error's first line (the database's own words), the password masked."""
    cause: BaseException = exc
    while cause.__cause__ is not None and not isinstance(cause, SQLAlchemyError):
        cause = cause.__cause__
    lines = str(cause).strip().splitlines()
    return mask_password(lines[0] if lines else type(cause).__name__, url)


def mask_password(text: str, url: str) -> str:
    """``text`` with the URL replaced by its redacted form and the password by ``***``."""
    if url:
        text = text.replace(url, redact_url(url))
    password = _password(url)
    if not password:
        return text
    # As given, and as the database says it back: percent-decoded (``%40`` is ``@``).
    return text.replace(password, "***").replace(unquote(password), "***")


def _password(url: str) -> str:
    parts = _credentials(url)
    return parts[1] if parts else ""


def _credentials(url: str) -> tuple[str, str, str] | None:
    """``(SCHEME://USER, PASSWORD, HOST...)`` of a URL, or of text that looks like one (a
    mistyped URL may hold a password too); ``None`` without a password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" not in rest:
        return None
    credentials, _, host = rest.rpartition("@")
    user, colon, password = credentials.partition(":")
    return (f"{scheme}{sep}{user}", password, host) if colon else None


def redact_url(url: str) -> str:
    """A storage URL without its password, for messages: everything between the user name and
    the last ``@`` is masked (a password may hold ``@`` or ``:``), and so is a ``password=``
    query parameter. Text that only looks like a URL is masked the same way."""
    parts = _credentials(url)
    if parts is not None:
        url = f"{parts[0]}:***@{parts[2]}"
    return re.sub(r"(?i)(password=)[^&#]*", r"\1***", url)
