"""Bad input found by issue 26 is refused before any work: one line on stderr naming what is
wrong and where, exit code 2, no traceback, nothing stored or half-written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefill_tuner.storage import store as store_module
from tests.conftest import AZURE
from tests.test_bad_input import SMALL, one_line_error

READ_ONLY = [
    ["pareto"],
    ["studies"],
    ["trials", "--study", "s"],
    ["export"],
    ["report"],
    ["diagnose", "--study", "s"],
]
READ_ONLY_IDS = ["pareto", "studies", "trials", "export", "report", "diagnose"]


# Item 2: a file that is not a SQLite database is never turned into one ----------------------
@pytest.mark.parametrize("command", READ_ONLY, ids=READ_ONLY_IDS)
def test_reading_an_empty_file_as_a_database_refuses_and_leaves_it_empty(
    tune, tmp_path: Path, command: list[str]
) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    err = one_line_error(*tune(*command, "--storage", f"sqlite:///{empty}"))
    assert f"{empty} is an empty file, not a database" in err
    assert empty.read_bytes() == b""
    assert [p.name for p in tmp_path.iterdir()] == ["empty.db"]


@pytest.mark.parametrize(
    "command", [*READ_ONLY, ["run", *SMALL, "--trials", "1"]], ids=[*READ_ONLY_IDS, "run"]
)
def test_a_trace_given_as_the_database_is_refused_and_left_as_it_was(
    tune, tmp_path: Path, command: list[str]
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(AZURE.read_bytes())
    err = one_line_error(*tune(*command, "--storage", f"sqlite:///{trace}"))
    assert f"{trace} is not a SQLite database" in err
    assert "damaged" not in err
    assert trace.read_bytes() == AZURE.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["trace.csv"]


def test_run_makes_an_empty_file_its_new_database(tune, tmp_path: Path) -> None:
    """An empty file holds nothing to lose (``mktemp`` makes one): ``tune run`` may create its
    database there, as SQLite itself does."""
    empty = tmp_path / "new.db"
    empty.write_bytes(b"")
    storage = f"sqlite:///{empty}"
    code, _, err = tune("run", *SMALL, "--trials", "1", "--no-report", "--storage", storage)
    assert code == 0, err
    assert tune("pareto", "--storage", storage)[0] == 0


# Item 8: an in-memory SQLite database keeps nothing -----------------------------------------
@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///:memory:"])
@pytest.mark.parametrize(
    "command", [["run", *SMALL, "--trials", "1", "--no-report"], ["pareto"]], ids=["run", "pareto"]
)
def test_an_in_memory_database_is_refused(tune, url: str, command: list[str]) -> None:
    err = one_line_error(*tune(*command, "--storage", url))
    assert f"--storage {url}: names no file" in err


# Item 10: a database that cannot be read is not called damaged ------------------------------
@pytest.mark.parametrize(
    ("make", "words"),
    [
        ("fifo", "is not a regular file (a device, FIFO or socket)"),
        ("loop", "cannot open {path}: Too many levels of symbolic links"),
        ("unreadable", "cannot read {path}: Permission denied"),
    ],
)
@pytest.mark.parametrize(
    "command", [["pareto"], ["run", *SMALL, "--trials", "1"]], ids=["pareto", "run"]
)
def test_a_database_that_cannot_be_read_says_why_not_damaged(
    tune, tmp_path: Path, monkeypatch, make: str, words: str, command: list[str]
) -> None:
    path = tmp_path / "s.db"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "loop":
        path.symlink_to(path)
    else:
        path.write_bytes(b"SQLite format 3\0" + b"\0" * 100)

        # chmod 000 does not stop root (the tests may run as root): the open fails instead.
        def refuse(file: object, *args: object, **kwargs: object) -> object:
            if Path(str(file)) == path:
                raise PermissionError(13, "Permission denied")
            return open(file, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(store_module, "open", refuse, raising=False)
    err = one_line_error(*tune(*command, "--storage", f"sqlite:///{path}"))
    assert words.format(path=path) in err
    assert "damaged" not in err and "backup" not in err
    assert [p.name for p in tmp_path.iterdir()] == ["s.db"]


# Items 8-10: numbers, names and engine options, refused before any study is stored ----------
RUN = ["run", *SMALL, "--trials", "2", "--no-report"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--trials", "99999999999999999999"), "'--trials': Input should be less than or equal"),
        (("--rate-scale", "1e-300"), "--rate-scale 1e-300: the last arrival would come at"),
        (("--rate-scale", "inf"), "--rate-scale: inf is not a finite number"),
        (("--rate-scale", "1e309"), "--rate-scale: inf is not a finite number"),
        (("--rate-scale", "nan"), "--rate-scale: nan is not a number"),
        (("--objective", "capacity", "--capacity-tolerance", "inf"), "inf is not a finite"),
        (
            ("--objective", "capacity", "--capacity-tolerance", "nan"),
            "tolerance: nan is not a number",
        ),
        (("--error-budget", "nan"), "--error-budget: nan is not a number"),
        (("--error-budget", "1e309"), "--error-budget: inf is not a finite number"),
        (("--timeout", "1e309"), "--timeout: inf is not a finite number"),
        (("--model", ""), "--model: the model name is empty"),
        (("--model", "-x"), "--model '-x': a model name cannot start with '-'"),
        (
            ("--space", "max_num_batched_tokens=256..100000000000000000000"),
            "HIGH must be at most 2,147,483,647",
        ),
        (
            ("--set", "max_num_batched_tokens=100000000000000000000"),
            "--set max_num_batched_tokens=100000000000000000000: at most 2,147,483,647",
        ),
        (("--log-dir", "logs"), "--log-dir: only for --engine vllm"),
        (("--hang-timeout", "5"), "--hang-timeout: only for --engine vllm"),
    ],
)
def test_run_refuses_what_no_trial_could_use(
    tune, tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    storage = tmp_path / "s.db"
    err = one_line_error(*tune(*RUN, "--storage", f"sqlite:///{storage}", *args))
    assert words in err
    assert list(tmp_path.iterdir()) == [], "no study stored, no log folder made"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--min-gain", "inf"), "--min-gain: inf is not a finite number"),
        (("--trials", "99999999999999999999"), "'--trials': Input should be less than or equal"),
        (("--log-dir", "logs"), "--log-dir: only for --engine vllm"),
    ],
)
def test_nightly_refuses_what_no_trial_could_use(
    tune, tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    from tests.test_bad_input import NIGHTLY

    storage = tmp_path / "s.db"
    report_dir = tmp_path / "reports"
    err = one_line_error(
        *tune(*NIGHTLY, "--storage", f"sqlite:///{storage}", "--report-dir", str(report_dir), *args)
    )
    assert words in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--max-num-batched-tokens", "100000000000000000000"), "less than or equal to 2147483647"),
        (("--watermark", "nan"), "--watermark: nan is not a number"),
        (("--kv-cache-memory-bytes", "1"), "--kv-cache-memory-bytes 1: the KV blocks it makes"),
    ],
)
@pytest.mark.parametrize("command", ["simulate", "diagnose"])
def test_simulator_flags_are_bounded_and_blamed_on_the_flag_given(
    tune, command: str, args: tuple[str, ...], words: str
) -> None:
    err = one_line_error(*tune(command, "--trace", str(AZURE), "--max-requests", "3", *args))
    assert words in err
    assert "--num-gpu-blocks" not in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--rate", "1e309"), "--rate: inf is not a finite number"),
        (("--rate", "nan"), "--rate: nan is not a number"),
        (("--arrivals", "gamma", "--cv", "nan"), "--cv: nan is not a number"),
    ],
)
def test_synth_says_what_a_non_finite_number_is(
    tune, tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    err = one_line_error(*tune("trace", "synth", str(tmp_path / "x.jsonl"), *args))
    assert words in err


# Item 8: the nightly report's folder is checked before the night's trials --------------------
@pytest.mark.parametrize("make", ["file", "below-a-file", "device", "serve-link"])
def test_nightly_refuses_a_report_folder_it_cannot_write_before_any_trial(
    tune, tmp_path: Path, make: str
) -> None:
    from tests.test_bad_input import NIGHTLY

    storage = tmp_path / "s.db"
    a_file = tmp_path / "a-file"
    a_file.write_text("keep\n")
    report_dir = {"file": a_file, "below-a-file": a_file / "sub", "device": Path("/dev/zero")}.get(
        make, tmp_path / "reports"
    )
    if make == "serve-link":
        (report_dir / "n").mkdir(parents=True)
        (report_dir / "n" / "serve.sh").symlink_to(a_file)
    args = ("--storage", f"sqlite:///{storage}", "--report-dir", str(report_dir), "--trials", "2")
    err = one_line_error(*tune(*NIGHTLY, *args))
    words = "is a symbolic link" if make == "serve-link" else "is not a folder"
    assert words in err
    assert not storage.exists(), "no trial ran, no study was stored"
    assert a_file.read_text() == "keep\n"


# Items 8 and 10: a study recorded for workers, before any trial finished ----------------------
@pytest.fixture
def create_only(tune, tmp_path: Path) -> str:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    args = ("--trials", "2", "--study", "s", "--storage", storage, "--create-only")
    code, _, err = tune("run", *SMALL, *args)
    assert code == 0, err
    return storage


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["report", "-o", "{dir}/r.html"], "study s has no finished trial yet; nothing to report"),
        (["pareto"], "study s has no finished trial yet; nothing to report"),
        (["pareto", "--json"], "study s has no finished trial yet; nothing to report"),
        (["export"], "study s has no finished trial yet; nothing to report"),
        (["diagnose", "--study", "s"], "study s has no finished trial yet; nothing to diagnose"),
    ],
    ids=["report", "pareto", "pareto-json", "export", "diagnose"],
)
def test_a_study_no_trial_finished_says_so(
    tune, tmp_path: Path, create_only: str, command: list[str], words: str
) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [arg.format(dir=tmp_path) for arg in command]
    err = one_line_error(*tune(*args, "--storage", create_only))
    assert words in err
    assert "met the SLOs" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no report written"


# A YAML input is bounded: no alias expands it, no file is larger than any input could be --
BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else '1, 2'}]\n"
    for prev, name in zip(["", *"abcdef"], "abcdefg", strict=True)
)
"""Seven lines that expand to 2 * 9**6 values (one more line: 39 s and 5.9 GB before)."""


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (BOMB, "line 2: an alias (*a) is not read here"),
        (
            "max_num_seqs: &x 8..64\nmax_num_batched_tokens: *x\n",
            "line 2: an alias (*x) is not read",
        ),
        ("x: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
        ("# " + "x" * 1_000_000 + "\nmax_num_seqs: 8..64\n", "larger than 1,000,000 bytes"),
    ],
    ids=["bomb", "alias", "deep", "large"],
)
def test_a_space_file_is_read_bounded(tune, tmp_path: Path, text: str, words: str) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(text)
    storage = tmp_path / "s.db"
    err = one_line_error(
        *tune(*RUN, "--storage", f"sqlite:///{storage}", "--space-file", str(space_file))
    )
    assert f"{space_file}: cannot read the space file: {words}" in err
    assert not storage.exists()


def test_a_profile_is_read_bounded(tune, tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(BOMB)
    trace = ["--trace", str(AZURE), "--max-requests", "20"]
    err = one_line_error(*tune("simulate", *trace, "--profile", str(profile)))
    assert f"{profile}: cannot read the profile: line 2: an alias (*a) is not read here" in err


def test_the_bounded_reader_reads_what_safe_load_reads(tmp_path: Path) -> None:
    import yaml

    from prefill_tuner.yaml_input import read_yaml

    text = "a: &anchored 1\nb: [true, 2.5, null]\nc: {d: '..'}\n"
    path = tmp_path / "x.yaml"
    path.write_text(text)
    assert read_yaml(path) == yaml.safe_load(text)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--slo", "p99_ttft=1e309ms"), "--slo 'p99_ttft=1e309ms': the limit is not a finite"),
        (("--dequantize", "1e309"), "--dequantize: 1e309 is not a finite number of seconds"),
    ],
)
def test_an_infinite_value_inside_an_option_is_not_called_negative(
    tune, tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    storage = tmp_path / "s.db"
    err = one_line_error(*tune(*RUN, "--storage", f"sqlite:///{storage}", *args))
    assert words in err
    assert "positive" not in err
    assert not storage.exists()
