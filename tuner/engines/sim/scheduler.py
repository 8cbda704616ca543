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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tuner.engines.sim.config import SimConfig
from tuner.engines.sim.kv_cache import KVCache
from tuner.engines.sim.request import SimRequest, Status


@dataclass(slots=True)
class StepPlan:
    """What one ``schedule()`` call decided."""

    scheduled: list[tuple[SimRequest, int]] = field(default_factory=list)
    """(request, tokens) in scheduling order: running requests first, then admissions."""
    preempted: list[SimRequest] = field(default_factory=list)
    admitted: dict[str, int] = field(default_factory=dict)
    """Requests admitted from the waiting queue → tokens already computed (prefix hit)."""


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
        """Tokens looked up in the prefix cache (vLLM's ``prefix_cache_queries``)."""
        self.prefix_hits = 0
        """Of those, tokens found (vLLM's ``prefix_cache_hits``)."""

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

        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            num_new = request.num_tokens - request.num_computed
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget, max_model_len - request.num_computed - 1)
            if num_new <= 0:
                index += 1
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
            plan.scheduled.append((request, num_new))
            budget -= num_new
            index += 1

        if not plan.preempted:
            while budget > 0 and waiting and len(running) < config.max_num_seqs:
                request = waiting[0]
                hit_blocks: list[int] = []
                if request.num_computed == 0 and kv.enable_caching:
                    hit_blocks = kv.computed_blocks(request)
                    self.prefix_queries += request.num_tokens
                    self.prefix_hits += len(hit_blocks) * config.block_size
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
                plan.scheduled.append((request, num_new))
                budget -= num_new

        for request, num_new in plan.scheduled:
            request.num_computed += num_new
        return plan

    def _preempt(self, request: SimRequest) -> None:
        """Recompute preemption: free everything, restart from the front of the queue."""
        self.kv.free(request)
        request.status = Status.PREEMPTED
        request.num_computed = 0
        request.preemptions += 1
        self.waiting.appendleft(request)

    def finish_step(self, plan: StepPlan, end_s: float) -> list[SimRequest]:
        """Apply the step's outputs at ``end_s`` (vLLM's ``update_from_output``): a sampled
        token for every request whose prefill is complete; finished requests free their
        blocks. Returns the finished requests."""
        finished: list[SimRequest] = []
        max_model_len = self.config.max_model_len
        for request, _ in plan.scheduled:
            if request.status is not Status.RUNNING or request.num_computed < request.num_tokens:
                continue  # preempted later in the same step, or a partial prefill chunk
            request.num_output += 1
            request.token_times.append(end_s)
            if request.num_output >= request.max_tokens or request.num_tokens >= max_model_len:
                request.status = Status.FINISHED
                finished.append(request)
        if finished:
            done = {id(request) for request in finished}
            self.running = [r for r in self.running if id(r) not in done]
            for request in finished:
                self.kv.free(request)
        return finished
