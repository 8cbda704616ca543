"""Reading the YAML a user gives us (a space file, a simulator profile), bounded in size and in
what it may expand to.

A 342-byte file of nested aliases (``b: &b [*a, *a, ...]``, a "billion laughs") took 39 s and
5.9 GB before the space file reader refused it: none of our inputs needs an alias, so an alias
is refused where it stands; and no space file or profile comes near :data:`MAX_YAML_BYTES`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from prefill_tuner.files import read_input

MAX_YAML_BYTES = 1_000_000
"""The largest YAML (or JSON) input we read: a space file or a profile is a few kB."""


def read_text(path: str | Path) -> str:
    """A regular file's text, at most :data:`MAX_YAML_BYTES`; :class:`OSError` (with a
    ``strerror`` to quote) or :class:`UnicodeDecodeError` otherwise."""
    if os.path.isfile(path) and os.path.getsize(path) > MAX_YAML_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_YAML_BYTES:,} bytes (not a YAML input)")
    return read_input(path).decode("utf-8")


def load_yaml(text: str) -> Any:
    """The YAML document in ``text``, as ``yaml.safe_load`` reads it, without aliases; a
    :class:`yaml.YAMLError` for anything else (a document nested too deeply included)."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


def read_yaml(path: str | Path) -> Any:
    """The YAML document in the file at ``path`` (:func:`read_text`, :func:`load_yaml`)."""
    return load_yaml(read_text(path))


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses an alias (``*name``), the one way a small document
    becomes a large one, and a key given twice in one mapping (YAML forbids it; PyYAML would
    keep the last one without a word)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, Hashable) and key in seen:
                    raise ConstructorError(
                        None,
                        None,
                        f"line {key_node.start_mark.line + 1}: the key {key!r} is given twice",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            where = f"line {event.start_mark.line + 1}: " if event.start_mark else ""
            raise ComposerError(
                None,
                None,
                f"{where}an alias (*{event.anchor}) is not read here: write the value itself",
                event.start_mark,
            )
        return super().compose_node(parent, index)
