"""Rule-derived first trials: after the engine's defaults, a latency study runs a few settings
that simple rules derive from the trace and the TPOT SLO, before the sampler takes over.

The rules (issue 17, measured in ``benchmarks/search_efficiency.py``): by Little's law, the
decode batch the trace keeps running at the TPOT limit is its output tokens per second × the
limit's seconds per token. Then

1. a token budget just above that batch (the smallest power of two ≥ batch + 128): each step
   stays small, so TPOT is low, while prompts are still prefilled in chunks;
2. the same budget with each prompt's share of a step capped
   (``long_prefill_token_threshold``: the largest power of two ≤ budget − batch), so the
   decodes keep their room when several prompts arrive together;
3. a budget with room for prefills (the smallest power of two ≥ batch + 2,048): low TTFT;
4. the budget axis between the first and the third, a power of two apart (issue 46): where the
   SLOs are met only in a narrow band of budgets (a tight TPOT SLO on a busy trace: 446 to
   1,024 tokens on the Azure conversation slice at 2.5× its rate), the sampler starts from a
   trial in or beside the band instead of settling on a far corner of the space.

All three run chunked prefill and let up to 4 × the batch run at once, and never fewer than the
trace's bursts bring in flight (:func:`burst_batch`: the most requests decoding at once when
each streams at the TPOT limit from its arrival; a bursty trace's average batch is far below its
bursts', and a ``max_num_seqs`` sized on the average keeps a burst waiting for slots, which
missed p99 TTFT on a bursty short-output trace); a budget below that many is raised to it
(vLLM's rule: ``max_num_batched_tokens`` ≥ ``max_num_seqs``). The sampler then models them with
the rest; TPE's random start-up trials follow as before. The settings are clipped to the
searched ranges; a rule whose knobs are not searched, or which repeats an earlier trial, is
left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import KnobRange
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.trace.stats import peak_in_flight, trace_stats

TOKENS, SEQS = "max_num_batched_tokens", "max_num_seqs"
THRESHOLD, CHUNKED = "long_prefill_token_threshold", "enable_chunked_prefill"
SMALL_STEP_ROOM = 128
"""Tokens above the decode batch in the small budget (rule 1)."""
PREFILL_ROOM = 2048
"""Tokens above the decode batch in the prefill budget (rule 3)."""
RUNNING_FACTOR = 4
"""Requests allowed to run at once, as a multiple of the decode batch."""
RULE_ATTR = "rule"
"""User attribute of a rule-derived trial: its rule, in words."""
BUDGET_SWEEP = True
"""Rule 4 on (``benchmarks/search_efficiency.py`` turns it off to measure what it buys)."""


@dataclass(frozen=True)
class RuleTrial:
    """One rule-derived trial."""

    rule: str
    """Which rule, in words (stored as the trial's ``rule`` user attribute)."""
    settings: dict[str, Any]
    """Every searched knob's setting (the engine's defaults for those the rule leaves)."""


def decode_batch(plan: StudyPlan) -> float | None:
    """Requests decoding at once at the tightest TPOT limit (Little's law); ``None`` without a
    TPOT SLO or without requests. A class's TPOT limit counts too: its streams decode in the
    same batches as everyone's, so the batch must be as fast as the tightest promise. A client
    limit (closed-loop load) caps it: no more requests are in flight than it allows."""
    limits = [slo.limit_s for slo in plan.slos if slo.metric == "tpot"]
    if not limits or not plan.trace.requests:
        return None
    batch = max(1.0, trace_stats(plan.trace).output_tokens_per_s * min(limits))
    client = plan.shaping.max_concurrency
    return batch if client is None else min(batch, float(client))


def burst_batch(plan: StudyPlan) -> int | None:
    """Requests in flight at the trace's busiest moment when each streams its output at the
    tightest TPOT limit from its arrival (:func:`~prefill_tuner.trace.stats.peak_in_flight`):
    the ``max_num_seqs`` below which a burst waits for slots. ``None`` without a TPOT SLO or
    without requests; a client limit (closed-loop load) caps it."""
    limits = [slo.limit_s for slo in plan.slos if slo.metric == "tpot"]
    if not limits or not plan.trace.requests:
        return None
    peak = peak_in_flight(plan.trace, min(limits))
    client = plan.shaping.max_concurrency
    return peak if client is None else min(peak, client)


def rule_trials(plan: StudyPlan, defaults: dict[str, Any], max_model_len: int) -> list[RuleTrial]:
    """The rule-derived settings for this plan (empty for a capacity study, without a TPOT SLO,
    or when ``max_num_batched_tokens`` is not searched). ``defaults``: the engine's defaults,
    for the knobs the rules leave; trials repeating the defaults or each other are left out."""
    ranges = plan.space.ranges
    batch = decode_batch(plan)
    if plan.objective_mode != "latency" or batch is None or TOKENS not in ranges:
        return []

    running = max(RUNNING_FACTOR * batch, float(burst_batch(plan) or 0))
    seqs = _pow2_at_least(running, ranges[SEQS]) if SEQS in ranges else None

    def settings(budget: int, threshold: int = 0) -> dict[str, Any]:
        chosen = {name: defaults[name] for name in ranges if name in defaults}
        if seqs is not None:  # room to run a burst's requests at once
            budget = min(max(budget, seqs), ranges[TOKENS].high)
            chosen[SEQS] = min(seqs, budget)
        chosen[TOKENS] = budget
        if CHUNKED in ranges:
            chosen[CHUNKED] = True
        if THRESHOLD in ranges:
            chosen[THRESHOLD] = threshold
        return chosen

    small = _pow2_at_least(batch + SMALL_STEP_ROOM, ranges[TOKENS])
    cap = 2 ** math.floor(math.log2(max(small - batch, 1.0)))
    candidates = [
        RuleTrial("a token budget just above the decode batch", settings(small)),
        RuleTrial(
            "that budget, each prompt's share capped to what the decodes leave",
            settings(small, cap),
        ),
        RuleTrial(
            "room for prefills above the decode batch",
            settings(_pow2_at_least(batch + PREFILL_ROOM, ranges[TOKENS])),
        ),
    ]
    roomy = _pow2_at_least(batch + PREFILL_ROOM, ranges[TOKENS])
    budget = small * 2
    while BUDGET_SWEEP and budget < roomy:
        candidates.append(RuleTrial("the budget axis between them", settings(budget)))
        budget *= 2
    if not all(name in candidate.settings for candidate in candidates for name in ranges):
        return []  # an engine without a default for some searched knob
    seen = [_effective(plan, defaults, max_model_len)]
    result = []
    for candidate in candidates:
        effective = _effective(plan, candidate.settings, max_model_len)
        if effective not in seen:
            seen.append(effective)
            result.append(candidate)
    return result


def _effective(plan: StudyPlan, settings: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """The settings a trial enqueued with these settings would run."""
    sampled = plan.space.settings_from_params(plan.space.params_for(settings))
    return effective_settings(sampled, plan.space.fixed, max_model_len)[0]


def _pow2_at_least(value: float, knob: KnobRange) -> int:
    """The smallest power of two ≥ value, within the knob's range."""
    return min(max(2 ** math.ceil(math.log2(max(value, 1.0))), knob.low), knob.high)
