"""The profiling workload ``tune calibrate --engine vllm`` replays: designed, not sampled, so
that every term of the step model is seen over its whole range.

Three phases, one trace (one server start):

1. **Prefill sweep.** Lone prompts from 16 tokens to ``max_model_len``, geometric, twice each,
   spaced apart: pure prefill steps, chunked by the budget (the later chunks of a long prompt
   read the earlier ones' context), then a few decodes at long context, batch one.
2. **Decode batches.** Bursts of 1, 2, 4, ... requests at once, up to ``max_num_seqs``
   (at most :data:`MAX_BATCH`), each burst at another prompt length, and outputs long enough
   that the whole burst decodes together: decode steps over batch sizes and context lengths,
   and the front end's handling of a burst.
3. **Long prompts among streaming decodes.** A group of decoders, then long prompts arriving
   while they stream: mixed steps, chunk by chunk (the lesson's traffic classes).

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

    longest = max_model_len - 8
    sizes = np.unique(np.geomspace(16, longest, PREFILL_SIZES).astype(int))
    for size in [*sizes, *sizes[::-1]]:
        add("prefill", int(size), 4, clock)
        clock += spacing * max(0.2, size / 4096)

    clock += spacing
    batch, contexts = 1, (32, max_model_len // 8, max_model_len // 4)
    for index in range(64):
        if batch > min(max_num_seqs, MAX_BATCH):
            break
        prompt = contexts[index % len(contexts)]
        output = 32 + batch  # long enough that the whole burst decodes together
        for _ in range(batch):
            add("decode", prompt, output, clock)
        clock += spacing * (1.0 + batch / 32)
        batch *= 2

    decoders = min(16, max_num_seqs - 2)
    for _ in range(max(decoders, 1)):
        add("stream", 64, 160, clock)
    for offset, share in ((0.3, 0.5), (0.8, 1.0)):
        add("long", int(longest * share), 4, clock + spacing * offset)
    return Trace(requests=tuple(requests))
