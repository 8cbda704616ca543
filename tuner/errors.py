"""User-facing errors: bad input that the CLI reports in one line with exit code 2 (a failed
write: exit code 1).

Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


class TunerError(Exception):
    """An error in what the user gave us (a file, a flag, a value), not in our code."""

    exit_code = 2
    """The command's exit code (2: bad input, as for usage errors)."""


class OutputError(TunerError):
    """The system failed a write (a full disk, a closed pipe): one line, exit code 1."""

    exit_code = 1


class TraceError(TunerError):
    """A trace that cannot be read or shaped, located as precisely as we can.

    Rendered like a compiler diagnostic, ``FILE:LINE: field 'NAME': what is wrong``, so an
    operator can jump straight to the offending row.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path if self.line is None else f"{self.path}:{self.line}"
            where += ": "
        elif self.line is not None:
            where = f"line {self.line}: "
        what = f"field '{self.field}': " if self.field else ""
        return f"{where}{what}{self.message}"
