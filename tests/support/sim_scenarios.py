"""Random small scenarios that exercise every scheduling rule: chunking, the long-prefill
threshold (adaptive too), preemption under KV pressure, reserve-full-ISL on and off, the
watermark, chunked prefill off, and prefix-cache hits from shared prefix blocks."""

from __future__ import annotations

import numpy as np

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import FittedProfile
from prefill_tuner.trace.model import Request, Trace

LINEAR = FittedProfile(
    name="linear",
    base_ms=4.0,
    prefill_token_ms=0.02,
    prefill_pair_ms=1e-6,
    prefill_context_ms=1e-4,
    decode_ms=0.05,
    decode_squared_ms=1e-4,
    decode_context_ms=3e-5,
    request_ms=0.01,
    prefill_step_ms=0.8,
    host_ms=1.3,
    host_request_ms=0.07,
)
"""A fitted profile with every term non-zero (a host part included): fast-forwarded runs
must give its floats exactly as stepping does."""


def random_scenario(seed: int, *, async_scheduling: bool = False) -> tuple[Trace, SimConfig]:
    """Scenario ``seed``: the same requests and settings for either scheduling mode."""
    rng = np.random.default_rng(seed)
    block_size = int(rng.choice([4, 8, 16]))
    trace_block = block_size * int(rng.choice([1, 2]))
    max_model_len = int(rng.choice([128, 256]))
    n = int(rng.integers(2, 13))
    documents = int(rng.integers(1, 4))
    requests = []
    clock = 0.0
    for index in range(n):
        clock += float(rng.choice([0.0, rng.uniform(0, 3)]))
        prompt = int(rng.integers(1, 90))
        output = int(rng.integers(1, 25))
        blocks: tuple[int, ...] = ()
        if rng.random() < 0.7:
            count = -(-prompt // trace_block)
            shared = int(rng.integers(0, count + 1))
            document = int(rng.integers(0, documents))
            blocks = tuple(document * 1000 + j for j in range(shared)) + tuple(
                100_000 + index * 100 + j for j in range(count - shared)
            )
        requests.append(
            Request(
                id=f"r{index}",
                arrival_s=round(clock, 3),
                prompt_tokens=prompt,
                output_tokens=output,
                prefix_blocks=blocks,
                prefix_block_size=trace_block if blocks else None,
            )
        )
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    max_num_seqs = int(rng.integers(1, 9))
    chunked = rng.random() < 0.8
    budget = int(rng.integers(max(max_num_seqs, 4), 65)) if chunked else max_model_len
    threshold = int(rng.choice([0, 0, rng.integers(1, 17)]))
    # From tight (preemption, waiting on KV) to ample.
    needed = -(-longest // block_size)
    num_blocks = int(rng.integers(needed + 2, needed + 40))
    # vLLM refuses a pool that cannot hold one max_model_len request besides its null block.
    max_model_len = min(max_model_len, (num_blocks - 1) * block_size)
    if not chunked:
        budget = max_model_len
    config = SimConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        long_prefill_token_threshold_adaptive=bool(rng.random() < 0.3),
        scheduler_reserve_full_isl=bool(rng.random() < 0.6),
        watermark=float(rng.choice([0.0, 0.0, 0.1])),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        enable_prefix_caching=bool(rng.random() < 0.85),
        async_scheduling=async_scheduling,
        max_num_active_seqs=_active_limit(seed, max_num_seqs),
    )
    return Trace(tuple(requests)), config


def _active_limit(seed: int, max_num_seqs: int) -> int | None:
    """vLLM 0.32's ``max_num_active_seqs`` for scenario ``seed``: unset in two of three, else
    from 1 to ``max_num_seqs`` (drawn apart, so that the other draws stay as they were)."""
    rng = np.random.default_rng(20_000_000 + seed)
    return int(rng.integers(1, max_num_seqs + 1)) if rng.random() < 1 / 3 else None


def prefix_heavy_scenario(seed: int, *, async_scheduling: bool = False) -> tuple[Trace, SimConfig]:
    """Scenario ``seed`` of conversations under eviction pressure: every request continues one
    of a few conversations (its prompt is the conversation so far, so its prefix blocks are
    the previous turn's plus new ones), often after a system prompt all share; the pool holds
    a few prompts at most, so cached prefixes are evicted, hit again, preempted and resumed."""
    rng = np.random.default_rng(10_000 + seed)
    block_size = int(rng.choice([2, 4, 8, 16]))
    trace_block = block_size * int(rng.choice([1, 2, 4]))
    max_model_len = 512
    system = tuple(range(int(rng.integers(0, 4))))  # block ids shared by every conversation
    conversations: list[tuple[int, ...]] = [system for _ in range(int(rng.integers(1, 5)))]
    requests = []
    clock = 0.0
    for index in range(int(rng.integers(8, 41))):
        clock += float(rng.choice([0.0, 0.0, rng.uniform(0, 2)]))
        which = int(rng.integers(0, len(conversations)))
        history = conversations[which]
        if len(history) * trace_block > max_model_len // 2 or rng.random() < 0.1:
            history = system  # a new conversation in its place
        added = int(rng.integers(1, 5))
        blocks = history + tuple(1000 * (which + 1) + 10 * index + j for j in range(added))
        conversations[which] = blocks
        # The prompt ends inside or past its last block (past: tokens no block describes).
        prompt = max(1, len(blocks) * trace_block - int(rng.integers(-trace_block, trace_block)))
        prompt = min(prompt, max_model_len - 30)
        requests.append(
            Request(
                id=f"r{index}",
                arrival_s=round(clock, 3),
                prompt_tokens=prompt,
                output_tokens=int(rng.integers(1, 30)),
                prefix_blocks=blocks,
                prefix_block_size=trace_block,
            )
        )
    longest = max(r.prompt_tokens + r.output_tokens for r in requests)
    max_num_seqs = int(rng.integers(1, 9))
    chunked = rng.random() < 0.8
    budget = int(rng.integers(max(max_num_seqs, 8), 257)) if chunked else max_model_len
    needed = -(-longest // block_size)
    num_blocks = int(rng.integers(needed + 2, 3 * needed + 4))
    max_model_len = min(max_model_len, (num_blocks - 1) * block_size)
    config = SimConfig(
        max_num_batched_tokens=budget if chunked else max_model_len,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=int(rng.choice([0, 0, rng.integers(1, 65)])),
        scheduler_reserve_full_isl=bool(rng.random() < 0.6),
        watermark=float(rng.choice([0.0, 0.0, 0.1])),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        enable_prefix_caching=True,
        async_scheduling=async_scheduling,
    )
    return Trace(tuple(requests)), config
