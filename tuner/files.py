"""Reading input files, and writing output files so that they appear whole or not at all: the
one reader and the one writer every command uses (traces, profiles, space files, step traces,
exports, reports).

One rule keeps a command from destroying what it was given: every file it reads is an *input*
(:func:`read_input` records it; :func:`declare_inputs` records one read another way, such as a
study's database and the files SQLite keeps beside it), and no output may be one of them
(:func:`check_output`), compared by identity (the same inode through a symbolic or hard link)
or, for a file not made yet, by resolved path. A command's inputs are recorded from
:func:`command_inputs` on (the console entry opens one per command).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO

from prefill_tuner.errors import OutputError, TunerError

WRITE_FAILURES = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS, errno.EPIPE}
)
"""Errors of the system, not of the user's input: a full disk, a read-only file system..."""


MAX_INPUT_BYTES = 4 * 2**30
"""The largest input read at all (4 GiB: a month of a busy service's trace); each kind of input
has its own, smaller bound (:data:`prefill_tuner.yaml_input.MAX_YAML_BYTES`...)."""


def read_input(path: str | Path, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """A regular file's bytes, at most ``max_bytes`` of them, recorded as an input of the
    command (:func:`declare_inputs`); :class:`OSError` (with a ``strerror`` to quote) for
    anything else: a device may never end (``/dev/zero``), a pipe cannot be read twice, and a
    file over the bound is refused by its size, not read."""
    file = Path(path)
    # Opened without waiting (a FIFO would block until a writer came), then judged by what
    # was opened; a folder is IsADirectoryError, in the system's words.
    with open(os.open(file, os.O_RDONLY | os.O_NONBLOCK), "rb") as stream:
        info = os.fstat(stream.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(file))
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket)")
        if info.st_size > max_bytes:
            raise OSError(
                errno.EFBIG, f"{_size(info.st_size)}, over this input's {_size(max_bytes)}"
            )
        declare_inputs([file])
        data = stream.read(max_bytes + 1)  # a file that grows while read is still bounded
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"grew over this input's {_size(max_bytes)} while read")
    return data


def _size(count: int) -> str:
    """``1.5 GiB``, ``16 MiB``, ``300 bytes``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} bytes"


_Identity = tuple[str, tuple[int, int] | None]
"""An input: its resolved path, and its (device, inode) when it exists."""

_INPUTS: ContextVar[tuple[_Identity, ...] | None] = ContextVar("_INPUTS", default=None)


@contextmanager
def command_inputs() -> Iterator[None]:
    """A command's span: the inputs recorded in it (:func:`declare_inputs`) are forgotten at
    its end, so that one process may run several commands (the test suite does)."""
    token = _INPUTS.set(())
    try:
        yield
    finally:
        _INPUTS.reset(token)


def declare_inputs(paths: Iterable[str | Path]) -> None:
    """Record files the command reads (or will create and then read, as a new database), so
    that no output of the command may replace them (:func:`check_output`). Outside
    :func:`command_inputs` nothing is recorded."""
    known = _INPUTS.get()
    if known is None:
        return
    _INPUTS.set(known + tuple(_identity(path) for path in paths))


def _identity(path: str | Path) -> _Identity:
    resolved = os.path.realpath(path)
    try:
        info = os.stat(resolved)
    except OSError:
        return resolved, None
    return resolved, (info.st_dev, info.st_ino)


def why_unreadable(exc: Exception) -> str:
    """What failed reading an input, in one line: the system's words for an :class:`OSError`
    (from :func:`read_input`), else the first line of a parser's message."""
    text = str(getattr(exc, "strerror", None) or exc)
    return (text.splitlines() or [""])[0]


def check_output(path: str | Path, inputs: Sequence[str | Path] = ()) -> Path:
    """The output path, if writing there replaces at most a regular file that is none of
    ``inputs`` nor of the inputs the command recorded (:func:`declare_inputs`: its trace,
    profile, space file, model config, database and the files beside it...) and no SQLite
    database, in a folder this process may write; a one-line :class:`TunerError` otherwise.
    A symbolic link is refused (not followed, not replaced): name the file it points to."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not os.path.isdir(directory):
        raise TunerError(f"{target}: the output folder {str(directory)!r} does not exist")
    given = [(str(source), _identity(source)) for source in inputs]
    recorded = [(path, (path, inode)) for path, inode in _INPUTS.get() or ()]
    mine = _identity(target)
    for shown, source in given + recorded:
        if _same(source, mine):
            raise TunerError(f"{target}: is the input file {shown}; write to another file")
    _check_writable(target, directory)
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


def _check_writable(target: Path, directory: Path) -> None:
    """Whether a file can be made in ``directory``, tried (a probe made and removed): the
    permission bits do not say it for root, nor for a read-only file system."""
    try:
        handle, probe = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as exc:
        raise TunerError(
            f"{target}: cannot write in the folder {str(directory)!r}: {exc.strerror}"
        ) from None
    os.close(handle)
    os.unlink(probe)


def _same(source: _Identity, target: _Identity) -> bool:
    """Whether ``target`` is ``source``: the same file (inode), or, while either does not
    exist (a database a command is about to create), the same path once links are resolved."""
    return source[0] == target[0] or (source[1] is not None and source[1] == target[1])


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
    with (
        _replacing(path, inputs, executable) as handle,
        os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream,
    ):
        yield stream


def atomic_bytes(path: str | Path, data: bytes, inputs: Sequence[str | Path] = ()) -> None:
    """Write ``data`` (a picture) to ``path`` as :func:`atomic_text` writes text: whole or not
    at all, refused where :func:`check_output` refuses."""
    with _replacing(path, inputs, executable=False) as handle, os.fdopen(handle, "wb") as stream:
        stream.write(data)


@contextmanager
def _replacing(path: str | Path, inputs: Sequence[str | Path], executable: bool) -> Iterator[int]:
    """A temporary file's descriptor beside ``path``, renamed over it when the block ends
    without error (see :func:`atomic_text`)."""
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
        yield handle
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
