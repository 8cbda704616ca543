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
