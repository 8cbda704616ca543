"""Bad input (issue 11, items 9-14) is refused before any work: one line on stderr naming what
is wrong and where, exit code 2 (1 for a failing disk or pipe), no traceback, nothing
half-written."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from prefill_tuner.engines.real.engine import VllmEngine
from prefill_tuner.engines.real.resolver import VllmQueryError
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.space import EngineCapabilities
from prefill_tuner.storage.store import TunerStore
from tests.conftest import AZURE

TUNE = str(Path(sys.executable).parent / "tune")
SMALL = ["--trace", str(AZURE), "--max-requests", "40", "--slo", "p99_tpot=50ms"]


def stored(storage: str, name: str | None = None):
    store = TunerStore(storage)
    record = store.get_study(name or store.study_names()[0])
    assert record is not None
    return record, store.trials(record)


def one_line_error(code: int, out: str, err: str, expected_code: int = 2) -> str:
    assert code == expected_code, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in out + err
    return err


# Item 9: --set values are checked with the engine's own model, before any trial -----------
@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("max_num_seqs=0", "--set max_num_seqs=0: Input should be greater than or equal to 1"),
        ("enable_chunked_prefill=banana", "enable_chunked_prefill=banana: Input should be a valid"),
        ("block_size=0", "--set block_size=0"),
        ("watermark=2", "--set watermark=2: Input should be less than 1"),
        ("long_prefill_token_threshold=-3", "--set long_prefill_token_threshold=-3"),
        ("max_model_len=32768.5", "fractional part"),
        ("max_model_len=abc", "--set max_model_len=abc: Input should be a valid integer"),
    ],
)
def test_set_values_are_validated_before_any_trial(
    tune, tmp_path: Path, setting: str, words: str
) -> None:
    storage = tmp_path / "s.db"
    err = one_line_error(
        *tune("run", *SMALL, "--trials", "2", "--storage", f"sqlite:///{storage}", "--set", setting)
    )
    assert words in err
    assert not storage.exists(), "no study was created"


def test_valid_set_values_and_repairable_ones_still_run(tune, tmp_path: Path) -> None:
    code, _, err = tune(
        "run",
        *SMALL,
        "--trials",
        "2",
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
        "--set",
        "max_num_seqs=100000",  # lowered to each trial's budget, as before
        "--set",
        "max_model_len=8192",
    )
    assert code == 0, err


def test_set_values_run_as_the_engine_reads_them(tune, tmp_path: Path) -> None:
    """``enable_chunked_prefill=0`` is ``False`` to the simulator: the trials run with it (and
    the repair that goes with it), not with the integer 0 that every trial's config refuses."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    args = ("--trials", "2", "--storage", storage, "--set", "enable_chunked_prefill=0")
    code, _, err = tune("run", *SMALL, *args)
    assert code == 0, err
    _, trials = stored(storage)
    assert all(t.status == "complete" for t in trials), [t.failure_reason for t in trials]
    assert all(t.settings["enable_chunked_prefill"] is False for t in trials)


def test_real_engine_asks_vllm_about_fixed_settings_once() -> None:
    """The real engine validates ``--set`` through vLLM's own parser and config classes
    (``vllm_args.py resolve``), once, before any trial; vLLM's answer names the problem."""
    engine = object.__new__(VllmEngine)
    engine.python, engine.model, engine.server_args = "python", "m", ("--dtype", "float32")
    engine.capabilities = EngineCapabilities(
        "vllm", "0.32", accepted_flags=frozenset({"--max-num-seqs", "--max-num-batched-tokens"})
    )
    engine.defaults = {
        "scheduler_config": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
        "model_config": {"max_model_len": 4096},
    }
    calls: list[tuple[str, ...]] = []

    class Refusing:
        def resolve(self, model: str, args: list[str]) -> object:
            calls.append((model, *args))
            raise VllmQueryError("max_num_seqs: Input should be greater than 0")

    engine.resolver = Refusing()
    with pytest.raises(TunerError, match=r"`fixed` max_num_seqs=0: vLLM refuses it: max_num_seqs"):
        engine.validate_fixed({"max_num_seqs": 0})
    server = ("--dtype", "float32", "--max-num-batched-tokens", "2048", "--max-num-seqs", "0")
    assert calls == [("m", *server)]
    engine.validate_fixed({})  # nothing fixed: nothing to ask
    assert len(calls) == 1


