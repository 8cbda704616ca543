"""The request record every engine replays, and the trace that carries them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a trace, in the units every engine uses.

    Frozen and slotted: the simulator walks hundreds of thousands of these per second.
    """

    id: str
    """Identifier from the trace (the native format's ``id``), else the 0-based data-row index."""
    arrival_s: float
    """Arrival time in seconds from the start of the trace."""
    prompt_tokens: int
    """Prompt length in tokens (at least 1)."""
    output_tokens: int
    """Tokens the request generates (``max_tokens`` with ``ignore_eos``; at least 1)."""
    prefix_blocks: tuple[int, ...] = ()
    """Ids of the prompt's prefix blocks: equal leading ids mean a shareable prefix (KV reuse)."""
    prefix_block_size: int | None = None
    """Tokens per prefix block (512 for Mooncake); ``None`` when there are no prefix blocks."""
    traffic_class: str | None = None
    """The request's traffic class (the native ``class`` field, or ``--classes`` bands), which
    SLOs may name (``p99_ttft[interactive]``); ``None``: judged only by class-less SLOs."""


@dataclass(frozen=True, slots=True)
class Adjustment:
    """A counted change made while reading or shaping: nothing is ever dropped silently."""

    action: str
    """What happened to the requests: ``dropped``, ``clipped``, ``reordered``, ``jittered`` or
    ``unclassed`` (in no band of ``--classes``)."""
    reason: str
    """Why, in words an operator understands."""
    count: int
    """How many requests it affected."""

    def __str__(self) -> str:
        noun = "request" if self.count == 1 else "requests"
        return f"{self.action} {self.count:,} {noun}: {self.reason}"


@dataclass(frozen=True, slots=True)
class TraceSource:
    """Where a trace came from: with the shaping options, this is a trace's identity."""

    path: str
    format: str
    sha256: str
    """Hash of the file's bytes, so a stored trial names exactly the trace it replayed."""


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival, plus their origin and every adjustment made to them."""

    requests: tuple[Request, ...]
    source: TraceSource | None = None
    adjustments: tuple[Adjustment, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.requests)

    def with_requests(self, requests: tuple[Request, ...], *notes: Adjustment) -> Trace:
        """A copy with new requests, keeping the source and appending non-empty adjustments."""
        kept = tuple(note for note in notes if note.count > 0)
        return replace(self, requests=requests, adjustments=self.adjustments + kept)
