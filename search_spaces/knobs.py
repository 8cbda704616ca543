"""The scheduler knobs the tuner searches, as vLLM names them, with sensible default ranges.

Every knob is a ``vllm serve`` flag. Numeric knobs are searched on a log scale (their effect
is multiplicative). Which knobs a given engine honours is decided in
:func:`prefill_tuner.search_spaces.space.knob_availability`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Knob:
    """One searchable engine setting."""

    name: str
    """vLLM's config field name (``max_num_batched_tokens``)."""
    kind: Literal["int", "bool", "threshold"]
    """``int``: log-scale integer; ``bool``: on/off; ``threshold``: 0 (off) or a log-scale
    integer (searched as one ordered parameter whose lowest value means off)."""
    low: int = 0
    high: int = 0
    description: str = ""
    v0_only: bool = False
    """Honoured only by vLLM's V0 engine."""
    searched_by_default: bool = True
    """False: searched only when ``--space`` names it (its engine default stands otherwise)."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


KNOBS: dict[str, Knob] = {
    knob.name: knob
    for knob in (
        Knob(
            "max_num_batched_tokens",
            "int",
            256,
            16384,
            "Token budget per step: small smooths decode latency, large speeds prefill.",
        ),
        Knob("max_num_seqs", "int", 8, 1024, "Most requests running at once."),
        Knob(
            "enable_chunked_prefill",
            "bool",
            description="Split long prompts over steps under the token budget.",
        ),
        Knob(
            "long_prefill_token_threshold",
            "threshold",
            64,
            8192,
            "Per-request, per-step prefill cap (0 = off): stops one prompt taking the step.",
        ),
        Knob(
            "scheduler_reserve_full_isl",
            "bool",
            description="Admit only when the whole prompt fits in free KV blocks.",
        ),
        Knob(
            "async_scheduling",
            "bool",
            description="Schedule the next step while one runs: hides host time from TPOT, "
            "admits arrivals a step later (TTFT). Measured, not searched unless asked "
            "(docs/simulator.md).",
            searched_by_default=False,
        ),
        Knob(
            "max_num_partial_prefills",
            "int",
            1,
            8,
            "Prompts prefilled concurrently (V0 engine).",
            v0_only=True,
        ),
        Knob(
            "max_long_partial_prefills",
            "int",
            1,
            8,
            "Long prompts prefilled concurrently (V0 engine).",
            v0_only=True,
        ),
    )
}