# Item 10: a baseline outside the searched space runs as the baseline, said to be outside -----
@pytest.mark.parametrize(
    ("space", "note"),
    [
        (("--space", "enable_chunked_prefill=false"), "enable_chunked_prefill=true"),
        (("--space", "scheduler_reserve_full_isl=false"), "scheduler_reserve_full_isl=true"),
        (("--space-file", "{file}"), "enable_chunked_prefill=true"),
    ],
)
def test_a_baseline_outside_the_space_runs_and_is_said_to_be_outside(
    tune, tmp_path: Path, space: tuple[str, ...], note: str
) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text("enable_chunked_prefill: [false]\n")
    space = tuple(arg.format(file=space_file) for arg in space)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    code, out, err = tune("run", *SMALL, "--trials", "3", "--storage", storage, *space)
    assert code == 0, err
    assert "Traceback" not in out + err
    said = f"lies outside the searched space: {note}"
    assert said in err, "the header says so"
    assert said in out, "the summary says so"
    _, trials = stored(storage)
    assert [t.status for t in trials] == ["complete"] * 3
    baseline = next(t for t in trials if t.is_baseline)
    knob = note.split("=")[0]
    assert baseline.settings[knob] is True, "the baseline ran the engine's default"
    assert all(t.settings[knob] is False for t in trials if not t.is_baseline)
    code, out, _ = tune("pareto", "--storage", storage)
    assert code == 0 and said in out


# Item 11: storage URLs, one reading for every command, the password always masked ----------
NIGHTLY = [
    "nightly",
    "--study",
    "n",
    "--trace",
    str(AZURE),
    "--max-requests",
    "40",
    "--slo",
    "p99_tpot=50ms",
]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("postgresql+psycopg2://u:CANARY@h/x", "pip install 'vllm-prefill-tuner[postgres]'"),
        ("mysql://u:CANARY@127.0.0.1/x", "the mysql driver 'mysqldb' is not installed"),
        ("postgresql+psycopg://u:CANARY@127.0.0.1:abc/x", "not a database URL"),
        ("http://u:CANARY@x", "unknown kind of database 'http'"),
        ("no url at all", "not a database URL"),
        ("sqlite:////no/such/folder/x.db", "the folder '/no/such/folder' does not exist"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ["run", *SMALL],
        ["plan", *SMALL],
        ["worker", "--study", "s"],
        NIGHTLY,
        ["pareto"],
        ["export"],
    ],
    ids=["run", "plan", "worker", "nightly", "pareto", "export"],
)
def test_bad_storage_urls_are_one_line_with_the_password_masked(
    tune, url: str, words: str, command: list[str]
) -> None:
    err = one_line_error(*tune(*command, "--storage", url))
    assert words in err
    assert "CANARY" not in err
    assert "u:***@" in err or "CANARY" not in url


def test_a_missing_psycopg_names_the_extra(tune, monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_psycopg(name: str, *args, **kwargs):
        if name.split(".")[0] == "psycopg":
            raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psycopg)
    err = one_line_error(*tune("pareto", "--storage", "postgresql+psycopg://u:pw@h/db"))
    assert "driver 'psycopg' is not installed" in err
    assert "install it with pip install 'vllm-prefill-tuner[postgres]'" in err


@pytest.mark.parametrize("command", ["pareto", "export"])
def test_reading_a_database_that_does_not_exist_refuses_and_creates_nothing(
    tune, tmp_path: Path, command: str
) -> None:
    missing = tmp_path / "nope.db"
    err = one_line_error(*tune(command, "--storage", f"sqlite:///{missing}"))
    assert "no such database" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("page", [1, 2, 5, 12])
