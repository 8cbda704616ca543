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

from tuner.engines.sim.request import SimRequest, Status


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
        self._by_key: dict[int, dict[int, None]] = {}  # key → block ids, first = the one hit

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
        hit: list[int] = []
        for position in range((request.num_tokens - 1) // size):
            holders = self._by_key.get(request.block_key(position, size))
            if not holders:
                break
            hit.append(next(iter(holders)))
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
        ref, key = self._ref, self._key
        for block in reversed(request.blocks):
            ref[block] -= 1
            if ref[block] == 0:
                if key[block] is None or not self.enable_caching:
                    self._uncached_free.append(block)
                else:
                    self._cached_free[block] = None
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
        taken: list[int] = []
        uncached, cached, ref = self._uncached_free, self._cached_free, self._ref
        for _ in range(count):
            if uncached:
                block = uncached.pop()
            else:
                block, _ = cached.popitem(last=False)
                self._evict(block)
            ref[block] = 1
            taken.append(block)
        return taken

    def _evict(self, block: int) -> None:
        key = self._key[block]
        if key is None:
            return
        holders = self._by_key[key]
        del holders[block]
        if not holders:
            del self._by_key[key]
        self._key[block] = None

    def cache_full_blocks(self, request: SimRequest, num_tokens: int) -> None:
        """Register the request's full blocks up to ``num_tokens`` under their keys."""
        size = self.block_size
        full = num_tokens // size
        for position in range(request.num_cached_blocks, full):
            block = request.blocks[position]
            if self._key[block] is not None:
                self._evict(block)
            key = request.block_key(position, size)
            self._key[block] = key
            self._by_key.setdefault(key, {})[block] = None
        if full > request.num_cached_blocks:
            request.num_cached_blocks = full
