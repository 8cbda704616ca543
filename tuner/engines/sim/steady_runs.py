"""The fast path beside the scheduler's mirror of vLLM (:mod:`.scheduler`): runs of steps
whose composition is certain without scheduling them one by one, applied in one go with the
same result (``docs/simulator.md``, "Speed"; ``tests/test_sim_engine.py`` checks that every
kind of run gives exactly what stepping gives).

:class:`SteadyRuns` is the half of :class:`~prefill_tuner.engines.sim.scheduler.Scheduler`
that finds such a run (:meth:`SteadyRuns.steady_run`) and applies it
(:meth:`SteadyRuns.apply_steady_run`); the scheduler proper, which a reader holds beside vLLM's
``scheduler.py``, decides one step at a time and never calls it. The loop
(:mod:`.loop`) chooses between the two.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.kv_cache import KVCache
from prefill_tuner.engines.sim.request import SimRequest, Status

Scheduled = tuple[SimRequest, int]
"""A request and the tokens a step gives it."""


@dataclass(frozen=True, slots=True)
class SteadyRun:
    """Steps whose composition is fixed (:meth:`Scheduler.steady_run`): every one gives each
    running request the same tokens, one to each of ``decodes``, ``chunks``' count of its
    prompt to each prefilling request, none of which completes its prompt in the run."""

    steps: int
    """How many such steps are certain, starting now (later arrivals aside)."""
    decodes: list[SimRequest]
    """The decoding requests, in running order."""
    lasts: list[int]
    """Per decoding request, the steps of the run it is scheduled in (its last token's step
    is the last of them; fewer than ``steps`` only in a run past finishes)."""
    chunks: list[Scheduled]
    """The prefilling requests, in running order, with the tokens each step gives them."""
    order: list[Scheduled]
    """Every running request with its tokens per step, in running (scheduling) order."""

    @property
    def prefill_tokens(self) -> int:
        return sum(chunk for _, chunk in self.chunks)


def _chunk_steps(request: SimRequest, chunk: int, max_model_len: int) -> int:
    """Steps in which ``request`` can take ``chunk`` tokens without completing its prompt
    (nor reaching ``max_model_len - 1`` computed tokens, where ``schedule()`` caps it)."""
    remaining = request.num_tokens - request.num_computed
    return min((remaining - 1) // chunk, (max_model_len - 1 - request.num_computed) // chunk)


def _prefill_blocks(request: SimRequest, chunk: int, steps: int, size: int) -> int:
    """New KV blocks ``steps`` chunks of ``chunk`` tokens take for ``request``."""
    need = -(-(request.num_computed + chunk * steps) // size)
    return max(need - len(request.blocks), 0)


def _add_chunk_blocks(
    by_step: list[int], request: SimRequest, chunk: int, steps: int, size: int
) -> None:
    """Add to ``by_step`` the new KV blocks each of ``steps`` chunks of ``chunk`` tokens
    takes for ``request``."""
    have, computed = len(request.blocks), request.num_computed
    ends = range(computed + chunk, computed + chunk * steps + 1, chunk)
    before = 0
    for step, total in enumerate([max(-(-end // size) - have, 0) for end in ends]):
        if total != before:
            by_step[step] += total - before
            before = total


class SteadyRuns:
    """Finding and applying runs of fixed composition, on the scheduler's state (the
    attributes below are :class:`~prefill_tuner.engines.sim.scheduler.Scheduler`'s)."""

    config: SimConfig
    admission_limit: int
    cadence: int
    executed_steps: int
    capacity_bound: bool
    kv: KVCache
    running: list[SimRequest]
    waiting: deque[SimRequest]
    retired: list[SimRequest] | None
    track_positions: bool
    num_stale: int

    def steady_run(self, past_finishes: bool = False) -> SteadyRun | None:
        """The steps, starting now, whose composition is certain without scheduling them:
        every running request scheduled, each decoding one token or prefilling a chunk of the
        same size each step (``schedule()``'s chunk: the threshold, then the budget the
        requests before it leave). ``None`` when there is no such step.

        That holds while: every running request fits the budget and no chunk is its prompt's
        last (that one samples, and is smaller); the waiting queue is empty, or its head
        cannot be admitted during the run (free KV blocks only shrink while nobody finishes,
        its prefix hit can only shrink, and the budget left, the long-prefill threshold and
        the running count stay as they are); nobody finishes before the last step (the run
        ends with the first finishing step); and every block allocation fits in the free
        blocks (it ends before a preemption). New arrivals are the caller's to bound.

        ``past_finishes`` (the caller has no client to tell of a finish before the run ends):
        a plain decode run with nobody waiting goes on past its finishes, the batch shrinking,
        until the last request finishes (a finish changes nothing else then: nobody can be
        admitted, and blocks freed only make allocations fit more easily).
        """
        config, running = self.config, self.running
        if not running or (config.async_scheduling and self.num_stale):
            return None  # async: a waiting request becomes resumable when its stale output lands
        if self.cadence > 1 and (self.waiting or any(r.is_prefill_chunk for r in running)):
            return None  # a prefill cadence may hold any step: stepped
        if self.waiting and config.enable_chunked_prefill and self._decoding(running[-1]):
            # The waiting head first, cheaply: if it is admitted with the most budget a run
            # could leave (every running request takes a token at least), it is admitted
            # with any budget left above 0 (its chunk only shrinks), so no run. A run with
            # no budget left needs the requests before the last (which decodes) to take all
            # but one token: this misses that rare run (stepping is exact), and otherwise
            # saves an O(running) composition.
            most = config.max_num_batched_tokens - len(running)
            if most > 0 and not self._head_blocked(len(running), most):
                return None
        composition = self._steady_composition()
        if composition is None:
            return None
        steps, budget, decodes, lasts, chunks, order = composition
        if self.waiting and not self._head_blocked(len(running), budget):
            return None
        first_finish = min(lasts, default=steps)
        if first_finish <= 0:
            return None
        if past_finishes and not chunks and not self.waiting:
            steps = max(lasts)
        else:
            steps = min(steps, first_finish)
        steps = self._allocations_fit(decodes, lasts, chunks, steps)
        if steps <= 0:
            return None
        return SteadyRun(steps, decodes, lasts, chunks, order)

    def _steady_composition(
        self,
    ) -> tuple[int, int, list[SimRequest], list[int], list[Scheduled], list[Scheduled]] | None:
        """What ``schedule()`` would give each running request, if it gives each one a decode
        or a chunk that it can repeat: the steps the chunks allow, the budget left, the
        decodes and their steps until their last token, the chunks, and everything in order."""
        config = self.config
        running = self.running
        budget = config.max_num_batched_tokens
        eligible = len(running) + len(self.waiting)
        threshold = config.long_prefill_token_threshold if eligible > 1 else 0
        if threshold > 0 and config.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, config.max_num_batched_tokens // eligible)
        max_model_len = config.max_model_len
        steps = max_model_len
        decodes: list[SimRequest] = []
        lasts: list[int] = []
        chunks: list[Scheduled] = []
        order: list[Scheduled] = []
        asynchronous = config.async_scheduling
        lag = 1 if asynchronous else 0  # async: its last token is in flight already
        for request in running:
            if budget <= 0:
                return None
            if (
                request.placeholders == 1 and request.num_computed == request.num_tokens
                if asynchronous
                else request.num_computed == request.num_tokens - 1 and request.num_output > 0
            ):  # (:meth:`_decoding`, inlined)
                decodes.append(request)
                lasts.append(request.max_tokens - request.num_output - lag)
                order.append((request, 1))
                budget -= 1
                continue
            if asynchronous and (request.placeholders or request.stale):
                return None  # its prompt's last chunk is in flight
            chunk = self._repeatable_chunk(request, threshold, budget)
            if chunk <= 0:
                return None
            steps = min(steps, _chunk_steps(request, chunk, max_model_len))
            chunks.append((request, chunk))
            order.append((request, chunk))
            budget -= chunk
        if steps <= 0:
            return None
        return steps, budget, decodes, lasts, chunks, order

    def _decoding(self, request: SimRequest) -> bool:
        """Whether a running request's next step is a plain decode: async, exactly its next
        token in flight (the step before), and no more; synchronous, its last token sampled
        (a last 1-token chunk of a prompt is not a decode)."""
        if self.config.async_scheduling:
            return request.placeholders == 1 and request.num_computed == request.num_tokens
        return request.num_computed == request.num_tokens - 1 and request.num_output > 0

    @staticmethod
    def _repeatable_chunk(request: SimRequest, threshold: int, budget: int) -> int:
        """The chunk ``schedule()`` gives a prefilling running request (the threshold, then
        the budget), or 0 when it is the prompt's last (it samples, and the next differs)."""
        remaining = request.num_tokens - request.num_computed
        num_new = threshold if 0 < threshold < remaining else remaining
        num_new = min(num_new, budget)
        return num_new if num_new < remaining else 0

    def _allocations_fit(
        self,
        decodes: list[SimRequest],
        lasts: list[int],
        chunks: list[Scheduled],
        steps: int,
    ) -> int:
        """How many of the run's first ``steps`` steps have every block allocation fit in the
        blocks free now (request i needs a block whenever its computed tokens reach the end of
        its last block, while it is scheduled; a prefilling one for each block its chunk
        enters). Blocks that finishes free are not counted: the run may end sooner than it
        must, never later."""
        size = self.config.block_size
        free = self.kv.num_free_blocks
        chunk_total = sum(_prefill_blocks(r, chunk, steps, size) for r, chunk in chunks)
        if len(decodes) * -(-steps // size) + chunk_total <= free:
            # Fits even if every decode took a block every ``size`` steps from the first
            # (each has its slots up to its computed tokens already: ``firsts`` >= 0).
            return steps
        firsts = [len(r.blocks) * size - r.num_computed for r in decodes]
        ranges = [
            range(first, min(last, steps), size) for first, last in zip(firsts, lasts, strict=True)
        ]
        if sum(map(len, ranges)) + chunk_total <= free:
            return steps  # every allocation of the whole run fits
        needs_by_step = [0] * steps
        for allocations in ranges:
            for step in allocations:
                needs_by_step[step] += 1
        for request, chunk in chunks:
            _add_chunk_blocks(needs_by_step, request, chunk, steps, size)
        for step, total in enumerate(accumulate(needs_by_step)):
            if total > free:
                return step
        return steps

    def _head_blocked(self, running: int, budget: int) -> bool:
        """Whether the waiting head cannot be admitted with ``running`` requests scheduled and
        ``budget`` tokens left (and stays so while the run lasts)."""
        config, kv = self.config, self.kv
        if running >= self.admission_limit or budget <= 0:
            return True
        head = self.waiting[0]
        hits = kv.computed_blocks(head) if head.num_computed == 0 and kv.enable_caching else []
        num_new = head.num_tokens - head.num_computed - len(hits) * config.block_size
        eligible = running + len(self.waiting)
        threshold = config.long_prefill_token_threshold if eligible > 1 else 0
        if threshold > 0 and config.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, config.max_num_batched_tokens // eligible)
        if 0 < threshold < num_new:
            num_new = threshold
        if not config.enable_chunked_prefill and num_new > budget:
            return True
        return not kv.can_allocate(
            head,
            min(num_new, budget),
            hits,
            full_sequence_must_fit=config.scheduler_reserve_full_isl,
            has_scheduled_reqs=True,
        )

    def apply_steady_run(
        self, run: SteadyRun, steps: int, token_times: list[float]
    ) -> tuple[list[int], list[SimRequest]]:
        """Apply the first ``steps`` steps of ``run`` (as :meth:`steady_run` found it) and the
        ``steps`` outputs that arrive meanwhile (synchronous: each step's own; async: the step
        in flight before the run and all but the run's last), at ``token_times``. Returns the
        KV blocks in use during each step, and the requests that finished, in order (their
        blocks freed, each as soon as its last token's output was applied, before the next
        step's allocations: what a free puts back decides what later allocations evict)."""
        lag = 1 if self.config.async_scheduling else 0  # the last step's token is in flight
        caching = self.kv.enable_caching
        times = array("d", token_times)
        start_used = self.kv.num_used_blocks
        changes = [0] * steps
        """Per step, the blocks taken less those freed before it."""
        freeing: dict[int, list[SimRequest]] = {}
        """Step → the requests whose last output is applied before it is scheduled (the run's
        length: after its last step)."""
        staying: list[tuple[SimRequest, int]] = []
        lasts = run.lasts
        for index, (request, last) in enumerate(zip(run.decodes, lasts, strict=True)):
            if not request.num_output:  # async: the step in flight before the run sampled
                request.first_position = index  # its first token, and all the run's decodes'
            if last + lag <= steps:  # its last token's output lands inside the run
                freeing.setdefault(last + lag, []).append(request)
                if self.track_positions:  # the decodes before it still in its last step
                    request.last_position = sum(1 for other in lasts[:index] if other >= last)
            else:
                staying.append((request, min(last, steps)))
        finished = self._take_blocks(run, steps, freeing, times, changes)
        for request, scheduled in staying:
            computed = request.num_computed
            request.num_computed = computed + scheduled
            if lag:
                request.in_flight = 1  # the run's last step (the one before it has landed)
            request.num_output += steps
            request.num_tokens += steps
            request.token_times += times
            if caching:
                self.kv.cache_full_blocks(request, computed + scheduled - lag)
        if finished:
            done = {id(request) for request in finished}
            self.running = [r for r in self.running if id(r) not in done]
        if self.cadence > 1:
            # Decodes alone, nobody waiting (steady_run's rule under a cadence): every step
            # counts, none restarts the interval, and the first that could prefill found the
            # queue drained, so holding is allowed again.
            self.executed_steps += steps
            self.capacity_bound = False
        used = list(accumulate(changes, initial=start_used))[1:]
        return used, finished

    def _take_blocks(
        self,
        run: SteadyRun,
        steps: int,
        freeing: dict[int, list[SimRequest]],
        times: array[float],
        changes: list[int],
    ) -> list[SimRequest]:
        """Take the run's KV blocks, cache its chunks' full blocks and free its finished
        requests, as stepping would: a stretch between frees at a time, its frees after it.
        Within a stretch nothing is freed, so taking its blocks at once takes the same ones
        (and evicts the same cached ones) as step by step; a chunk's full blocks are cached
        after them, which leaves the prefix cache as stepping does (an eviction and a caching
        of the same key commute), in step and running order where several prompts prefill
        (their keys may coincide, and the first cached is the one a hit takes). Taken across
        frees, a chunk would evict cached blocks that a finish in the run spares.
        ``changes`` gains each step's blocks; the chunks' progress is counted. Returns the
        requests that finished, in order."""
        kv, size = self.kv, self.config.block_size
        lag = 1 if self.config.async_scheduling else 0
        stops = sorted(freeing)
        if not stops or stops[-1] < steps:
            stops.append(steps)
        takers: list[list[tuple[SimRequest, int]]] = [[] for _ in stops]
        """Per stretch between frees, the requests taking blocks in it and how many."""
        for request, last in zip(run.decodes, run.lasts, strict=True):
            first = len(request.blocks) * size - request.num_computed
            allocations = range(first, min(last, steps), size)
            if not allocations:
                continue
            for step in allocations:
                changes[step] += 1
            stretch = bisect_right(stops, allocations[0])
            end = stops[stretch]
            if allocations[-1] < end:
                takers[stretch].append((request, len(allocations)))
            else:  # across frees: each stretch's blocks are taken before the frees ending it
                for step in allocations:
                    while step >= stops[stretch]:
                        stretch += 1
                    takers[stretch].append((request, 1))
        for request, chunk in run.chunks:
            _add_chunk_blocks(changes, request, chunk, steps, size)
            start = 0
            for stretch, stop in enumerate(stops):
                end = min(stop, steps)
                taken = _prefill_blocks(request, chunk, end, size) - start
                if taken:
                    takers[stretch].append((request, taken))
                    start += taken
        caching = kv.enable_caching and bool(run.chunks)
        finished: list[SimRequest] = []
        begin = 0
        for stop, takes in zip(stops, takers, strict=True):
            fresh = kv.new_blocks(sum(count for _, count in takes)) if takes else []
            taken = 0
            for request, count in takes:
                request.blocks += fresh[taken : taken + count]
                taken += count
            if caching:
                self._cache_chunks(run.chunks, begin, min(stop, steps))
            if stop in freeing:
                in_use = kv.num_used_blocks
                finished += self._finish_run_requests(freeing[stop], times, lag)
                if stop < steps:
                    changes[stop] -= in_use - kv.num_used_blocks
            begin = stop
        for request, chunk in run.chunks:
            request.num_computed += chunk * steps
            if lag:
                request.in_flight = chunk  # the run's last chunk
        return finished

    def _cache_chunks(self, chunks: list[Scheduled], begin: int, end: int) -> None:
        """Cache the full blocks the run's chunks fill in its steps ``begin`` to ``end``:
        step by step in running order if more than one of them registers a block another
        request could find, else each at once."""
        cache, size = self.kv.cache_full_blocks, self.config.block_size
        registering = 0
        for request, chunk in chunks:
            full = (request.num_computed + chunk * end) // size
            registering += request.num_cached_blocks < min(full, request.shareable_tokens // size)
        if registering <= 1:
            for request, chunk in chunks:
                cache(request, request.num_computed + chunk * end)
            return
        for step in range(begin + 1, end + 1):
            for request, chunk in chunks:
                cache(request, request.num_computed + chunk * step)

    def _finish_run_requests(
        self, requests: list[SimRequest], times: array[float], lag: int
    ) -> list[SimRequest]:
        """Apply the rest of a run's requests that have just delivered their last token, and
        free them (``running`` is the caller's to update)."""
        for request in requests:
            tokens = request.max_tokens - request.num_output
            computed = request.num_computed + tokens - lag
            request.num_computed = computed
            request.in_flight = request.placeholders = 0
            request.num_output += tokens
            request.num_tokens += tokens
            request.token_times += times[:tokens]
            if self.kv.enable_caching:
                self.kv.cache_full_blocks(request, computed)
        if self.retired is not None:
            self.retired += requests
        for request in requests:
            request.status = Status.FINISHED
            self.kv.free(request)
        return requests
