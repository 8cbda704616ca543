"""Writing output files so that they appear whole or not at all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from prefill_tuner.errors import TunerError


@contextmanager
def atomic_text(path: str | Path) -> Iterator[IO[str]]:
    """A text stream whose content replaces ``path`` only when the block ends without error
    (written to a temporary file beside it, then renamed)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise TunerError(f"{target}: the output folder {str(directory)!r} does not exist")
    handle, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
            yield stream
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
