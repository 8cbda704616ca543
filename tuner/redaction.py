"""Secrets never leave the process: the one place that hides them.

A secret is the value of a server flag whose name says so (``--api-key``, ``--hf-token``, any
flag whose last word is ``token`` or ``key``, or that names a secret, password or credential;
``--max-num-batched-tokens`` and ``--long-prefill-token-threshold`` are not secrets), the value
of a ``--server-env`` variable whose name says so (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``,
``DB_PASSWORD``...), and, inside any value or text, the password of a URL
(``http://user:PASSWORD@host``), a JSON or Python field named like a secret
(``{"password": "..."}``, ``api_key='...'``, at any depth of a JSON argument such as
``--kv-transfer-config``) and a ``key=value`` pair named so (``user=bob,password=...``,
``?access_token=...``). The real engine :func:`remember`\\ s the values it is given, so they
are hidden wherever they turn up (an error message that echoes a flag, a resolved config, a
server's log line); :func:`redact` is applied to everything the engine hands back, to every
record the storage writes, to the server's log as it is written (``engines/real/launcher.py``)
and to error messages we print. The server itself gets the real values.

A hidden value is written ``<redacted>`` (``--api-key '<redacted>'`` in a shell line,
``"password": "<redacted>"`` in JSON; a URL's password as ``***``, as in storage URLs).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

REDACTED = "<redacted>"
MIN_REMEMBERED = 4
"""Shorter values are not hidden by value (it would mangle unrelated text); by position they
still are (after their flag, under their name)."""

_SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwd", "pwd", "credential", "credentials", "apikey"}
)
_LAST_WORDS = frozenset({"token", "key"})
_ENV_WORDS = _SECRET_WORDS | _LAST_WORDS | {"auth", "pat"}
_SAYS_NOTHING = frozenset({"", "none", "null", "true", "false", REDACTED.lower()})
"""Values that are no secret: an unset field, a flag's boolean, one already hidden."""
_QUOTED = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'"
_BARE = r"[^\s'\",;&}\])]+"
_URL_PASSWORD = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"]*:)([^\s@/'\"]+)(@)")
_FLAG_IN_TEXT = re.compile(
    r"(--[A-Za-z0-9][A-Za-z0-9_-]*)([= ])(\[[^\]]*\]|'[^']*'|\"[^\"]*\"|[^\s'\",}\]]+)"
)
_FIELD_IN_TEXT = re.compile(
    rf"(?P<quote>[\"'])(?P<name>[A-Za-z_][\w.-]*)(?P=quote)(?P<sep>\s*[:=]\s*)"
    rf"(?P<value>{_QUOTED}|\[\s*(?:(?:{_QUOTED})\s*,?\s*)*\]|-?[\w.+-]+)"
)
"""``"name": value`` (JSON) and ``'name': value`` (a Python dict's repr)."""
_PAIR_IN_TEXT = re.compile(
    rf"(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)=(?P<value>{_QUOTED}|\[[^\]]*\]|{_BARE})"
)
"""``name=value``: an environment's, a query string's, a ``key=value`` list's, a repr's."""
_STRING_IN_LIST = re.compile(_QUOTED)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

_known: set[str] = set()
_lock = threading.Lock()


def _words(name: str) -> list[str]:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)  # apiKey, dbPassword
    return [word for word in re.split(r"[-_.\s]+", name.lower().lstrip("-")) if word]


def is_secret_flag(name: str) -> bool:
    """``--api-key``, ``--hf-token``, ``api_key``, ``db_password``, ``apiKey``: a secret's
    name (a flag or a config field). ``--max-num-batched-tokens``,
    ``long_prefill_token_threshold``: not."""
    words = _words(name)
    return bool(words) and (
        words[-1] in _LAST_WORDS
        or any(word in _SECRET_WORDS or "password" in word for word in words)
    )


