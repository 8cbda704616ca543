"""Nothing a user gives is destroyed: an output option given the path of an input (the trace,
the study database, one about to be created) is refused before any work, in one line, and the
input is left byte for byte; every command closes its engine, however it ends; one process at
a time runs a study (the lock is checked on PostgreSQL as on SQLite)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import sqlalchemy

from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.storage.store import RUN_LOCK_NAMESPACE, TunerStore
from tests.conftest import AZURE
from tests.test_tuning_loop import run_args


@pytest.fixture(autouse=True)
def _reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNE_NO_REPORT", raising=False)  # the suite's default (conftest.py)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def study_db(tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A database in the working folder holding one finished study ``s``."""
    monkeypatch.chdir(tmp_path)
    code, _, err = tune(*run_args("sqlite:///tune.db", 2))
    assert code == 0, err
    return tmp_path / "tune.db"


def _refused(tune, *args: str) -> str:
    code, out, err = tune(*args)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_the_report_never_replaces_the_trace(tune, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    shutil.copy(AZURE, trace)
    before = _digest(trace)
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["run", "--trace", str(trace), "--max-requests", "50", "--slo", "p99_tpot=50ms"]
    err = _refused(tune, *args, "--trials", "2", "--storage", storage, "--report", str(trace))
    assert f"is the input file {trace}" in err
    assert _digest(trace) == before
    assert not (tmp_path / "tune.db").exists()  # refused before the storage was opened


@pytest.mark.parametrize("report", ["tune.db", "./tune.db", "sub/../tune.db"])
def test_the_report_never_replaces_the_database_it_is_about_to_create(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    err = _refused(tune, *run_args("sqlite:///tune.db", 2), "--report", report)
    assert "is the input file tune.db" in err
    assert not (tmp_path / "tune.db").exists()


@pytest.mark.parametrize(
    "command",
    [
        ("export", "--format", "yaml", "-o", "tune.db"),
        ("export", "--format", "json", "-o", "tune.db"),
        ("report", "-o", "tune.db"),
        ("report", "-o", "link.db"),  # a link to it: refused, not followed
        ("run", *run_args("sqlite:///tune.db", 2)[1:], "--report", "tune.db"),
        ("calibrate", "--from-study", "s", "-o", "tune.db"),
    ],
    ids=["export-yaml", "export-json", "report", "report-link", "run-report", "calibrate"],
)
def test_no_output_replaces_the_study_database(
    tune, study_db: Path, command: tuple[str, ...]
) -> None:
    os.symlink(study_db, study_db.parent / "link.db")
    before = _digest(study_db)
    _refused(tune, *command)
    assert _digest(study_db) == before
    assert TunerStore(f"sqlite:///{study_db}", create=False).get_study("s") is not None


def test_no_output_replaces_another_database(tune, study_db: Path) -> None:
    """A database the command does not use (a copy, another project's) is no output either:
    no output of ours is a SQLite file, and replacing one loses every study in it."""
    other = study_db.parent / "backup.db"
    shutil.copy(study_db, other)
    before = _digest(other)
    err = _refused(tune, "export", "--format", "shell", "-o", str(other))
    assert "is a SQLite database" in err
    assert _digest(other) == before


def test_every_command_closes_its_engine(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command that builds an engine closes it when it ends, however it ends: a real
    engine's config helper process would otherwise outlive the command."""
    monkeypatch.chdir(tmp_path)  # its report
    closed: list[int] = []
    monkeypatch.setattr(SimEngine, "close", lambda self: closed.append(id(self)))
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 2))
    assert code == 0, err
    assert len(closed) == 1
    code, _, err = tune(*run_args(storage, 2, "--error-budget", "0.5"))  # refused resume
    assert code == 2, err
    assert len(closed) == 2


def test_one_process_runs_a_study_on_postgresql(postgres_url: str) -> None:
    """The advisory lock: another session (another process's) cannot take a study's run
    lock while a run holds it, and can once the run's block ends."""
    store = TunerStore(postgres_url)
    record = store.create_study(
        name="s",
        objective_mode="latency",
        slos=[],
        error_budget=0.0,
        engine="sim",
        model="m",
        trace_path="",
        trace_sha256="",
        trace_format="",
        shaping={},
        space={},
    )
    other = sqlalchemy.create_engine(postgres_url)
    keys = {"a": RUN_LOCK_NAMESPACE, "b": record.id}
    try_lock = sqlalchemy.text("SELECT pg_try_advisory_lock(:a, :b)")
    try:
        with store.run_lock(record) as held, other.connect() as session:
            assert held
            with store.run_lock(record) as again:
                assert again  # this process already holds it: a block inside another
            assert session.scalar(try_lock, keys) is False
        with other.connect() as session:
            assert session.scalar(try_lock, keys) is True
    finally:
        other.dispose()
        store.engine.dispose()


PROFILE = Path(__file__).parents[1] / "tuner/engines/sim/profiles/llama-3.1-8b-h100.yaml"


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder holding a trace, a profile, a space file and a model config."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(AZURE, tmp_path / "t.csv")
    shutil.copy(PROFILE, tmp_path / "p.yaml")
    (tmp_path / "space.yaml").write_text("max_num_batched_tokens: 512..8192\n")
    (tmp_path / "cfg").mkdir()
    shutil.copy(
        Path(__file__).parents[1]
        / "tuner/engines/sim/kernels/models/meta-llama--Llama-3.1-8B-Instruct.json",
        tmp_path / "cfg/config.json",
    )
    return tmp_path


SHORT_RUN = ("run", "--trace", "t.csv", "--max-requests", "40", "--slo", "p99_tpot=50ms")


@pytest.mark.parametrize(
    ("command", "victim"),
    [
        ((*SHORT_RUN, "--trials", "2", "--profile", "p.yaml", "--report", "p.yaml"), "p.yaml"),
        ((*SHORT_RUN, "--trials", "2", "--space-file", "space.yaml", "--report", "space.yaml"),
         "space.yaml"),
        (("simulate", "--trace", "t.csv", "--max-requests", "40", "--profile", "p.yaml",
          "--steps-out", "p.yaml"), "p.yaml"),
        (("profile", "--gpu", "h100_sxm", "--model-config", "cfg", "-o", "cfg/config.json"),
         "cfg/config.json"),
        ((*SHORT_RUN, "--trials", "2", "--report", "hard.csv"), "t.csv"),  # a hard link to it
    ],
    ids=["run-profile", "run-space-file", "simulate-profile", "profile-config", "hard-link"],
)  # fmt: skip
def test_no_output_replaces_an_input_of_its_command(
    tune, inputs: Path, command: tuple[str, ...], victim: str
) -> None:
    os.link(inputs / "t.csv", inputs / "hard.csv")
    before = _digest(inputs / victim)
    err = _refused(tune, *command, *(["--storage", "sqlite:///x.db"] if "run" in command else []))
    assert "is the input file" in err
    assert _digest(inputs / victim) == before
    assert not (inputs / "x.db").exists()  # refused before any trial was stored


def test_a_report_never_replaces_the_study_trace(tune, inputs: Path) -> None:
    """The study's stored trace is an input of ``tune report`` (it replays two trials)."""
    code, _, err = tune(*SHORT_RUN, "--trials", "2", "--study", "rr", "--no-report")
    assert code == 0, err
    before = _digest(inputs / "t.csv")
    err = _refused(tune, "report", "--study", "rr", "-o", "t.csv")
    assert "is the input file" in err
    assert _digest(inputs / "t.csv") == before


@pytest.mark.parametrize(
    "side", ["tune.db-journal", "tune.db-wal", "tune.db.lock", "tune.db.runs.lock"]
)
def test_no_output_replaces_a_file_beside_the_database(tune, study_db: Path, side: str) -> None:
    """SQLite deletes a stale journal at the next open, and the locks are the study's: the
    files beside a database are its own."""
    err = _refused(tune, "report", "-o", side)
    assert "is the input file" in err
    err = _refused(tune, *run_args("sqlite:///tune.db", 2), "--report", side)
    assert "is the input file" in err


def test_a_resume_with_the_profile_changed_is_refused(tune, inputs: Path) -> None:
    """The profile file keeps its name but not its content: the study would mix two
    simulators. Refused, naming what differs, before any trial; the same profile resumes."""
    args = (*SHORT_RUN, "--profile", "p.yaml", "--study", "c1", "--no-report")
    code, _, err = tune(*args, "--trials", "2")
    assert code in (0, 4), err
    original = (inputs / "p.yaml").read_text()
    changed = original.replace("\noverhead_ms: 0.5\n", "\noverhead_ms: 0.6\n")
    assert changed != original
    (inputs / "p.yaml").write_text(changed)
    err = _refused(tune, *args, "--trials", "3")
    assert "exists with a different engine" in err and "sha256" in err
    (inputs / "p.yaml").write_text(original)
    code, _, err = tune(*args, "--trials", "3")
    assert code in (0, 4), err


def test_a_moved_trace_is_re_pointed_by_its_hash(tune, inputs: Path) -> None:
    """The study's trace moved: ``--trace NEW`` on report or diagnose is checked by its
    sha256 and recorded, so later commands find it; another file is refused."""
    code, _, err = tune(*SHORT_RUN, "--trials", "2", "--study", "mv", "--no-report")
    assert code in (0, 4), err
    (inputs / "moved").mkdir()
    (inputs / "t.csv").rename(inputs / "moved/t.csv")
    code, _, err = tune("diagnose", "--study", "mv")
    assert code == 2 and "cannot be read here" in err and "--trace" in err, err
    err = _refused(tune, "diagnose", "--study", "mv", "--trace", "p.yaml")
    assert "not the trace of study 'mv'" in err
    code, _, err = tune("diagnose", "--study", "mv", "--trace", "moved/t.csv")
    assert code == 0, err
    code, _, err = tune("diagnose", "--study", "mv")  # the new place is recorded
    assert code == 0, err
    record = TunerStore("sqlite:///tune.db").get_study("mv")
    assert record is not None and record.trace_path == str(inputs / "moved/t.csv")


def test_a_study_of_the_bundled_sample_survives_a_reinstall(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sample ships by hash: when the recorded path is gone (a reinstall moved
    site-packages), the installed sample with the same bytes is the study's trace."""
    monkeypatch.chdir(tmp_path)
    code, _, err = tune(
        "run", "--slo", "p99_tpot=50ms", "--max-requests", "60", "--trials", "2",
        "--study", "sample", "--no-report",
    )  # fmt: skip
    assert code in (0, 4), err
    store = TunerStore("sqlite:///tune.db")
    record = store.get_study("sample")
    assert record is not None
    store.set_trace_path(record, "/gone/site-packages/prefill_tuner/data/sample_trace.jsonl")
    code, _, err = tune("diagnose", "--study", "sample")
    assert code == 0, err
