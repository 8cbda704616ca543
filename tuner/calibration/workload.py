"""The profiling workload ``tune calibrate --engine vllm`` replays: designed, not sampled, so
that every term of the step model is seen over its whole range.

Four phases, one trace (one server start):

1. **Prefill sweep.** Lone prompts from 16 tokens to ``max_model_len``, geometric, twice each,
   spaced apart: pure prefill steps, chunked by the budget (the later chunks of a long prompt
   read the earlier ones' context), then a few decodes at long context, batch one.
2. **Decode batches.** Bursts of 1, 2, 4, ... short requests at once, up to ``max_num_seqs``
   (at most :data:`MAX_BATCH`), with outputs long enough that the whole burst decodes
   together: decode steps over batch sizes, and the front end's handling of a burst.
3. **Long prompts among streaming decodes.** A group of decoders, then long prompts arriving
   while they stream: mixed steps, chunk by chunk (the lesson's traffic classes). With the
   server's long-prefill threshold low (:data:`CALIBRATION_THRESHOLD_SHARE`), these chunks
   are small at every prior context, while lone prompts (no cap: one request in the system)
   are chunked at the full budget: small chunks reading a long context tell the attention's
   cost per context token apart from its cost per query-key pair.
4. **Long-context decodes.** Bursts again, at up to three quarters of ``max_model_len``
   (fewer tokens per request as the burst grows, :data:`LONG_CONTEXT_KV`): what attention
   over a long context costs a decode.

``spacing`` stretches every gap: 1.0 fits a small model on a CPU (a 4K-token prefill in under
a second); give more where one prompt of ``max_model_len`` tokens takes longer than a second.
"""

from __future__ import annotations

import numpy as np

from prefill_tuner.trace.model import Request, Trace

MAX_BATCH = 128
"""Largest decode burst: beyond it, batches add little the fit cannot extrapolate."""
PREFILL_SIZES = 10
"""Prompt lengths in the prefill sweep."""
CALIBRATION_THRESHOLD_SHARE = 32
"""The calibration server caps a prefill chunk at ``max_num_batched_tokens // 32`` while
other requests run."""
LONG_CONTEXT_KV = 2
"""A long-context burst holds at most this many ``max_model_len``s of KV cache (a pool holds
at least one: vLLM refuses to start otherwise)."""


def profiling_trace(*, max_model_len: int, max_num_seqs: int, spacing: float = 1.0) -> Trace:
    """The designed workload for a server with these limits."""
    if max_model_len < 64:
        raise ValueError(f"max_model_len {max_model_len}: too short to calibrate (at least 64)")
    if not spacing > 0:
        raise ValueError(f"spacing {spacing}: must be positive")
    requests: list[Request] = []
    clock = 0.0

    def add(kind: str, prompt: int, output: int, at: float) -> None:
        prompt = max(1, min(prompt, max_model_len - output))
        requests.append(
            Request(
                id=f"{kind}-{len(requests)}",
                arrival_s=at,
                prompt_tokens=prompt,
                output_tokens=output,
            )
        )

    def burst(batch: int, prompt: int, at: float) -> float:
        """``batch`` requests at once, decoding together (outputs outlast the admissions);
        when the next phase may start."""
        for _ in range(batch):
            add("decode", prompt, 32 + batch, at)
        return at + spacing * (1.0 + batch / 32 + batch * prompt / 65536)

    longest = max_model_len - 8
    sizes = np.unique(np.geomspace(16, longest, PREFILL_SIZES).astype(int))
    for size in [*sizes, *sizes[::-1]]:
        add("prefill", int(size), 4, clock)
        clock += spacing * max(0.2, size / 4096)

    clock += spacing
    largest = min(max_num_seqs, MAX_BATCH)
    batches = [2**k for k in range(largest.bit_length()) if 2**k <= largest]
    for batch in batches:
        clock = burst(batch, 32, clock)

    decoders = min(16, max_num_seqs - 4)
    for _ in range(max(decoders, 1)):
        add("stream", 64, 320, clock)
    # The long prompts come once the streams are all in (a front end takes a burst one
    # request at a time): the server then sees them in the order they were sent.
    for offset, share in ((1.0, 0.25), (1.5, 0.5), (2.2, 1.0)):
        add("long", int(longest * share), 4, clock + spacing * offset)
    clock += spacing * 6

    # Long contexts last: a pool smaller than assumed preempts, and the rebuild stops there.
    for batch in batches:
        context = min(3 * max_model_len // 4, LONG_CONTEXT_KV * max_model_len // batch)
        if context < max_model_len // 8:
            break
        clock = burst(batch, context, clock)
    return Trace(requests=tuple(requests))
