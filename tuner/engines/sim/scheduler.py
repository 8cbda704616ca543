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
   is spent, ``max_num_seqs`` run (``max_num_active_seqs`` when set: vLLM 0.32's admission
   limit, which leaves the runner's slots alone), or the head request cannot be admitted (no
   skipping ahead).
   A new or preempted request first adopts its prefix-cache hit. With chunked prefill off, a
   prompt that does not fit the remaining budget stops admission.
4. vLLM 0.33's prefill cadence (``prefill_schedule_interval`` N > 1): while fewer than N
   executed steps have passed since the last that carried a prefill (an admission with more
   than one token to compute, or a chunk of a prompt a request had started), somebody decodes,
   and the last step that could prefill drained the waiting queue, a step is *held*: running
   requests still prefilling are passed over, and admission stops at the first request with
   more than one token to compute. A fast-forwarded run (decodes alone, nobody waiting) counts
   its steps and clears the capacity escape as stepping would.
5. Progress is counted when scheduled. A request whose computed tokens reach its length after
   the step samples a token (so only a prompt's last chunk produces the first token); it
   finishes at ``max_tokens`` (or ``max_model_len``) and frees its blocks before the next step.

With ``async_scheduling`` (vLLM's ``AsyncScheduler``, ``vllm/v1/core/sched/async_scheduler.py``)
the engine schedules step k+1 before step k's output is applied, so:

6. A step that will sample a request's token leaves a *placeholder*: the next step already
   feeds that (unknown) token, and a request whose steps in flight will complete it is not
   scheduled again. Its output, when applied, replaces the placeholder.
7. A request finishes, and frees its running slot and KV blocks, only when the step that
   sampled its last token is applied: after the next step was scheduled.
8. A preempted request's steps in flight still deliver their tokens (they are *stale*: they
   move no counters), and it is not resumed until they have (later waiting requests are
   admitted past it meanwhile). Full blocks are cached when scheduled only up to the tokens
   known, and the rest when the output arrives.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.kv_cache import KVCache
from prefill_tuner.engines.sim.request import SimRequest, Status
from prefill_tuner.engines.sim.steady_runs import Scheduled, SteadyRun, SteadyRuns

__all__ = ["Scheduled", "Scheduler", "SteadyRun", "StepPlan"]


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


_FEW_FINISHED = 8
"""Up to this many requests finishing in a step leave the running list one ``remove`` at a
time; more, in one pass over it."""


class Scheduler(SteadyRuns):
    """The waiting queue, the running list and the KV cache, stepped like vLLM's scheduler."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.admission_limit = min(
            config.max_num_seqs, config.max_num_active_seqs or config.max_num_seqs
        )
        """The most requests admitted to run: ``max_num_seqs``, or ``max_num_active_seqs``
        when set (vLLM's ``max_num_active_reqs``)."""
        self.cadence = config.prefill_schedule_interval
        """vLLM 0.33's prefill cadence (``prefill_schedule_interval``; 1: none). Under it:"""
        self.executed_steps = 0
        """Steps that scheduled tokens (vLLM's ``num_executed_steps``)."""
        self.last_prefill_step = -self.cadence
        """The last of them that carried a prefill (a full interval back: the first step is
        never held)."""
        self.capacity_bound = False
        """The last step that could prefill left requests waiting: holding stops until one
        drains the queue (vLLM's ``prefill_capacity_bound``, PR #44558's escape)."""
        self.deferred: set[SimRequest] = set()
        """Waiting requests a step passed over (vLLM's ``deferred_waiting``: async, those
        whose stale output is in flight), until admitted."""
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
        """The most requests running at once: while it stays below the admission limit
        (``max_num_seqs`` or ``max_num_active_seqs``), that limit has refused no admission (it
        is read nowhere else), so any larger limit than this gives the same run."""

    def add_request(self, request: SimRequest) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        """Decide this step's tokens per request (vLLM's ``schedule()``).

        One function, as vLLM's is: its two passes (running requests, then waiting ones, under
        one budget that both spend) read top to bottom beside ``vllm/v1/core/sched/
        scheduler.py``'s, which is how the mirror is checked by a reader; split, the shared
        budget and free-block state would have to travel between the halves."""
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
        # vLLM 0.33's cadence: hold prefill (admissions and started prompts' chunks) while
        # less than an interval has passed since the last step that carried one, somebody
        # decodes, and the last step that could prefill drained the waiting queue.
        hold = (
            self.cadence > 1
            and not self.capacity_bound
            and (self.executed_steps + 1) - self.last_prefill_step < self.cadence
            and any(not r.is_prefill_chunk for r in running)
        )
        admitted_prefill = False
        for request in running:  # (a preemption pops the list's tail: the loop stops sooner)
            if budget <= 0:
                break
            computed = request.num_computed
            placeholders = request.placeholders
            if placeholders and computed + 2 - placeholders >= request.prompt + request.max_tokens:
                continue  # async: the steps in flight sample its last token
            if hold and request.is_prefill_chunk:
                continue
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
            while budget > 0 and waiting and len(running) < self.admission_limit:
                request = waiting[0]
                if request.stale:
                    # Async: output of a step it ran before its preemption is still to come.
                    skipped.append(waiting.popleft())
                    if self.cadence > 1:
                        self.deferred.add(request)
                    continue
                hit_blocks = (
                    kv.computed_blocks(request) if request.num_computed == 0 and caching else []
                )
                num_computed = request.num_computed + len(hit_blocks) * config.block_size
                if hold and num_computed < request.num_tokens - 1:
                    break  # the cadence holds a prompt with more than one token to compute
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
                if self.cadence > 1:
                    self.deferred.discard(request)
                    admitted_prefill |= num_computed < request.num_tokens - 1
                if caching and not request.preemptions:
                    self.prefix_queries += request.num_tokens
                    self.prefix_hits += num_computed
                self._count_scheduled(plan, request, num_new)
                budget -= num_new
            if skipped:
                waiting.extendleft(reversed(skipped))  # back at the front, in order
            if len(running) > self.peak_running:  # (only admissions add to it)
                self.peak_running = len(running)
            if self.cadence > 1 and not hold:
                self.capacity_bound = len(waiting) > len(self.deferred)

        plan.decodes += decodes
        plan.decode_context += decode_context
        if self.cadence > 1 and plan.scheduled:
            self._count_cadence(plan, admitted_prefill)
        return plan

    def _count_cadence(self, plan: StepPlan, admitted_prefill: bool) -> None:
        """After a step that scheduled tokens, under a cadence: count it, restart the interval
        if it carried a prefill (a started prompt's chunk, or an admission with more than one
        token to compute), and mark who is still prefilling (vLLM's ``is_prefill_chunk``:
        each scheduled request that did not sample)."""
        self.executed_steps += 1
        admitted = plan.admitted
        carried = admitted_prefill or any(
            request.is_prefill_chunk for request, _ in plan.scheduled if request.id not in admitted
        )
        if carried:
            self.last_prefill_step = self.executed_steps
        for (request, _), sample in zip(plan.scheduled, plan.samples, strict=True):
            request.is_prefill_chunk = not sample

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
