"""Names a user gives things that become parts of file names and of what is stored (a study,
a profile): one rule, and its one-line error."""

from __future__ import annotations

import re

from prefill_tuner.errors import TunerError

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""Letters, digits, ``.``, ``_`` and ``-``, 1-100 of them, not starting with a dot or dash (no
``..``, no ``/``): safe in file and folder names (logs, nightly reports)."""


def check_name(name: str, kind: str, option: str) -> str:
    """``name``, if it is a safe name (:data:`SAFE_NAME`); a one-line :class:`TunerError`
    naming ``option`` and the ``kind`` of name otherwise."""
    if not SAFE_NAME.fullmatch(name):
        raise TunerError(
            f"{option} {name!r}: a {kind} name is 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name
