"""Issue 30, item 3: a study's storage writes are batched (a trial's parameters and marks in
one transaction before it runs, its results in one after), SQLite runs in WAL mode with
``synchronous=NORMAL``, and what a killed process committed is still there; the trace's
requests are prepared once per study, not once per trial."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.engines.sim import request as sim_request
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.trace import ShapeOptions, load_trace
from tests.conftest import MOONCAKE
from tests.test_tuning_loop import run_args, stored

TRIALS = 4


@pytest.fixture
def write_transactions() -> Iterator[list[str]]:
    """Every committed transaction that wrote something, on any engine, by the URL of its
    database (SQLAlchemy's engine events: what reaches the database, whoever writes)."""
    wrote: set[int] = set()
    committed: list[str] = []

    def on_execute(connection, cursor, statement, *_):  # type: ignore[no-untyped-def]
        if statement.lstrip().split(" ", 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            wrote.add(id(connection))

    def on_commit(connection):  # type: ignore[no-untyped-def]
        if id(connection) in wrote:
            wrote.discard(id(connection))
            committed.append(str(connection.engine.url))

    event.listen(Engine, "before_cursor_execute", on_execute)
    event.listen(Engine, "commit", on_commit)
    try:
        yield committed
    finally:
        event.remove(Engine, "before_cursor_execute", on_execute)
        event.remove(Engine, "commit", on_commit)


def _check_batched(tune, storage: str, committed: list[str]) -> None:
    code, _, err = tune(*run_args(storage, TRIALS))
    assert code == 0, err
    # Per trial: queued (the baseline and rule trials), Optuna's ask, its settings before it
    # runs, its record, Optuna's tell; and about ten for the tables and the study. Before
    # batching, every parameter, constraint and mark was a transaction of its own (~24).
    assert len(committed) <= 5 * TRIALS + 10, f"{len(committed)} write transactions"
    study = optuna.load_study(study_name="s", storage=storage)
    _, records = stored(storage)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * TRIALS
    for trial, record in zip(study.trials, records, strict=True):
        # everything the trial set reached the database, with its state
        assert {"feasible", "settings", "serve_command", "runner"} <= set(trial.user_attrs)
        assert trial.user_attrs["settings"] == record.settings
        assert trial.params and trial.params == record.params
        constraints = {k for k in trial.system_attrs if k.startswith("constraints")}
        assert len(constraints) == 3, trial.system_attrs  # p99_tpot, p99_ttft, errors


def test_a_study_writes_each_trial_in_a_few_transactions(
    tune, tmp_path: Path, write_transactions: list[str]
) -> None:
    _check_batched(tune, f"sqlite:///{tmp_path / 'tune.db'}", write_transactions)


def test_a_study_on_postgresql_writes_each_trial_in_a_few_transactions(
    tune, postgres_url: str, write_transactions: list[str]
) -> None:
    _check_batched(tune, postgres_url, write_transactions)


def _pragmas(engine: Engine) -> tuple[str, int]:
    with engine.connect() as connection:
        mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
        sync = connection.exec_driver_sql("PRAGMA synchronous").scalar()
    return str(mode), int(sync or 0)


def test_sqlite_storage_is_in_wal_mode_with_normal_sync(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    assert tune(*run_args(storage, 1))[0] == 0
    # Checkpointed as the command ends: the file alone is the study, and can be copied alone.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("tune.db")) == [
        "tune.db",
        "tune.db.lock",
        "tune.db.runs.lock",
    ]
    assert _pragmas(TunerStore(storage).engine) == ("wal", 1)  # 1: NORMAL
    from prefill_tuner.storage.batched import BatchedStorage

    assert _pragmas(BatchedStorage(storage).engine) == ("wal", 1)


KILLED_AFTER_COMMIT = textwrap.dedent(
    """
    import os, signal, sys
    from prefill_tuner.storage.store import TunerStore
    store = TunerStore(sys.argv[1])
    for index in range(3):
        store.create_study(name=f"kept-{index}", objective_mode="latency", slos=[],
                           error_budget=0.0, engine="sim", model="m", trace_path="",
                           trace_sha256="", trace_format="", shaping={}, space={})
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_what_a_killed_process_committed_is_kept(tmp_path: Path) -> None:
    """synchronous=NORMAL does not wait for the disk at commit, only for ``write()``: the
    commits sit in the ``-wal`` file (the page cache), which a killed process leaves as it
    is; the next opener reads them from there."""
    database = tmp_path / "tune.db"
    storage = f"sqlite:///{database}"
    process = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_COMMIT, storage], capture_output=True, text=True
    )
    assert process.returncode == -signal.SIGKILL, process.stderr
    wal = Path(f"{database}-wal")
    assert wal.exists() and wal.stat().st_size > 0  # not checkpointed: read from the WAL
    assert TunerStore(storage).study_names() == ["kept-0", "kept-1", "kept-2"]


def test_a_trace_is_prepared_once_for_every_run_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trials of a study replay one trace object: its requests are interned once, and
    every run gives what a run of a fresh copy gives."""
    profile = load_profile("llama-3.1-8b-h100")
    shaping = ShapeOptions(max_requests=200, rate_scale=0.5, max_model_len=32768)
    trace = load_trace(str(MOONCAKE), options=shaping)
    config = SimConfig(**{**profile.engine_defaults, "max_model_len": 32768})
    chains = 0
    original = sim_request.PrefixInterner.chain

    def counted(self, blocks, block_size):  # type: ignore[no-untyped-def]
        nonlocal chains
        chains += 1
        return original(self, blocks, block_size)

    monkeypatch.setattr(sim_request.PrefixInterner, "chain", counted)
    first = simulate(trace, config, profile)
    interned = chains
    assert interned > 0
    again = [
        simulate(trace, config.model_copy(update={"max_num_seqs": n}), profile) for n in (8, 1024)
    ]
    assert chains == interned  # nothing interned again
    assert again[1].records == first.records and again[1].steps == first.steps
    fresh = simulate(load_trace(str(MOONCAKE), options=shaping), config, profile)
    assert fresh.records == first.records and chains == 2 * interned
    assert again[0].steps != first.steps  # the settings still count


def test_templates_go_with_their_trace() -> None:
    trace = load_trace(str(MOONCAKE), options=ShapeOptions(max_requests=20))
    sim_request.request_templates(trace)
    key = id(trace)
    assert key in sim_request._TEMPLATES
    del trace
    assert key not in sim_request._TEMPLATES  # freed with the trace (no cycle holds it)
