"""Token ids for a trace's prompts, so prefix sharing behaves as in production.

Requests that share leading prefix-block ids get identical leading tokens (the tokens of a
block depend only on its id, its size and the seed); every other token is drawn from a stream
private to the request, so unrelated requests never share a prefix by accident. Ids lie in
``[low, high)``: keep them below the model's vocabulary size and clear of its special ids.
"""

from __future__ import annotations

import hashlib

import numpy as np

from prefill_tuner.trace.model import Request


def _stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


def _request_key(request_id: str) -> int:
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little")


def prompt_token_ids(request: Request, *, low: int, high: int, seed: int = 0) -> list[int]:
    """The request's prompt as token ids (exactly ``prompt_tokens`` of them)."""
    if not 0 <= low < high:
        raise ValueError(f"token id range [{low}, {high}) is empty")
    tokens: list[int] = []
    size = request.prefix_block_size or 0
    for block in request.prefix_blocks:
        if len(tokens) >= request.prompt_tokens:
            break
        take = min(size, request.prompt_tokens - len(tokens))
        tokens.extend(_stream(seed, 0, size, block).integers(low, high, size)[:take].tolist())
    rest = request.prompt_tokens - len(tokens)
    if rest > 0:
        private = _stream(seed, 1, _request_key(request.id)).integers(low, high, rest)
        tokens.extend(private.tolist())
    return tokens
