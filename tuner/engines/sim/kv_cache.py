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

How, cheaply (a long trace moves millions of blocks through the pool):

- uncached free blocks are interchangeable, so they are a plain stack;
- cached free blocks are queued in *runs*: the blocks one request freed together, in eviction
  order, taken from the head a slice at a time;
- a block's key goes into the key → block map only if some request could look it up: one
  whose trace prefix other requests share (registered when scheduled, as vLLM does), or any
  full block of a request being preempted (it may find its own blocks when it resumes). Every
  other cached block is only counted and queued: no lookup could tell it from vLLM's, and its
  place in the queue (which decides when shared blocks are evicted) is kept;
- a hit may take a registered block out of the middle of its run: the run keeps the entry,
  which stays valid only while the block's entry in ``_free_registered`` names that run;
- a reference count is kept only for blocks held by more than one request.
"""

from __future__ import annotations

from collections import deque
from itertools import compress, repeat
from operator import not_

from prefill_tuner.engines.sim.request import SimRequest, Status


class _Run:
    """Blocks freed together, in eviction order; with ``keys`` (aligned) when registered."""

    __slots__ = ("blocks", "keys", "stale", "start")

    def __init__(self, blocks: list[int], keys: list[int] | None) -> None:
        self.blocks = blocks
        self.keys = keys
        self.start = 0
        """Entries before it have been evicted."""
        self.stale = 0
        """Entries a prefix hit took out of the queue (registered runs only)."""


def _drain(iterator: object) -> None:
    """Run a ``map`` of side effects at C speed."""
    deque(iterator, maxlen=0)  # type: ignore[call-overload]


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
        self._queue: deque[_Run] = deque()  # first = evicted first
        self._queued = 0
        """Valid entries in the queue: the cached free blocks."""
        self._free_registered: dict[int, _Run] = {}
        """Registered blocks in the queue → the run holding their valid entry."""
        self._extra_refs: dict[int, int] = {}
        """Blocks held by more than one request → holders beyond the first."""
        self._by_key: dict[int, int] = {}
        """Key → the block a hit takes (the first registered under it)."""
        self._duplicates: dict[int, list[int]] = {}
        """Key → the further blocks registered under it, in order (vLLM's
        ``BlockHashToBlockMap`` keeps them all)."""

    @property
    def num_free_blocks(self) -> int:
        return len(self._uncached_free) + self._queued

    @property
    def num_used_blocks(self) -> int:
        return self.usable_blocks - self.num_free_blocks

    def computed_blocks(self, request: SimRequest) -> list[int]:
        """The longest prefix of the request's blocks found in the cache (vLLM's
        ``get_computed_blocks``), at most ``num_tokens - 1`` tokens."""
        if not self.enable_caching:
            return []
        size = self.block_size
        lookup = self._by_key.get
        hit: list[int] = []
        end = (request.num_tokens - 1) // size
        start, batch = 0, 8
        while start < end:  # keys in growing batches: most walks stop at the first blocks
            stop = min(end, start + batch)
            found = list(map(lookup, request.keys_to(stop, size)[start:stop]))
            if None in found:
                hit.extend(found[: found.index(None)])  # type: ignore[arg-type]
                return hit
            hit.extend(found)  # type: ignore[arg-type]
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
        if not hit_blocks and not full_sequence_must_fit:
            # The common call (a running request's next chunk): can_allocate's arithmetic
            # without a hit, inlined.
            max_model_len, size = self.max_model_len, self.block_size
            computed = min(request.num_computed, max_model_len)
            need_slots = min(computed + num_new_tokens, max_model_len)
            missing = -(-need_slots // size) - len(request.blocks)
            watermark = (
                self.watermark_blocks
                if has_scheduled_reqs and request.status in (Status.WAITING, Status.PREEMPTED)
                else 0
            )
            if max(missing, 0) + watermark > len(self._uncached_free) + self._queued:
                return False
            if missing > 0:
                request.blocks += self.new_blocks(missing)
            if self.enable_caching:
                known = min(computed + num_new_tokens, request.num_tokens)
                if known // size > request.num_cached_blocks:
                    self.cache_full_blocks(request, known)
            return True
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
            request.num_cached_blocks = request.registered_blocks = len(request.blocks)
        need_slots = min(computed + num_new_tokens, self.max_model_len)
        missing = -(-need_slots // self.block_size) - len(request.blocks)
        if missing > 0:
            request.blocks.extend(self.new_blocks(missing))
        if self.enable_caching:
            self.cache_full_blocks(request, min(computed + num_new_tokens, request.num_tokens))
        return True

    def free(self, request: SimRequest, *, resumable: bool = False) -> None:
        """Return the request's blocks, last first (so its tail is evicted first).
        ``resumable`` (a preemption): first register every full block, since the request
        looks its own blocks up when it is admitted again."""
        blocks, size = request.blocks, self.block_size
        cached = request.num_cached_blocks
        if resumable and cached > request.registered_blocks:
            start = request.registered_blocks
            self._register(blocks[start:cached], request.keys_to(cached, size)[start:cached])
            request.registered_blocks = cached
        registered = request.registered_blocks
        self._uncached_free.extend(reversed(blocks[cached:]))
        if registered < cached:  # nobody can hit these: queued, never registered
            self._queue.append(_Run(blocks[registered:cached][::-1], None))
            self._queued += cached - registered
        if registered:
            extra = self._extra_refs
            held = blocks[:registered] if extra else blocks
            shared = list(map(extra.__contains__, held)) if extra else None
            if shared is not None and True in shared:  # some stay held by other requests
                keys = request.keys_to(registered, size)[:registered]
                for block in compress(held, shared):
                    others = extra[block]
                    if others == 1:
                        del extra[block]
                    else:
                        extra[block] = others - 1
                lead = shared.index(False) if False in shared else registered
                if True not in shared[lead:]:  # the common case: a hit takes leading blocks
                    freed_blocks, freed_keys = held[lead:], keys[lead:]
                    freed_blocks.reverse()
                    freed_keys.reverse()
                else:
                    alone = list(map(not_, shared))
                    freed_blocks = list(compress(held, alone))[::-1]
                    freed_keys = list(compress(keys, alone))[::-1]
            else:  # last first, straight from the request's lists
                freed_blocks = blocks[registered - 1 :: -1]
                freed_keys = request.keys_to(registered, size)[registered - 1 :: -1]
            if freed_blocks:
                run = _Run(freed_blocks, freed_keys)
                self._queue.append(run)
                self._free_registered.update(zip(freed_blocks, repeat(run)))
                self._queued += len(freed_blocks)
        request.blocks = []
        request.num_cached_blocks = request.registered_blocks = 0
        if not resumable:
            request.keys = []  # finished: never looked up again

    # --- internals -------------------------------------------------------------------------

    def _blocks_needed(self, request: SimRequest, num_tokens: int, hit_blocks: list[int]) -> int:
        required = -(-num_tokens // self.block_size)
        new = max(required - len(hit_blocks) - len(request.blocks), 0)
        if not hit_blocks:
            return new
        return new + sum(map(self._free_registered.__contains__, hit_blocks))

    def _touch(self, blocks: list[int]) -> None:
        """A hit takes the blocks: out of the queue if free, else one more holder."""
        free_registered, extra = self._free_registered, self._extra_refs
        for block in blocks:
            run = free_registered.pop(block, None)
            if run is None:
                extra[block] = extra.get(block, 0) + 1
            else:
                run.stale += 1
                self._queued -= 1

    def new_blocks(self, count: int) -> list[int]:
        """Take ``count`` free blocks: uncached ones first, then the least recently used."""
        uncached = self._uncached_free
        if count <= len(uncached):
            taken = uncached[len(uncached) - count :]
            del uncached[len(uncached) - count :]
            return taken
        taken = uncached[:]
        uncached.clear()
        need = count - len(taken)
        self._queued -= need
        queue = self._queue
        while need:
            run = queue[0]
            blocks, start = run.blocks, run.start
            if run.keys is None or not run.stale:
                stop = min(len(blocks), start + need)
                evicted = blocks[start:stop]
                if run.keys is not None:
                    self._evict(evicted, run.keys[start:stop])
            else:  # skip the entries hits took
                owner = self._free_registered.get
                positions: list[int] = []
                stop = start
                while len(positions) < need and stop < len(blocks):
                    end = min(len(blocks), stop + need - len(positions))
                    positions += [i for i in range(stop, end) if owner(blocks[i]) is run]
                    stop = end
                run.stale -= stop - start - len(positions)
                evicted = [blocks[i] for i in positions]
                self._evict(evicted, [run.keys[i] for i in positions])
            taken += evicted
            need -= len(evicted)
            if stop == len(blocks):
                queue.popleft()
            else:
                run.start = stop
        return taken

    def _register(self, blocks: list[int], keys: list[int]) -> None:
        """Put the blocks in the key → block map (a key already there gains a duplicate)."""
        by_key = self._by_key
        if by_key.keys().isdisjoint(keys):
            by_key.update(zip(keys, blocks, strict=True))
            return
        duplicates = self._duplicates
        for block, key in zip(blocks, keys, strict=True):
            if key in by_key:
                duplicates.setdefault(key, []).append(block)
            else:
                by_key[key] = block

    def _evict(self, blocks: list[int], keys: list[int]) -> None:
        """Drop registered free blocks (leaving the queue) from the prefix cache."""
        _drain(map(self._free_registered.__delitem__, blocks))
        by_key, duplicates = self._by_key, self._duplicates
        if not duplicates or duplicates.keys().isdisjoint(keys):
            _drain(map(by_key.__delitem__, keys))
            return
        for block, key in zip(blocks, keys, strict=True):
            others = duplicates.get(key)
            if others is None:
                del by_key[key]
                continue
            if by_key[key] == block:
                by_key[key] = others.pop(0)
            else:
                others.remove(block)
            if not others:
                del duplicates[key]

    def cache_full_blocks(self, request: SimRequest, num_tokens: int) -> None:
        """Mark the request's full blocks up to ``num_tokens`` cached; register those other
        requests could look up."""
        size = self.block_size
        start, full = request.num_cached_blocks, num_tokens // size
        if full <= start:
            return
        shareable = min(full, request.shareable_tokens // size)
        if start < shareable:
            self._register(
                request.blocks[start:shareable], request.keys_to(shareable, size)[start:shareable]
            )
            request.registered_blocks = shareable
        request.num_cached_blocks = full
