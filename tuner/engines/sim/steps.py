"""What the simulation loop and its fast path share: the clock (integer nanoseconds), a step
in flight, a step's record and its shape for the cost model."""

from __future__ import annotations

from dataclasses import dataclass

from prefill_tuner.engines.sim.cost_model import StepShape
from prefill_tuner.engines.sim.scheduler import StepPlan

NS = 1_000_000_000
"""Clock ticks per second."""


def ticks(seconds: float) -> int:
    """``seconds`` on the loop's clock."""
    return round(seconds * NS)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step, as the per-step trace (``--steps-out``, ``docs/simulator.md``) writes
    it. Records come in scheduling order, each once its output has been applied."""

    index: int
    start_s: float
    """When the step started computing."""
    duration_s: float
    """How long it computed (0 for a step that only preempted: it runs no model, and the next
    step starts at the same time)."""
    scheduled: dict[str, int]
    """Tokens scheduled per request id, in scheduling order (read only: the records of a
    fast-forwarded run's steps between two finishes share one)."""
    admitted_cached_tokens: dict[str, int]
    """Requests admitted (or resumed) this step → their tokens served by the prefix cache."""
    prefill_tokens: int
    decode_tokens: int
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    """Requests whose last token this step produced."""
    running_after: int
    """Requests running once the step's output was applied (its finished ones removed)."""
    waiting_after: int
    """Requests waiting at that moment."""
    kv_blocks_in_use: int
    """KV blocks allocated while the step computes (its finished requests still hold theirs)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.index,
            "start_s": round(self.start_s, 9),
            "duration_s": round(self.duration_s, 9),
            "scheduled": self.scheduled,
            "admitted_cached_tokens": self.admitted_cached_tokens,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "preempted": list(self.preempted),
            "finished": list(self.finished),
            "running_after": self.running_after,
            "waiting_after": self.waiting_after,
            "kv_blocks_in_use": self.kv_blocks_in_use,
        }


@dataclass(slots=True)
class InFlight:
    """A scheduled step whose output is not applied yet."""

    index: int
    plan: StepPlan
    shape: StepShape
    start: int
    end: int
    kv_blocks: int


def shape_with_chunks(
    decodes: int, requests: int, decode_context: int, chunks: list[tuple[int, int]]
) -> StepShape:
    """A step's shape from its decodes (how many, their contexts' sum) and its prefill chunks
    ``(tokens computed before, tokens)`` in scheduling order, as :func:`shape_of` makes it."""
    prefill = prefill_context = pairs = 0
    for before, tokens in chunks:
        prefill += tokens
        prefill_context += before + tokens
        pairs += tokens * before + tokens * (tokens + 1) // 2
    return StepShape(
        prefill_tokens=prefill,
        decode_tokens=decodes,
        requests=requests,
        decode_context_tokens=decode_context,
        prefill_context_tokens=prefill_context,
        prefill_attention_pairs=pairs,
        prefill_chunks=tuple(chunks),
    )


def shape(plan: StepPlan) -> StepShape:
    """The step's shape for the cost model: ``schedule()`` has told its decodes (one sampled
    token fed after the prompt) from its prefill chunks."""
    return shape_with_chunks(
        plan.decodes, len(plan.scheduled), plan.decode_context, plan.prefill_chunks
    )