def is_secret_env(name: str) -> bool:
    """``HF_TOKEN``, ``OPENAI_API_KEY``, ``AWS_ACCESS_KEY_ID``, ``PGPASSWORD``: any word of
    the variable's name says it holds a secret."""
    words = _words(name)
    return any(word in _ENV_WORDS or "password" in word for word in words)


def secret_values(args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> list[str]:
    """The values of secret flags in ``args`` and of secret variables in ``env``, and the
    secrets inside any of their values (a URL's password, a JSON field, a ``key=value``)."""
    values = [value for _, value in _secret_positions(args)]
    values += [value for name, value in (env or {}).items() if is_secret_env(name)]
    for text in [*args, *(env or {}).values()]:
        _hide_in_value(text, values.append)
    return list(dict.fromkeys(value for value in values if value))


def remember(values: Iterable[str]) -> None:
    """Hide these values wherever they appear, from now on, in this process."""
    with _lock:
        _known.update(value for value in values if len(value) >= MIN_REMEMBERED)


def redact_args(args: Sequence[str]) -> list[str]:
    """Argument list with secret flags' values hidden (``--api-key X`` and ``--api-key=X``),
    and the secrets inside every value (a URL's password, a JSON argument's secret fields)."""
    hidden = list(args)
    for index, _ in _secret_positions(args):
        flag, eq, _ = hidden[index].partition("=")
        hidden[index] = f"{flag}={REDACTED}" if eq and flag.startswith("--") else REDACTED
    return [redact_text(_hide_in_value(arg)) for arg in hidden]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with secret variables' values hidden, and the secrets inside the
    others (a proxy URL's password)."""
    return {
        name: REDACTED if is_secret_env(name) else redact_text(_hide_in_value(value))
        for name, value in env.items()
    }


def redact_text(text: str) -> str:
    """Free text with every remembered value, URL password, secret flag's value and secret
    field or ``name=value`` hidden."""
    if not text:
        return text
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    return _hide_in_text(text, None)


def redact(value: Any) -> Any:
    """Any JSON-like value with its secrets hidden: strings as :func:`redact_text`, lists of
    strings as :func:`redact_args`, and the values of dict keys named like secrets."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            key: _hidden(item, str(key)) if _secret_key(str(key)) else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        if all(isinstance(item, str) for item in value):
            return redact_args(value)
        return [redact(item) for item in value]
    return value


def _hidden(item: Any, key: str = "") -> Any:
    """A secret's value, hidden (``None`` and ``False`` say nothing, and so does a number
    but under a name that can only be a secret's: ``password``, not ``kv_bytes_per_token``)."""
    if isinstance(item, str) and item:
        return REDACTED
    if _number(item) and _only_a_secret(key):
        return REDACTED
    if isinstance(item, list | tuple):
        return [REDACTED if isinstance(part, str) else redact(part) for part in item]
    return redact(item)


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    """A field's name says it holds a secret (the same names recur in every record)."""
    return is_secret_flag(key) or (key.isupper() and is_secret_env(key))


def _only_a_secret(key: str) -> bool:
    """A name no other value goes by (``password``, ``api_secret``, an environment variable's
    ``HF_TOKEN``; ``*_token``, ``*_key`` also name counts and sizes)."""
    return key.isupper() or any(word in _SECRET_WORDS or "password" in word for word in _words(key))


def _number(item: Any) -> bool:
    if isinstance(item, str):
        return bool(_NUMBER.fullmatch(item))
    return isinstance(item, int | float) and not isinstance(item, bool)


def _hide_in_value(value: str, found: Callable[[str], None] | None = None) -> str:
    """One argument (or ``--flag=VALUE``) with the secrets inside it hidden; each hidden value
    is handed to ``found``. A value that is a JSON object or list is parsed, its secret
    fields hidden at any depth and written back (unchanged when it holds none); any other
    text as :func:`_hide_in_text`."""
    flag, eq, inline = value.partition("=")
    head, body = (f"{flag}=", inline) if eq and flag.startswith("--") else ("", value)
    if body.lstrip().startswith(("{", "[")):
        try:
            parsed = json.loads(body)
        except ValueError:
            pass
        else:
            hidden = redact(parsed)
            if hidden != parsed:
                if found is not None:
                    _secrets_in(parsed, hidden, found)
                return head + json.dumps(hidden, ensure_ascii=False)
    return _hide_in_text(value, found)


def _secrets_in(given: Any, hidden: Any, found: Callable[[str], None]) -> None:
    """Hand ``found`` each value of ``given`` that ``hidden`` (its redaction) hides."""
    if isinstance(given, str | int | float) and not isinstance(given, bool):
        if given != hidden:
            if isinstance(given, str) and isinstance(hidden, str):
                _hide_in_text(given, found)
            if hidden == REDACTED:
                found(str(given))
    elif isinstance(given, Mapping) and isinstance(hidden, Mapping):
        for key, item in given.items():
            _secrets_in(item, hidden.get(key), found)
    elif isinstance(given, list | tuple) and isinstance(hidden, list | tuple):
        for item, hidden_item in zip(given, hidden, strict=False):
            _secrets_in(item, hidden_item, found)


def _hide_in_text(text: str, found: Callable[[str], None] | None) -> str:
    """``text`` with URL passwords, secret flags' values, secret JSON or Python fields and
    secret ``name=value`` pairs hidden; each hidden value is handed to ``found``."""

    def keep(secret: str) -> None:
        if found is not None and secret.lower() not in _SAYS_NOTHING:
            found(secret)
            if "%" in secret:
                found(unquote(secret))  # as a client that decodes the URL may log it

    def url(match: re.Match[str]) -> str:
        if match[2] != "***":
            keep(match[2])
        return f"{match[1]}***{match[3]}"

    def flag(match: re.Match[str]) -> str:
        value = match[3].strip("'\"")
        if not is_secret_flag(match[1]) or match[3].startswith("-") or value == REDACTED:
            return match[0]
        if value.startswith("["):
            return f"{match[1]}{match[2]}{_hidden_value(value, keep, match[1])}"
        keep(value)
        return f"{match[1]}{match[2]}{REDACTED}"

    def field(match: re.Match[str]) -> str:
        if not _secret_key(match["name"]):
            return match[0]
        value = _hidden_value(match["value"], keep, match["name"], match["quote"])
        return f"{match['quote']}{match['name']}{match['quote']}{match['sep']}{value}"

    def pair(match: re.Match[str]) -> str:
        if not _secret_key(match["name"]):
            return match[0]
        return f"{match['name']}={_hidden_value(match['value'], keep, match['name'])}"

    text = _URL_PASSWORD.sub(url, text)
    text = _FLAG_IN_TEXT.sub(flag, text)
    text = _FIELD_IN_TEXT.sub(field, text)
    return _PAIR_IN_TEXT.sub(pair, text)


def _hidden_value(value: str, keep: Callable[[str], None], name: str, quote_bare: str = "") -> str:
    """The value of a field or pair named ``name`` as text (quoted, a list, or bare), hidden
    in the same form (a bare one quoted with ``quote_bare``: JSON stays JSON). Values that say
    nothing (``None``, ``true``) are left, and so are bare numbers, as :func:`_hidden`."""
    if value.startswith("["):
        if _STRING_IN_LIST.search(value):
            return _STRING_IN_LIST.sub(lambda m: _hidden_value(m[0], keep, name), value)
        inner = value[1:-1].strip()
        return value if not inner else f"[{_hidden_value(inner, keep, name)}]"
    quote = value[0] if value[:1] in ("'", '"') else ""
    inner = value[1:-1] if quote else value
    if inner.lower() in _SAYS_NOTHING or (
        not quote and _number(inner) and not _only_a_secret(name)
    ):
        return value
    keep(inner.replace(f"\\{quote}", quote) if quote else inner)
    quote = quote or quote_bare
    return f"{quote}{REDACTED}{quote}"


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
