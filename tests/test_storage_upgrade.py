"""A database written by an earlier version opens: columns added since are added to it."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore

# tuner_studies as the previous release created it (before target_trials and definition).
OLD_STUDIES = """
CREATE TABLE tuner_studies (
    id INTEGER PRIMARY KEY, name VARCHAR(255) UNIQUE, objective_mode VARCHAR(32), slos JSON,
    error_budget FLOAT, engine VARCHAR(32), model VARCHAR(255), trace_path TEXT,
    trace_sha256 VARCHAR(64), trace_format VARCHAR(32), shaping JSON, space JSON,
    created_at TIMESTAMP WITH TIME ZONE
)
"""
OLD_ROW = """
INSERT INTO tuner_studies VALUES (1, 'old', 'latency', '["p99_tpot=50ms"]', 0.0, 'sim', 'm',
    't.jsonl', 'abc', 'jsonl', '{}', '{}', '2026-11-28 00:00:00+00:00')
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def old_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with create_engine(url).begin() as connection:
        connection.execute(text(OLD_STUDIES))
        connection.execute(text(OLD_ROW))
    return url


def test_an_old_database_gains_the_new_columns_and_keeps_its_rows(old_database: str) -> None:
    store = TunerStore(old_database)
    columns = {c["name"] for c in inspect(store.engine).get_columns("tuner_studies")}
    assert {"target_trials", "definition"} <= columns
    record = store.get_study("old")
    assert isinstance(record, StudyRecord) and record.slos == ["p99_tpot=50ms"]
    assert record.target_trials is None and record.definition is None
    TunerStore(old_database)  # a second open finds nothing to add
