"""Reading input files, and writing output files so that they appear whole or not at all: the
one reader and the one writer every command uses (traces, profiles, space files, step traces,
exports, reports)."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from prefill_tuner.errors import OutputError, TunerError

WRITE_FAILURES = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS, errno.EPIPE}
)
"""Errors of the system, not of the user's input: a full disk, a read-only file system..."""


def read_input(path: str | Path) -> bytes:
    """A regular file's bytes; :class:`OSError` (with a ``strerror`` to quote) for anything
    else: a device may never end (``/dev/zero``) and a pipe cannot be read twice."""
    file = Path(path)
    if file.exists() and not file.is_file() and not file.is_dir():  # read_bytes names a dir
        raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket)")
    return file.read_bytes()


def why_unreadable(exc: Exception) -> str:
    """What failed reading an input, in one line: the system's words for an :class:`OSError`
    (from :func:`read_input`), else the first line of a parser's message."""
    text = str(getattr(exc, "strerror", None) or exc)
    return (text.splitlines() or [""])[0]


def check_output(path: str | Path, inputs: Sequence[str | Path] = ()) -> Path:
    """The output path, if writing there replaces at most a regular file that is none of
    ``inputs`` (the command's trace, its database: given or about to be created) and no
    SQLite database; a one-line :class:`TunerError` otherwise. A symbolic link is refused
    (not followed, not replaced): name the file it points to."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not os.path.isdir(directory):
        raise TunerError(f"{target}: the output folder {str(directory)!r} does not exist")
    for source in inputs:
        if _same_file(source, target):
            raise TunerError(f"{target}: is the input file {source}; write to another file")
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise TunerError(f"{target}: cannot write here: {exc.strerror}") from None
    if stat.S_ISLNK(mode):
        raise TunerError(
            f"{target}: is a symbolic link; refusing to replace it (give the path it points to)"
        )
    if stat.S_ISDIR(mode):
        raise TunerError(f"{target}: is a folder; give a file name")
    if not stat.S_ISREG(mode):
        raise TunerError(
            f"{target}: is not a regular file (a FIFO, device or socket); refusing to replace it"
        )
    if _is_database(target):
        raise TunerError(
            f"{target}: is a SQLite database (a study's storage?); refusing to replace it: "
            "write to another file"
        )
    return target


SQLITE_HEADER = b"SQLite format 3\x00"


def _same_file(source: str | Path, target: Path) -> bool:
    """Whether ``target`` is ``source``: the same file, or, while either does not exist yet
    (a database a command is about to create), the same path once links are resolved."""
    try:
        return os.path.samefile(source, target)
    except OSError:
        return os.path.realpath(source) == os.path.realpath(target)


def _is_database(target: Path) -> bool:
    """Whether the existing file is a SQLite database: no output of ours ever is one, and
    replacing one would lose every study in it."""
    try:
        with open(target, "rb") as stream:
            return stream.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


@contextmanager
def atomic_text(
    path: str | Path, inputs: Sequence[str | Path] = (), *, executable: bool = False
) -> Iterator[IO[str]]:
    """A text stream whose content replaces ``path`` only when the block ends without error
    (written to a temporary file beside it, then renamed). The file gets the mode an
    existing target had, else the umask's (as ``open`` would give; a script, ``executable``, as
    ``chmod +x`` would). See :func:`check_output`
    for what is refused; a full disk is an :class:`OutputError` and leaves nothing behind."""
    target = check_output(path, inputs)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = (0o777 if executable else 0o666) & ~_umask()
    try:
        handle, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as exc:
        raise TunerError(f"{target}: cannot write here: {exc.strerror}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
            yield stream
        os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except OSError as exc:
        Path(temp_name).unlink(missing_ok=True)
        if exc.errno in WRITE_FAILURES:
            raise OutputError(f"{target}: cannot write: {exc.strerror}; nothing written") from None
        raise
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