def test_a_damaged_database_is_named_damaged_by_run_and_pareto(
    tune, tmp_path: Path, page: int
) -> None:
    database = tmp_path / "s.db"
    storage = f"sqlite:///{database}"
    assert tune("run", *SMALL, "--trials", "2", "--storage", storage)[0] == 0
    with database.open("r+b") as stream:
        stream.seek(4096 * (page - 1))
        stream.write(b"\0" * 4096)
    for command in (["pareto"], ["run", *SMALL, "--trials", "3"]):
        err = one_line_error(*tune(*command, "--storage", storage))
        assert "is damaged" in err, err


# Item 13: the one file writer respects the umask and refuses what it must not replace -------
def test_outputs_get_the_umask_mode_or_keep_the_targets(tune, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.jsonl"
        assert tune("trace", "convert", str(AZURE), str(fresh), "--max-requests", "3")[0] == 0
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        os.umask(0o027)
        other = tmp_path / "other.jsonl"
        assert tune("trace", "synth", str(other), "--count", "3")[0] == 0
        assert stat.S_IMODE(other.stat().st_mode) == 0o640
        fresh.chmod(0o604)
        assert tune("trace", "synth", str(fresh), "--count", "3")[0] == 0
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o604, "an existing file keeps its mode"
    finally:
        os.umask(old)


def test_nightly_report_files_respect_the_umask(tmp_path: Path) -> None:
    from prefill_tuner.files import atomic_text

    old = os.umask(0o077)
    try:
        with atomic_text(tmp_path / "serve.yaml") as stream:
            stream.write("x: 1\n")
        with atomic_text(tmp_path / "serve.sh", executable=True) as stream:
            stream.write("#!/bin/sh\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "serve.yaml").stat().st_mode) == 0o600
    # The script is executable for its owner, and for nobody the umask excludes.
    assert stat.S_IMODE((tmp_path / "serve.sh").stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("make", "words"),
    [
        ("symlink", "is a symbolic link; refusing to replace it"),
        ("fifo", "is not a regular file"),
        ("folder", "is a folder"),
        ("device", "is not a regular file"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        ("trace", "convert", str(AZURE), "{out}"),
        ("trace", "synth", "{out}", "--count", "3"),
        ("simulate", "--trace", str(AZURE), "--max-requests", "3", "--steps-out", "{out}"),
        ("export", "--storage", "{db}", "-o", "{out}"),
        ("calibrate", "--from-study", "s", "--storage", "{db}", "-o", "{out}"),
    ],
    ids=["convert", "synth", "steps-out", "export", "calibrate"],
)
def test_outputs_that_are_not_regular_files_are_refused(
    tune, tmp_path: Path, make: str, words: str, command: tuple[str, ...]
) -> None:
    database = tmp_path / "s.db"
    if command[0] == "export":
        assert tune("run", *SMALL, "--trials", "2", "--storage", f"sqlite:///{database}")[0] == 0
    kept = tmp_path / "kept.jsonl"
    kept.write_text("keep me\n")
    out = tmp_path / "out"
    if make == "symlink":
        out.symlink_to(kept)
    elif make == "fifo":
        os.mkfifo(out)
    elif make == "folder":
        out.mkdir()
    else:  # a device node of our own (never a system one: a regression would replace it)
        try:
            os.mknod(out, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("creating a device node needs root")
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [arg.format(out=out, db=f"sqlite:///{database}") for arg in command]
    err = one_line_error(*tune(*args))
    assert f"{out}: {words}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing written beside it"
    assert kept.read_text() == "keep me\n"
    if make == "symlink":
        assert out.is_symlink()
    if make == "device":
        assert out.is_char_device()


@pytest.mark.parametrize(
    "command, words",
    [
        (["run", *SMALL, "--trace", "{input}", "--storage", "{db}"], "cannot read the file"),
        (["plan", *SMALL, "--trace", "{input}", "--storage", "{db}"], "cannot read the file"),
        (["trace", "stats", "{input}"], "cannot read the file"),
        (
            ["run", *SMALL, "--space-file", "{input}", "--storage", "{db}"],
            "cannot read the space file",
        ),
        (["simulate", "--trace", str(AZURE), "--profile", "{input}"], "cannot read the profile"),
        (["diagnose", "--steps", "{input}"], "cannot read the step trace"),
    ],
    ids=["run", "plan", "stats", "space-file", "profile", "steps"],
)
@pytest.mark.parametrize("make", ["fifo", "device"])
def test_an_input_that_is_a_device_or_a_pipe_is_refused(
    tune, tmp_path: Path, make: str, command: list[str], words: str
) -> None:
    """A device may never end (``/dev/zero`` once hung every reader) and a pipe cannot be read
    again to check a resumed study's trace: inputs are regular files."""
    path = Path("/dev/zero") if make == "device" else tmp_path / "fifo"
    if make == "fifo":
        os.mkfifo(path)
    args = [arg.format(input=path, db=f"sqlite:///{tmp_path / 's.db'}") for arg in command]
    err = one_line_error(*tune(*args))
    assert f"{path}: {words}: not a regular file (a device, FIFO or socket)" in err


def test_convert_refuses_to_overwrite_its_own_source(tune, tmp_path: Path) -> None:
    source = tmp_path / "a.csv"
    source.write_bytes(AZURE.read_bytes())
    for target in (source, tmp_path / "." / "a.csv"):
        err = one_line_error(*tune("trace", "convert", str(source), str(target)))
        assert "is the input file" in err
    assert source.read_bytes() == AZURE.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["a.csv"]


# Item 14: a full disk or a closed stdout is one line, exit 1, nothing half-written ---------
def test_a_full_disk_is_one_line_and_leaves_nothing(tune, tmp_path: Path, monkeypatch) -> None:
    database = tmp_path / "s.db"
    assert tune("run", *SMALL, "--trials", "2", "--storage", f"sqlite:///{database}")[0] == 0
    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, stream) -> None:
            self.stream = stream

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.stream.close()

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        writelines = write

    monkeypatch.setattr(os, "fdopen", lambda *a, **k: FullDisk(real_fdopen(*a, **k)))
    before = sorted(p.name for p in tmp_path.iterdir())
    for args in (
        ("trace", "convert", str(AZURE), str(tmp_path / "t.jsonl")),
        ("trace", "synth", str(tmp_path / "t.jsonl")),
        ("export", "--storage", f"sqlite:///{database}", "-o", str(tmp_path / "t.sh")),
        (
            "simulate",
            "--trace",
            str(AZURE),
            "--max-requests",
            "5",
            "--steps-out",
            str(tmp_path / "t.jsonl"),
        ),
    ):
        err = one_line_error(*tune(*args), expected_code=1)
        assert "No space left on device; nothing written" in err
        assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    "args",
    [
        ("trace", "convert", str(AZURE), "-"),
        ("trace", "synth", "-"),
        ("trace", "stats", "--json", str(AZURE)),
        ("pareto", "--storage", "{db}"),
        ("export", "--storage", "{db}"),
        ("simulate", "--trace", str(AZURE), "--max-requests", "5"),
    ],
)
def test_a_full_stdout_is_one_line_and_exit_1(tune, tmp_path: Path, args) -> None:
    database = tmp_path / "s.db"
    if "{db}" in args:
        assert tune("run", *SMALL, "--trials", "2", "--storage", f"sqlite:///{database}")[0] == 0
    args = [arg.format(db=f"sqlite:///{database}") for arg in args]
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [TUNE, *args], stdout=full, stderr=subprocess.PIPE, text=True, check=False
        )
    assert result.returncode == 1, result.stderr
    assert result.stderr == "error: cannot write to standard output: No space left on device\n"


@pytest.mark.parametrize(
    "args", [("trace", "convert", str(AZURE), "-"), ("trace", "synth", "-", "--count", "20000")]
)
def test_a_closed_stdout_is_one_line_and_exit_1(args) -> None:
    process = subprocess.Popen(
        [TUNE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    err = process.stderr.read()
    assert process.wait(timeout=120) == 1
    assert err == "error: standard output was closed before everything was written\n"


def test_a_full_database_is_one_line_and_exit_1(tune, tmp_path: Path, monkeypatch) -> None:
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from prefill_tuner.storage import store

    def full(*args: object, **kwargs: object) -> None:
        raise OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))

    monkeypatch.setattr(store.TunerStore, "add_trial", full)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    code, out, err = tune("run", *SMALL, "--trials", "2", "--storage", storage)
    assert code == 1
    assert "Traceback" not in out + err
    assert err.splitlines()[-1] == (
        "error: the storage failed: (sqlite3.OperationalError) database or disk is full"
    )


# Item 12: trace synth limits, option names in messages, one-request stats, sim-only flags ----
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--rate", "inf"), "--rate: inf is not a finite number"),
        (("--rate", "1e9", "--duration", "1e9"), "a synthetic trace holds at most 10,000,000"),
        (("--count", "100000000"), "a synthetic trace holds at most 10,000,000"),
        (("--duration", "inf"), "--duration: inf is not a finite number"),
        (("--duration", "1e13"), "--duration: must be at most"),
        (("--rate", "1e-12", "--count", "5"), "later than a trace may hold"),
        (("--mix", "99999999999x1", "--count", "2"), "at most 1,000,000,000 prompt or output"),
        (("--burst", "decode@1*99999999999"), "the count must be at most 10,000,000"),
        (("--arrivals", "gamma", "--cv", "inf"), "--cv: inf is not a finite number"),
        (("--rate", "nan"), "--rate: nan is not a number"),
    ],
)
def test_synth_refuses_what_it_cannot_write_or_read_back(
    tune, tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    err = one_line_error(*tune("trace", "synth", str(tmp_path / "x.jsonl"), *args))
    assert words in err
    assert list(tmp_path.iterdir()) == []


def test_what_synth_writes_at_its_limits_stats_reads_back(tune, tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    assert tune("trace", "synth", str(big), "--mix", "1000000000x1", "--count", "2")[0] == 0
    assert tune("trace", "stats", str(big))[0] == 0
    far = tmp_path / "far.jsonl"
    args = ("--rate", "2e-12", "--count", "2", "--arrivals", "uniform")
    assert tune("trace", "synth", str(far), *args)[0] == 0
    code, _, err = tune("trace", "stats", str(far))
    assert code == 0, err  # 5e11 seconds apart: no bin per second is allocated


def test_dequantize_errors_name_the_option(tune) -> None:
    err = one_line_error(*tune("trace", "stats", str(AZURE), "--dequantize", "-3"))
    assert err == (
        "error: --dequantize: must be a positive number of seconds up to 86400 (a day), or 'auto'\n"
    )


def test_a_one_request_trace_has_no_mean_rate(tune) -> None:
    code, out, _ = tune("trace", "stats", str(AZURE), "--max-requests", "1")
    assert code == 0
    assert "nan" not in out and "mean rate     n/a" in out


@pytest.mark.parametrize(
    "flag", [("--server-arg", "--dtype float32"), ("--server-env", "A=1"), ("--serve-cmd", "x")]
)
@pytest.mark.parametrize("command", ["run", "nightly"])
def test_real_engine_options_are_refused_with_the_simulator(
    tune, tmp_path: Path, flag: tuple[str, str], command: str
) -> None:
    base = ["run", *SMALL] if command == "run" else NIGHTLY
    storage = tmp_path / "s.db"
    err = one_line_error(*tune(*base, "--storage", f"sqlite:///{storage}", *flag))
    assert f"error: {flag[0]}: only for --engine vllm" in err
    assert not storage.exists()


def test_a_numeric_default_outside_its_range_runs_as_the_baseline(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    args = ("--trials", "3", "--storage", storage, "--space", "max_num_seqs=1..8")
    code, out, err = tune("run", *SMALL, *args)
    assert code == 0, err
    assert "lies outside the searched space: max_num_seqs=1024" in err + out
    _, trials = stored(storage)
    baseline = next(t for t in trials if t.is_baseline)
    assert baseline.settings["max_num_seqs"] == 1024
    assert all(t.settings["max_num_seqs"] <= 8 for t in trials if not t.is_baseline)
