"""The paged KV cache, mirroring vLLM V1's ``KVCacheManager`` and ``BlockPool`` for one
full-attention group (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``).

What the scheduler's decisions depend on, reproduced exactly:

- block 0 is reserved (the null block), so ``num_gpu_blocks - 1`` are usable;
- free blocks form one queue: blocks without a prefix-cache key are put at its head (reused
  first), cached ones at its tail in the order freed (least recently used first); a request
  frees its blocks last-to-first, so its tail is evicted before its head;
- cached free blocks count as free; allocating one evicts its key;
- a full block is cached as soon as it is scheduled (before the step runs), duplicates allowed;
- a new request's hit is the longest run of cached leading blocks, at most ``num_tokens - 1``
  tokens, and hit blocks sitting in the free queue count against the free blocks;
- the watermark applies only to admissions (waiting or preempted requests) while others run.

Because uncached free blocks are interchangeable, they are kept as a plain stack; only cached
free blocks need an order (an insertion-ordered dict).
"""

from __future__ import annotations

from collections import OrderedDict

from prefill_tuner.engines.sim.request import SimRequest, Status


class KVCache:
    """Block accounting and the prefix cache for the simulated engine."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool,
        watermark: float,
        max_model_len: int,
    ) -> None:
        self.block_size = block_size
        self.usable_blocks = num_blocks - 1
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.watermark_blocks = int(watermark * num_blocks)
        self._uncached_free: list[int] = list(range(num_blocks - 1, 0, -1))
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # first = evicted first
        self._ref = [0] * num_blocks
        self._key: list[int | None] = [None] * num_blocks
        # key → the block holding it, or (duplicates) an ordered dict of them, first = the one
        # a hit takes; as vLLM's BlockHashToBlockMap.
        self._by_key: dict[int, int | dict[int, None]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._uncached_free) + len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.usable_blocks - self.num_free_blocks

    def computed_blocks(self, request: SimRequest) -> list[int]:
        """The longest prefix of the request's blocks found in the cache (vLLM's
        ``get_computed_blocks``), at most ``num_tokens - 1`` tokens."""
        if not self.enable_caching:
            return []
        size = self.block_size
        by_key = self._by_key
        hit: list[int] = []
        end = (request.num_tokens - 1) // size
        start, batch = 0, 8
        while start < end:  # keys in growing batches: most walks stop at the first blocks
            stop = min(end, start + batch)
            for key in request.block_keys(start, stop, size):
                holder = by_key.get(key)
                if holder is None:
                    return hit
                hit.append(holder if holder.__class__ is int else next(iter(holder)))  # type: ignore[arg-type]
            start, batch = stop, batch * 2
        return hit

    def can_allocate(
        self,
        request: SimRequest,
        num_new_tokens: int,
        hit_blocks: list[int],
        *,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> bool:
        """Whether :meth:`allocate_slots` would succeed (it changes nothing)."""
        local_computed = request.num_computed + len(hit_blocks) * self.block_size
        watermark = (
            self.watermark_blocks
            if has_scheduled_reqs and request.status in (Status.WAITING, Status.PREEMPTED)
            else 0
        )
        free = self.num_free_blocks
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._blocks_needed(request, full, hit_blocks) + watermark > free:
                return False
        need_slots = min(local_computed + num_new_tokens, self.max_model_len)
        return self._blocks_needed(request, need_slots, hit_blocks) + watermark <= free

    def allocate_slots(
        self,
        request: SimRequest,
        num_new_tokens: int,
        hit_blocks: list[int] | None = None,
        *,
        full_sequence_must_fit: bool = False,
        has_scheduled_reqs: bool = True,
    ) -> bool:
        """Give the request slots for ``num_new_tokens`` more tokens, adopting ``hit_blocks``
        first; False (and no change) when the free blocks do not suffice."""
        hit_blocks = hit_blocks or []
        if not self.can_allocate(
            request,
            num_new_tokens,
            hit_blocks,
            full_sequence_must_fit=full_sequence_must_fit,
            has_scheduled_reqs=has_scheduled_reqs,
        ):
            return False
        computed = min(request.num_computed + len(hit_blocks) * self.block_size, self.max_model_len)
        if hit_blocks:
            self._touch(hit_blocks)
            request.blocks.extend(hit_blocks)
            request.num_cached_blocks = len(request.blocks)
        need_slots = min(computed + num_new_tokens, self.max_model_len)
        missing = -(-need_slots // self.block_size) - len(request.blocks)
        if missing > 0:
            request.blocks.extend(self.new_blocks(missing))
        if self.enable_caching:
            self.cache_full_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return True

    def free(self, request: SimRequest) -> None:
        """Return the request's blocks, last first (so its tail is evicted first)."""
        ref, key_of = self._ref, self._key
        uncached, cached = self._uncached_free, self._cached_free
        caching = self.enable_caching
        for block in reversed(request.blocks):
            count = ref[block] - 1
            ref[block] = count
            if count == 0:
                if caching and key_of[block] is not None:
                    cached[block] = None
                else:
                    uncached.append(block)
        request.blocks = []
        request.num_cached_blocks = 0

    # --- internals -------------------------------------------------------------------------

    def _blocks_needed(self, request: SimRequest, num_tokens: int, hit_blocks: list[int]) -> int:
        required = -(-num_tokens // self.block_size)
        new = max(required - len(hit_blocks) - len(request.blocks), 0)
        evictable = sum(1 for block in hit_blocks if self._ref[block] == 0)
        return new + evictable

    def _touch(self, blocks: list[int]) -> None:
        ref = self._ref
        for block in blocks:
            if ref[block] == 0:
                del self._cached_free[block]
            ref[block] += 1

    def new_blocks(self, count: int) -> list[int]:
        """Take ``count`` free blocks: uncached ones first, then the least recently used."""
        uncached = self._uncached_free
        if count <= len(uncached):
            taken = uncached[len(uncached) - count :]
            del uncached[len(uncached) - count :]
        else:
            taken = uncached[:]
            uncached.clear()
            popitem = self._cached_free.popitem
            evicted = [popitem(last=False)[0] for _ in range(count - len(taken))]
            self._evict(evicted)
            taken += evicted
        ref = self._ref
        for block in taken:
            ref[block] = 1
        return taken

    def _evict(self, blocks: list[int]) -> None:
        """Drop the blocks' keys from the prefix cache."""
        key_of, by_key = self._key, self._by_key
        for block in blocks:
            key = key_of[block]
            if key is None:
                continue
            key_of[block] = None
            holder = by_key[key]
            if holder.__class__ is int:
                del by_key[key]
            else:
                del holder[block]  # type: ignore[union-attr]
                if len(holder) == 1:  # type: ignore[arg-type]
                    by_key[key] = next(iter(holder))  # type: ignore[call-overload]

    def cache_full_blocks(self, request: SimRequest, num_tokens: int) -> None:
        """Register the request's full blocks up to ``num_tokens`` under their keys."""
        size = self.block_size
        start, full = request.num_cached_blocks, num_tokens // size
        if full <= start:
            return
        key_of, by_key = self._key, self._by_key
        blocks = request.blocks[start:full]
        for block, key in zip(blocks, request.block_keys(start, full, size), strict=True):
            if key_of[block] is not None:
                self._evict([block])
            key_of[block] = key
            holder = by_key.get(key)
            if holder is None:
                by_key[key] = block
            elif holder.__class__ is int:
                by_key[key] = {holder: None, block: None}  # type: ignore[dict-item]
            else:
                holder[block] = None  # type: ignore[index]
        request.num_cached_blocks = full
