"""One scheduling step, mirroring vLLM V1's ``Scheduler.schedule()`` and
``update_from_output()`` (``vllm/v1/core/sched/scheduler.py``) for a text-only model with
FCFS policy, no speculative decoding and synchronous scheduling (as vLLM runs on CPU).

The rules, in the order vLLM applies them:

1. The long-prefill threshold applies only when more than one request is in the system;
   adaptive, it is raised to ``max_num_batched_tokens // (running + waiting)``.
2. Running requests, in admission order, each get
   ``min(remaining, threshold, budget left, max_model_len - computed - 1)`` tokens. When their
   KV blocks cannot be allocated, the most recently admitted running request is preempted
   (blocks freed, progress reset to 0, put at the front of the waiting queue), until the
   allocation succeeds or the request itself was the victim (then the running pass stops).
3. Only if nothing was preempted, waiting requests are admitted in FCFS order until the budget
   is spent, ``max_num_seqs`` run, or the head request cannot be admitted (no skipping ahead).
   A new or preempted request first adopts its prefix-cache hit. With chunked prefill off, a
   prompt that does not fit the remaining budget stops admission.
4. Progress is counted when scheduled. A request whose computed tokens reach its length after
   the step samples a token (so only a prompt's last chunk produces the first token); it
   finishes at ``max_tokens`` (or ``max_model_len``) and frees its blocks before the next step.

With ``async_scheduling`` (vLLM's ``AsyncScheduler``, ``vllm/v1/core/sched/async_scheduler.py``)
the engine schedules step k+1 before step k's output is applied, so:

5. A step that will sample a request's token leaves a *placeholder*: the next step already
   feeds that (unknown) token, and a request whose steps in flight will complete it is not
   scheduled again. Its output, when applied, replaces the placeholder.
6. A request finishes, and frees its running slot and KV blocks, only when the step that
   sampled its last token is applied: after the next step was scheduled.
7. A preempted request's steps in flight still deliver their tokens (they are *stale*: they
   move no counters), and it is not resumed until they have (later waiting requests are
   admitted past it meanwhile). Full blocks are cached when scheduled only up to the tokens
   known, and the rest when the output arrives.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.kv_cache import KVCache
from prefill_tuner.engines.sim.request import SimRequest, Status


@dataclass(slots=True)
class StepPlan:
    """What one ``schedule()`` call decided."""

    scheduled: list[tuple[SimRequest, int]] = field(default_factory=list)
    """(request, tokens) in scheduling order: running requests first, then admissions."""
    samples: list[bool] = field(default_factory=list)
    """Per scheduled request: the step samples a token for it (its prefill is complete)."""
    decodes: int = 0
    """Scheduled requests decoding: one token, sampled, after the prompt."""
    decode_context: int = 0
    """Their contexts' sum (computed tokens before the step, plus the new one)."""
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    """Every other scheduled request's ``(tokens computed before, tokens)``, in order."""
    preempted: list[SimRequest] = field(default_factory=list)
    admitted: dict[str, int] = field(default_factory=dict)
    """Requests admitted from the waiting queue → tokens already computed (prefix hit)."""


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


_FEW_FINISHED = 8
"""Up to this many requests finishing in a step leave the running list one ``remove`` at a
time; more, in one pass over it."""


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


