"""Secrets never leave the process: the one place that hides them.

A secret is the value of a server flag whose name says so (``--api-key``, ``--hf-token``, any
flag whose last word is ``token`` or ``key``, or that names a secret, password or credential;
``--max-num-batched-tokens`` and ``--long-prefill-token-threshold`` are not secrets), the value
of a ``--server-env`` variable whose name says so (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
``DB_PASSWORD``...), and the password of a URL. The real engine :func:`remember`\\ s the values
it is given, so they are hidden wherever they turn up (an error message that echoes a flag, a
resolved config); :func:`redact` is applied to everything the engine hands back, to every
record the storage writes, to the server logs we write and to error messages we print. The
server itself gets the real values.

A hidden value is written ``<redacted>`` (``--api-key '<redacted>'`` in a shell line; a URL's
password as ``***``, as in storage URLs).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"
MIN_REMEMBERED = 4
"""Shorter values are not hidden by value (it would mangle unrelated text); by position they
still are (after their flag, under their name)."""

_SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwd", "pwd", "credential", "credentials", "apikey"}
)
_LAST_WORDS = frozenset({"token", "key"})
_ENV_WORDS = _SECRET_WORDS | _LAST_WORDS | {"auth", "pat"}
_URL_PASSWORD = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"]+:)([^\s@/'\"]+)(@)")
_FLAG_IN_TEXT = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)([= ])('[^']*'|\"[^\"]*\"|[^\s'\",}\]]+)")
_ENV_IN_TEXT = re.compile(r"\b([A-Z][A-Z0-9_]*)=('[^']*'|\"[^\"]*\"|[^\s'\",}\]]+)")

_known: set[str] = set()
_lock = threading.Lock()


def _words(name: str) -> list[str]:
    return [word for word in re.split(r"[-_.\s]+", name.lower().lstrip("-")) if word]


def is_secret_flag(name: str) -> bool:
    """``--api-key``, ``--hf-token``, ``api_key``, ``db_password``: a secret's name (a flag or
    a config field). ``--max-num-batched-tokens``, ``long_prefill_token_threshold``: not."""
    words = _words(name)
    return bool(words) and (
        words[-1] in _LAST_WORDS or any(word in _SECRET_WORDS for word in words)
    )


def is_secret_env(name: str) -> bool:
    """``HF_TOKEN``, ``OPENAI_API_KEY``, ``AWS_ACCESS_KEY_ID``, ``PGPASSWORD``: any word of
    the variable's name says it holds a secret."""
    words = _words(name)
    return any(word in _ENV_WORDS or "password" in word for word in words)


def secret_values(args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> list[str]:
    """The values of secret flags in ``args`` and of secret variables in ``env``."""
    values = [value for _, value in _secret_positions(args)]
    values += [value for name, value in (env or {}).items() if is_secret_env(name)]
    return [value for value in values if value]


def remember(values: Iterable[str]) -> None:
    """Hide these values wherever they appear, from now on, in this process."""
    with _lock:
        _known.update(value for value in values if len(value) >= MIN_REMEMBERED)


def redact_args(args: Sequence[str]) -> list[str]:
    """Argument list with secret flags' values hidden (``--api-key X`` and ``--api-key=X``)."""
    hidden = list(args)
    for index, _ in _secret_positions(args):
        flag, eq, _ = hidden[index].partition("=")
        hidden[index] = f"{flag}={REDACTED}" if eq and flag.startswith("--") else REDACTED
    return [redact_text(arg) for arg in hidden]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with secret variables' values hidden."""
    return {name: REDACTED if is_secret_env(name) else value for name, value in env.items()}


def redact_text(text: str) -> str:
    """Free text with every remembered value, URL password, secret flag's value and secret
    ``NAME=value`` hidden."""
    if not text:
        return text
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    text = _URL_PASSWORD.sub(r"\1***\3", text)
    text = _FLAG_IN_TEXT.sub(
        lambda m: (
            f"{m[1]}{m[2]}{REDACTED}"
            if is_secret_flag(m[1]) and not m[3].startswith("-") and m[3].strip("'\"") != REDACTED
            else m[0]
        ),
        text,
    )
    return _ENV_IN_TEXT.sub(lambda m: f"{m[1]}={REDACTED}" if is_secret_env(m[1]) else m[0], text)


def redact(value: Any) -> Any:
    """Any JSON-like value with its secrets hidden: strings as :func:`redact_text`, lists of
    strings as :func:`redact_args`, and the string values of dict keys named like secrets."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            key: _hidden(item) if _secret_key(str(key)) else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        if all(isinstance(item, str) for item in value):
            return redact_args(value)
        return [redact(item) for item in value]
    return value


def _hidden(item: Any) -> Any:
    """A secret's value, hidden (``None``, ``False`` and numbers say nothing)."""
    if isinstance(item, str) and item:
        return REDACTED
    if isinstance(item, list | tuple):
        return [REDACTED if isinstance(part, str) else redact(part) for part in item]
    return redact(item)


def _secret_key(key: str) -> bool:
    return is_secret_flag(key) or (key.isupper() and is_secret_env(key))


def _secret_positions(args: Sequence[str]) -> list[tuple[int, str]]:
    """(index, value) of every secret flag value: ``--flag=V`` at the flag's own index;
    ``--flag V1 [V2 ...]`` at each value's."""
    found = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not arg.startswith("--"):
            continue
        flag, eq, inline = arg.partition("=")
        if not is_secret_flag(flag):
            continue
        if eq:
            found.append((index - 1, inline))
            continue
        while index < len(args) and not args[index].startswith("--"):
            found.append((index, args[index]))
            index += 1
    return found
