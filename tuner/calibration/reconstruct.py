"""What each logged step of a real server computed, rebuilt from its counts and the trace.

vLLM's per-step line gives four counts (prefill requests and tokens, decode requests and
tokens) but not the context each step's attention read, and the step time depends on it. The
replayed trace says every request's prompt and output length in send order, so the counts can
be replayed through vLLM's own scheduling rules (running requests first, in admission order,
each taking ``min(remaining, long-prefill cap, budget left)``; then admissions in FCFS order,
starting at their prefix-cache hit) to know, step by step, which request ran which tokens at
which context. The log decides what the rules cannot know without the clock: how many
requests were admitted (those that had arrived).

A step is *aligned* when the rebuilt step has exactly the logged counts. Preemption, or a
request that arrived out of order, makes the two disagree; from the first step that does,
the rebuild no longer knows which request is which, so it stops there: every later step of
that replay is left out of the fit (a wrong context could otherwise match the counts by
chance). The share of steps rebuilt is reported with every calibration. The prefix cache is
assumed never to evict (calibration pools are large): an eviction the counts do not reveal
would give a step less cached context than the rebuild thinks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefill_tuner.engines.sim.cost_model import StepShape, shape_of
from prefill_tuner.engines.sim.request import PrefixInterner
from prefill_tuner.trace.model import Request


@dataclass(frozen=True, slots=True)
class Scheduling:
    """The server settings the rebuild needs (vLLM's names)."""

    max_num_batched_tokens: int
    max_model_len: int
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    block_size: int = 16
    enable_prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class RebuiltStep:
    """One logged step and what it computed (``shape`` is ``None`` when not aligned)."""

    index: int
    shape: StepShape | None
    busy_before: bool
    """Requests were running when the step was scheduled: it followed the previous step at
    once (its time since the previous line is its own cycle, not idle time)."""


class _Running:
    __slots__ = ("computed", "output", "produced", "prompt")

    def __init__(self, request: Request, computed: int) -> None:
        self.prompt = request.prompt_tokens
        self.output = request.output_tokens
        self.computed = computed
        self.produced = 0


class _PrefixCache:
    """Which KV blocks the server holds, keyed as the simulator keys them (the trace prefix
    block holding a block's last token, and the block's position), with no eviction:
    calibration pools are large, and an eviction shows up as a misaligned step."""

    def __init__(self, block_size: int, enabled: bool) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self.interner = PrefixInterner()
        self.held: set[tuple[int, int]] = set()
        self._chains: dict[int, list[int]] = {}

    def _keys(self, request: Request, blocks: int) -> list[tuple[int, int]]:
        """Keys of the request's first ``blocks`` KV blocks that trace prefix blocks
        describe (the rest of a prompt is the request's own)."""
        if not request.prefix_blocks or not request.prefix_block_size:
            return []
        size = request.prefix_block_size
        chain = self._chains.get(id(request))
        if chain is None:
            chain = self._chains[id(request)] = self.interner.chain(request.prefix_blocks, size)
        shared = min(request.prompt_tokens, len(chain) * size) // self.block_size
        return [
            (chain[((position + 1) * self.block_size - 1) // size], position)
            for position in range(min(blocks, shared))
        ]

    def hit(self, request: Request, also: set[tuple[int, int]]) -> int:
        """Prompt tokens served by the cache at admission (vLLM: whole blocks, never the
        whole prompt), counting the blocks in ``also`` (allocated earlier in this step)."""
        if not self.enabled:
            return 0
        hit = 0
        for key in self._keys(request, (request.prompt_tokens - 1) // self.block_size):
            if key not in self.held and key not in also:
                break
            hit += 1
        return hit * self.block_size

    def filled(self, request: Request, computed: int) -> list[tuple[int, int]]:
        """Keys of the blocks full once ``computed`` tokens are: vLLM registers them in the
        cache when it allocates the step's slots, so a request admitted later in the same
        step already hits them."""
        return self._keys(request, computed // self.block_size) if self.enabled else []


def rebuild_steps(
    steps: Sequence[dict[str, Any]], requests: Sequence[Request], scheduling: Scheduling
) -> list[RebuiltStep]:
    """Each logged step (``prefill_requests``, ``prefill_tokens``, ``decode_requests``,
    ``decode_tokens``) with its composition, for ``requests`` in the order they were sent."""
    pending = [r for r in requests if r.prompt_tokens + r.output_tokens <= scheduling.max_model_len]
    cache = _PrefixCache(scheduling.block_size, scheduling.enable_prefix_caching)
    running: list[tuple[Request, _Running]] = []
    next_new = 0
    lost = False
    rebuilt: list[RebuiltStep] = []
    for index, logged in enumerate(steps):
        if lost:
            rebuilt.append(RebuiltStep(index=index, shape=None, busy_before=False))
            continue
        busy = bool(running)
        want_prefill = int(logged["prefill_requests"])
        # Every cap the step may have had that gives the logged counts; two that split the
        # tokens differently leave the step ambiguous, and the rebuild stops there too.
        matches = {}
        for cap, most in _caps(scheduling, len(running), len(pending) - next_new):
            plan, admitted = _schedule(
                running, pending, next_new, want_prefill, cap, scheduling, cache
            )
            if len(running) + admitted <= most and _counts(plan) == _logged_counts(logged):
                matches[tuple(tokens for _, _, tokens in plan)] = (plan, admitted)
        if len(matches) != 1:
            lost = True
            rebuilt.append(RebuiltStep(index=index, shape=None, busy_before=busy))
            continue
        ((plan, admitted),) = matches.values()
        shape = _shape(plan)
        for request, state, _ in plan[len(plan) - admitted :]:
            running.append((request, state))
        next_new += admitted
        for request, state, tokens in plan:
            prefilling = state.computed < state.prompt
            state.computed += tokens
            if prefilling:
                cache.held.update(cache.filled(request, state.computed))
                if state.computed >= state.prompt:
                    state.produced += 1
            else:
                state.produced += 1
        running = [(r, s) for r, s in running if s.produced < s.output]
        rebuilt.append(RebuiltStep(index=index, shape=shape, busy_before=busy))
    return rebuilt


def _caps(scheduling: Scheduling, running: int, unsent: int) -> list[tuple[int, int]]:
    """The long-prefill caps the step may have had, each with the most requests that can be
    in the system for it. The cap applies only with more than one request in the system
    and, adaptive, grows to ``budget // (running + waiting)``; the log does not say how many
    waited, so each possibility is tried."""
    threshold = scheduling.long_prefill_token_threshold
    many = running + unsent + 1
    if threshold <= 0:
        return [(0, many)]
    if not scheduling.long_prefill_token_threshold_adaptive:
        return [(threshold, many), (0, 1)]
    budget = scheduling.max_num_batched_tokens
    return [
        (max(threshold, budget // eligible), eligible)
        for eligible in range(max(running, 2), many + 1)
    ] + [(0, 1)]


def _logged_counts(logged: dict[str, Any]) -> tuple[int, int, int, int]:
    return (
        int(logged["prefill_requests"]),
        int(logged["prefill_tokens"]),
        int(logged["decode_requests"]),
        int(logged["decode_tokens"]),
    )


def _counts(plan: list[tuple[Request, _Running, int]]) -> tuple[int, int, int, int]:
    prefill_requests = prefill_tokens = decode_requests = decode_tokens = 0
    for _, state, tokens in plan:
        if state.produced == 0:  # vLLM: a request with no output yet is a context request
            prefill_requests += 1
            prefill_tokens += tokens
        else:
            decode_requests += 1
            decode_tokens += tokens
    return prefill_requests, prefill_tokens, decode_requests, decode_tokens


def _schedule(
    running: list[tuple[Request, _Running]],
    pending: list[Request],
    next_new: int,
    want_prefill: int,
    cap: int,
    scheduling: Scheduling,
    cache: _PrefixCache,
) -> tuple[list[tuple[Request, _Running, int]], int]:
    """vLLM's running pass, then as many admissions as the log's prefill count asks for."""
    budget = scheduling.max_num_batched_tokens
    plan: list[tuple[Request, _Running, int]] = []
    filled: set[tuple[int, int]] = set()
    prefilling = 0
    for request, state in running:
        if budget <= 0:
            break
        need = state.prompt - state.computed if state.computed < state.prompt else 1
        tokens = min(need, cap if 0 < cap < need else need, budget)
        tokens = min(tokens, scheduling.max_model_len - state.computed - 1)
        if tokens <= 0:
            continue
        plan.append((request, state, tokens))
        budget -= tokens
        prefilling += state.produced == 0
        if state.computed < state.prompt:
            filled.update(cache.filled(request, state.computed + tokens))
    admitted = 0
    while budget > 0 and prefilling < want_prefill and next_new + admitted < len(pending):
        request = pending[next_new + admitted]
        state = _Running(request, cache.hit(request, filled))
        need = state.prompt - state.computed
        tokens = min(need, cap if 0 < cap < need else need, budget)
        plan.append((request, state, tokens))
        filled.update(cache.filled(request, state.computed + tokens))
        budget -= tokens
        prefilling += 1
        admitted += 1
    return plan, admitted


def _shape(plan: list[tuple[Request, _Running, int]]) -> StepShape:
    """The step as the cost model sees it (the simulator's own classification)."""
    return shape_of(
        ((state.computed, tokens, state.produced > 0 and tokens == 1) for _, state, tokens in plan),
        len(plan),
    )