class Scheduler:
    """The waiting queue, the running list and the KV cache, stepped like vLLM's scheduler."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.kv = KVCache(
            config.num_gpu_blocks,
            config.block_size,
            enable_caching=config.enable_prefix_caching,
            watermark=config.watermark,
            max_model_len=config.max_model_len,
        )
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix_queries = 0
        """Prompt tokens of requests admitted for the first time (vLLM's counter also counts
        every repeated lookup of a request that waits, and resumed requests)."""
        self.prefix_hits = 0
        """Of those, tokens served by the prefix cache."""
        self.num_stale = 0
        """Preempted requests whose stale output is still in flight (async scheduling)."""
        self.retired: list[SimRequest] | None = None
        """When a list: every request that finishes is appended to it (a router in front of
        replicas reads them; see ``replicas.py``)."""
        self.track_positions = False
        """Whether a fast-forwarded run notes where each request that finishes in it stands
        among its last step's outputs (``SimRequest.last_position``; a step applied alone
        always notes it): read only when the API server's time per output is known
        (:mod:`.request_path`)."""
        self.peak_running = 0
        """The most requests running at once: while it stays below ``max_num_seqs``, that
        limit has refused no admission (it is read nowhere else), so any larger limit than
        this gives the same run."""

    def add_request(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        """Decide this step's tokens per request (vLLM's ``schedule()``)."""
        config, kv, running, waiting = self.config, self.kv, self.running, self.waiting
        plan = StepPlan()
        budget = config.max_num_batched_tokens
        eligible = len(running) + len(waiting)
        threshold = config.long_prefill_token_threshold if eligible > 1 else 0
        if threshold > 0 and config.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, config.max_num_batched_tokens // eligible)
        max_model_len = config.max_model_len

        block_size, caching = config.block_size, kv.enable_caching
        asynchronous = config.async_scheduling
        add_scheduled, add_sample = plan.scheduled.append, plan.samples.append
        decodes = decode_context = 0
        for request in running:  # (a preemption pops the list's tail: the loop stops sooner)
            if budget <= 0:
                break
            computed = request.num_computed
            placeholders = request.placeholders
            if placeholders and computed + 2 - placeholders >= request.prompt + request.max_tokens:
                continue  # async: the steps in flight sample its last token
            num_new = request.num_tokens + placeholders - computed
            if (
                num_new == 1
                and computed < len(request.blocks) * block_size
                and computed + 2 <= max_model_len
            ):
                # Fast path for the common decode: its slot is already allocated, so vLLM's
                # allocate_slots can only succeed and at most register a just-filled block
                # (up to the tokens known: ``num_tokens``, placeholders excluded).
                if caching and request.num_tokens // block_size > request.num_cached_blocks:
                    kv.cache_full_blocks(request, request.num_tokens)
                # (:meth:`_count_scheduled`, inlined: this token completes what it knows,
                # so it samples.)
                request.num_computed = computed + 1
                if asynchronous:
                    request.in_flight += 1
                    request.placeholders = placeholders + 1
                add_scheduled((request, 1))
                add_sample(True)
                if computed >= request.prompt:
                    decodes += 1
                    decode_context += computed + 1
                else:
                    plan.prefill_chunks.append((computed, 1))
                budget -= 1
                continue
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget, max_model_len - request.num_computed - 1)
            if num_new <= 0:
                continue
            allocated = True
            while not kv.allocate_slots(request, num_new):
                victim = running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is request:
                    allocated = False
                    break
            if not allocated:
                break
            self._count_scheduled(plan, request, num_new)
            budget -= num_new

        if not plan.preempted:
            skipped: list[SimRequest] = []
            while budget > 0 and waiting and len(running) < config.max_num_seqs:
                request = waiting[0]
                if request.stale:
                    # Async: output of a step it ran before its preemption is still to come.
                    skipped.append(waiting.popleft())
                    continue
                hit_blocks = (
                    kv.computed_blocks(request) if request.num_computed == 0 and caching else []
                )
                num_computed = request.num_computed + len(hit_blocks) * config.block_size
                num_new = request.num_tokens - num_computed
                if 0 < threshold < num_new:
                    num_new = threshold
                if not config.enable_chunked_prefill and num_new > budget:
                    break
                num_new = min(num_new, budget)
                if not kv.allocate_slots(
                    request,
                    num_new,
                    hit_blocks,
                    full_sequence_must_fit=config.scheduler_reserve_full_isl,
                    has_scheduled_reqs=bool(running),
                ):
                    break
                waiting.popleft()
                running.append(request)
                request.status = Status.RUNNING
                request.num_computed = num_computed
                plan.admitted[request.id] = num_computed
                if caching and not request.preemptions:
                    self.prefix_queries += request.num_tokens
                    self.prefix_hits += num_computed
                self._count_scheduled(plan, request, num_new)
                budget -= num_new
            if skipped:
                waiting.extendleft(reversed(skipped))  # back at the front, in order
            if len(running) > self.peak_running:  # (only admissions add to it)
                self.peak_running = len(running)

        plan.decodes += decodes
        plan.decode_context += decode_context
        return plan

    def _count_scheduled(self, plan: StepPlan, request: SimRequest, num_new: int) -> None:
        """Give ``request`` ``num_new`` tokens in ``plan``: progress is counted when
        scheduled (nothing later in ``schedule()`` reads a scheduled request's progress); it
        samples if that completes what it knows (async: a placeholder for the token)."""
        before = request.num_computed
        request.num_computed = computed = before + num_new
        if self.config.async_scheduling:
            request.in_flight += num_new
            sample = computed >= request.num_tokens + request.placeholders
            if sample:
                request.placeholders += 1
        else:
            sample = computed >= request.num_tokens
        plan.scheduled.append((request, num_new))
        plan.samples.append(sample)
        if num_new == 1 and sample and before >= request.prompt:
            plan.decodes += 1
            plan.decode_context += before + 1
        else:
            plan.prefill_chunks.append((before, num_new))

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
        if running >= config.max_num_seqs or budget <= 0:
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

    def _preempt(self, request: SimRequest) -> None:
        """Recompute preemption: free everything, restart from the front of the queue. Under
        async scheduling its tokens in flight become stale (vLLM's ``_preempt_request``)."""
        self.kv.free(request, resumable=True)
        request.status = Status.PREEMPTED
        request.num_computed = 0
        request.preemptions += 1
        if request.in_flight:
            if not request.stale:
                self.num_stale += 1
            request.stale = request.in_flight
        request.placeholders = 0
        self.waiting.appendleft(request)

    def finish_step(self, plan: StepPlan, end_s: float) -> list[SimRequest]:
        """Apply the step's outputs at ``end_s`` (vLLM's ``update_from_output``): a sampled
        token for every request whose prefill was complete when scheduled; finished requests
        free their blocks. Returns the finished requests."""
        finished: list[SimRequest] = []
        max_model_len = self.config.max_model_len
        position = 0  # of the step's outputs (a request with a new token has one), in order
        if not self.config.async_scheduling:
            for (request, _), sample in zip(plan.scheduled, plan.samples, strict=True):
                if sample:
                    request.num_output += 1  # (num_tokens counts the output too)
                    request.num_tokens += 1
                    request.token_times.append(end_s)
                    if request.num_output == 1:
                        request.first_position = position
                    if (
                        request.num_output >= request.max_tokens
                        or request.num_tokens >= max_model_len
                    ):
                        request.last_position = position
                        finished.append(request)
                    position += 1
            if finished:
                self._retire(finished)
            return finished
        caching, size = self.kv.enable_caching, self.config.block_size
        done, running = Status.FINISHED, Status.RUNNING
        for (request, num_new), sample in zip(plan.scheduled, plan.samples, strict=True):
            if request.status is done:
                continue
            request.in_flight -= num_new
            stale = request.stale
            if stale:
                request.stale = stale - num_new
                if stale == num_new:
                    self.num_stale -= 1
            if not sample:
                continue
            request.num_output += 1  # a stale token is delivered all the same
            request.num_tokens += 1
            request.token_times.append(end_s)
            if request.num_output == 1:
                request.first_position = position
            position += 1
            if not stale:
                request.placeholders -= 1
            if (
                caching
                and (known := request.num_computed - request.placeholders) // size
                > request.num_cached_blocks
                and request.status is running
            ):
                self.kv.cache_full_blocks(request, known)
            if request.num_output >= request.max_tokens or request.num_tokens >= max_model_len:
                request.last_position = position - 1
                finished.append(request)
        if finished:
            self._retire(finished)
        return finished

    def _retire(self, finished: list[SimRequest]) -> None:
        """Remove finished requests from the running list (or, a preempted one whose stale
        output finished it, from the waiting queue) and free their blocks, in order."""
        if self.retired is not None:
            self.retired += finished
        running = self.running
        if len(finished) <= _FEW_FINISHED:  # (remove() compares by identity first: C speed)
            for request in finished:
                if request.status is Status.RUNNING:
                    running.remove(request)
        else:
            done = {id(request) for request in finished}
            self.running = [r for r in running if id(r) not in done]
        if any(request.status is not Status.RUNNING for request in finished):
            done = {id(request) for request in finished}
            self.waiting = deque(r for r in self.waiting if id(r) not in done)
        for request in finished:
            request.status = Status.FINISHED
            self.kv.free(request)
