"""``NAME=VALUE`` options (``--set``, ``--space``, ``--server-env``) read into the values the
library takes."""

from __future__ import annotations

from typing import Any

from prefill_tuner.errors import TunerError


def parse_assignments(items: list[str], option: str) -> dict[str, str]:
    """``["a=1", "b=2..3"]`` → ``{"a": "1", "b": "2..3"}``, with one-line errors."""
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name or not value.strip():
            raise TunerError(f"{option} {item!r}: expected NAME=VALUE")
        if name in result:
            raise TunerError(f"{option}: {name} given twice")
        result[name] = value.strip()
    return result


def parse_value(text: str) -> Any:
    """A ``--set`` value: a boolean, an integer, a number, or the text itself."""
    lowered = text.strip().lower()
    if lowered in ("true", "false", "on", "off", "yes", "no"):
        return lowered in ("true", "on", "yes")
    for kind in (int, float):
        try:
            return kind(lowered)
        except ValueError:
            continue
    return text.strip()
