"""The symptom table of chunked-prefill tuning, as detectors: each reads a :class:`RunView`
and returns a :class:`Finding` (the symptom, its evidence in numbers, steps and requests, and
the knob to move) or ``None``. Thresholds are named here, each with why.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from prefill_tuner.diagnosis.view import Measured, RunView, StepView
from prefill_tuner.objectives.slo import METRICS, format_seconds

SPIKE_RATIO = 3.0
"""A step this many times the median step is a stall every streaming request sees as one long
inter-token gap (a decode step's cost barely varies; three times it is never noise)."""
MIN_SPIKES = 3
"""Fewer spikes than this in a run are incidents, not a pattern worth a knob."""
LARGE_PREFILL_TOKENS = 1024
"""A slow step prefilling at least this many tokens is blamed on prefill; below it, a step
costs a few decode steps at most, which is chunking doing its job, not a knob to move."""
SPIKES_FROM_PREFILL = 0.5
"""Spikes are blamed on prefill when at least this share of them are prefill steps."""
STALLED_DECODES = 1
"""A slow step is a spike only when at least this many streams decoded in it: they are the
users who waited through it. A long prompt prefilled while nothing else runs is slow and
harms nobody (no inter-token gap grows), so it is no reason to move a knob."""

LONG_PROMPT = 1024
"""Prompts at least this long are the ones chunking splits over several steps."""
TINY_CHUNK = 0.1
"""A prompt prefilled by chunks averaging under this share of the budget is starved: decodes
(or other prompts) take the rest of every step."""
SMALL_CHUNK_TOKENS = 256
"""...or by chunks averaging under this many tokens, whatever the budget: so little prefill
per step that the per-step overhead dominates and its first token waits many steps (the
budget, or the long-prompt threshold, is too small)."""
MANY_CHUNKS = 8
"""...and over at least this many steps (two or three chunks are chunking doing its job)."""
STARVED_SHARE = 0.1
"""Starvation is a finding when at least this share of the long prompts starve, or of the
steps leave requests waiting with the budget full of decodes."""
DECODE_FULL = 0.9
"""A step whose decode tokens fill this share of the budget leaves no room for prefill."""

MIN_PREEMPTIONS = 3
"""Fewer preemptions than this in a run are incidents (one burst), not a setting's fault."""
MODERATE_KV = 0.8
"""Average KV use under this is moderate: preemptions then come from bursts and admissions
that did not reserve room, not from a pool that is simply too small."""

STALL_SHARE = 0.1
"""Admission stalls are a finding when requests wait in at least this share of the steps
while the running set is held at its cap (or below it, by reserve-full-ISL)."""
HEAD_OF_LINE_ROOM = 0.5
"""With requests waiting, a step that used under this share of the budget and of the KV pool
had room to admit more: something else held the queue's head."""

FRAGMENT = 0.25
"""A step under this share of the budget is a small step: it pays the fixed per-step overhead
for little work."""
FRAGMENTED_SHARE = 0.2
"""Fragmentation is a finding when at least this share of the steps are small while requests
wait."""


@dataclass(frozen=True)
class Finding:
    symptom: str
    summary: str
    """One line: what happened, in numbers."""
    evidence: tuple[str, ...]
    """The steps, requests and numbers that show it."""
    knob: str
    """What to move, and which way."""
    severity: float
    """Share of the run affected (of its steps, its engine time or its long prompts, as the
    detector says): findings are ranked by it."""
    metrics: tuple[str, ...] = ()
    """The latency metrics the symptom shows in (``tpot``, ``itl``, ``ttft``, ``e2el``): the
    study's SLOs on them are what the finding is judged against."""
    judged: str | None = None
    """The SLOs it was judged against and how they fared (``None``: the run has no SLOs)."""
    within_slo: bool = False
    """Every SLO on the symptom's metrics holds: no action needed (ranked after the rest)."""

    def line(self) -> str:
        return f"{self.symptom}: {self.summary}; {self.knob}"


def _median_step(view: RunView) -> float:
    durations = [s.duration_s for s in view.steps if s.duration_s > 0]
    return statistics.median(durations) if durations else 0.0


def _at(step: StepView) -> str:
    when = f" at {step.start_s:.3f} s" if step.start_s is not None else ""
    return f"step {step.index}{when}"


def spikes(view: RunView) -> Finding | None:
    """Periodic TPOT/ITL spikes: steps far slower than the median, carrying large prefills and
    decoding streams (the streams are the ones who wait through each such step)."""
    median = _median_step(view)
    if median <= 0:
        return None
    slow = [s for s in view.steps if s.duration_s >= SPIKE_RATIO * median]
    # A slow step with no stream decoding in it stalls nobody's tokens.
    stalls = [s for s in slow if s.decode_tokens >= STALLED_DECODES]
    if len(stalls) < MIN_SPIKES:
        return None
    heavy = [s for s in stalls if s.prefill_tokens >= LARGE_PREFILL_TOKENS]
    if len(heavy) < max(MIN_SPIKES, SPIKES_FROM_PREFILL * len(stalls)):
        return None
    several = [s for s in heavy if s.prefill_chunks is not None and len(s.prefill_chunks) >= 2]
    worst = max(stalls, key=lambda s: s.duration_s)
    alone = len(slow) - len(stalls)
    threshold = int(view.settings.get("long_prefill_token_threshold") or 0)
    return Finding(
        symptom="periodic TPOT/ITL spikes",
        summary=(
            f"{len(stalls)} of {len(view.steps)} steps took ≥ {SPIKE_RATIO:g}× the median step "
            f"({median * 1000:.1f} ms) while streams decoded in them, up to "
            f"{worst.duration_s * 1000:.1f} ms ({worst.decode_tokens} "
            f"stream{'s' * (worst.decode_tokens != 1)} waiting); {len(heavy)} of them "
            f"prefilled ≥ {LARGE_PREFILL_TOKENS} tokens"
            + (f", {len(several)} of those for several prompts at once" if several else "")
            + (
                f" ({alone} more slow step{'s' * (alone != 1)} had no stream decoding: "
                "nobody waited)"
                if alone
                else ""
            )
        ),
        evidence=tuple(
            f"{_at(s)}: {s.duration_s * 1000:.1f} ms, {s.prefill_tokens} prefill + "
            f"{s.decode_tokens} decode tokens"
            + (
                f", {len(s.prefill_chunks)} prompt{'s' * (len(s.prefill_chunks) > 1)}"
                if s.prefill_chunks
                else ""
            )
            for s in sorted(stalls, key=lambda s: -s.duration_s)[:5]
        ),
        knob=(
            f"lower max_num_batched_tokens (now {view.budget}) so a step's prefill is "
            "bounded, or "
            + (
                f"lower long_prefill_token_threshold (now {threshold})"
                if threshold
                else "set long_prefill_token_threshold (off now)"
            )
            + " to cap each long prompt's chunk"
        ),
        # Share of the engine's time spent in these steps (a spike is rare by steps, not by
        # the time every stream waits through it).
        severity=sum(s.duration_s for s in stalls) / sum(s.duration_s for s in view.steps),
        metrics=("tpot", "itl"),
    )


def starvation(view: RunView) -> Finding | None:
    """TTFT collapse: long prompts prefilled by tiny chunks over many steps, or requests
    waiting while decodes fill the budget."""
    chunks: dict[str, list[int]] = {}
    for step in view.steps:
        for rid, tokens in (step.prefill_chunks or {}).items():
            chunks.setdefault(rid, []).append(tokens)
    prompts = {r.id: r.prompt_tokens for r in view.requests}
    long_prompts = [rid for rid, n in prompts.items() if n >= LONG_PROMPT and rid in chunks]
    starved = [
        rid
        for rid in long_prompts
        if len(chunks[rid]) >= MANY_CHUNKS
        and (
            statistics.mean(chunks[rid]) < TINY_CHUNK * view.budget
            or statistics.mean(chunks[rid]) < SMALL_CHUNK_TOKENS
        )
    ]
    full = [s for s in view.steps if s.waiting and s.decode_tokens >= DECODE_FULL * view.budget]
    starved_share = len(starved) / len(long_prompts) if long_prompts else 0.0
    full_share = len(full) / len(view.steps) if view.steps else 0.0
    if starved_share < STARVED_SHARE and full_share < STARVED_SHARE:
        return None
    peak_decodes = max((s.decode_tokens for s in view.steps), default=0)
    ttft = {r.id: r.ttft_s for r in view.requests}
    evidence = [
        f"request {rid}: {prompts[rid]} prompt tokens over {len(chunks[rid])} steps, "
        f"chunks of {statistics.mean(chunks[rid]):.0f} tokens on average"
        + (f", TTFT {ttft[rid]:.2f} s" if ttft.get(rid) is not None else "")
        for rid in sorted(starved, key=lambda r: -len(chunks[r]))[:5]
    ]
    evidence += [
        f"{_at(s)}: {s.decode_tokens} decode tokens of a {view.budget} budget, {s.waiting} waiting"
        for s in full[:3]
    ]
    threshold = int(view.settings.get("long_prefill_token_threshold") or 0)
    sizes = [statistics.mean(chunks[rid]) for rid in starved]
    if threshold and sizes and statistics.median(sizes) >= 0.9 * threshold:
        knob = (
            f"raise long_prefill_token_threshold (now {threshold}): it cuts each long prompt "
            "into chunks this small"
        )
    else:
        knob = (
            f"raise max_num_batched_tokens (now {view.budget}) well above the decode "
            f"population (peak {peak_decodes} decodes in a step), or lower max_num_seqs "
            f"(now {view.max_num_seqs})"
        )
    return Finding(
        symptom="TTFT collapse (prefill starvation)",
        summary="; ".join(
            part
            for part in (
                f"{len(starved)} of {len(long_prompts)} long prompts (≥ {LONG_PROMPT} tokens) "
                f"were prefilled over ≥ {MANY_CHUNKS} steps in chunks under "
                f"{TINY_CHUNK:.0%} of the budget or {SMALL_CHUNK_TOKENS} tokens"
                if starved
                else "",
                f"in {len(full)} steps requests waited while decodes filled ≥ "
                f"{DECODE_FULL:.0%} of the budget (peak {peak_decodes} decode tokens)"
                if full
                else "",
            )
            if part
        ),
        evidence=tuple(evidence),
        knob=knob,
        severity=max(starved_share, full_share),
        metrics=("ttft", "e2el"),
    )


def kv_thrashing(view: RunView) -> Finding | None:
    """KV thrashing: preemptions, whose requests lose their KV and recompute it. At moderate
    average use they come from bursts and from admissions that did not reserve their full
    length; at high use, from a pool too small for the concurrency."""
    preempting = [s for s in view.steps if s.preempted]
    preemptions = sum(len(s.preempted) for s in preempting)
    if preemptions < MIN_PREEMPTIONS:
        return None
    usage = [s.kv_usage for s in view.steps if s.kv_usage is not None]
    mean_usage = statistics.mean(usage) if usage else None
    reserve = bool(view.settings.get("scheduler_reserve_full_isl"))
    moderate = mean_usage is not None and mean_usage < MODERATE_KV
    if moderate and not reserve:
        knob = (
            "turn scheduler_reserve_full_isl on, so a prompt is admitted only when its full "
            "length fits"
        )
    else:
        knob = (
            f"lower max_num_seqs (now {view.max_num_seqs}) so fewer requests share the pool, "
            "or give the pool more KV memory"
        )
    used = (
        f"the KV pool {mean_usage:.0%} used on average (peak {max(usage):.0%})"
        if mean_usage is not None
        else "KV use not logged"
    )
    return Finding(
        symptom="KV thrashing",
        summary=(
            f"{preemptions} preemptions in {len(preempting)} steps (each preempted request "
            f"recomputes its KV), {'although' if moderate else 'with'} {used}; "
            f"reserve-full-ISL {'on' if reserve else 'off'}"
        ),
        evidence=tuple(
            f"{_at(s)}: preempted {', '.join(s.preempted[:4])}"
            + (" …" if len(s.preempted) > 4 else "")
            for s in preempting[:5]
        ),
        knob=knob,
        severity=len(preempting) / len(view.steps),
        metrics=METRICS,
    )


def admission_stall(view: RunView) -> Finding | None:
    """Admission stall: requests wait while the running set is held at max_num_seqs, or below
    it with room in the budget and the pool (a long prompt at the head of the queue waiting
    for its full length under reserve-full-ISL)."""
    waiting = [s for s in view.steps if s.waiting]
    if not view.steps or not waiting:
        return None
    capped = [s for s in waiting if s.running is not None and s.running >= view.max_num_seqs]
    held = {s.index for s in capped}
    reserve = bool(view.settings.get("scheduler_reserve_full_isl"))
    blocked = [
        s
        for s in waiting
        if s.index not in held
        and s.tokens < HEAD_OF_LINE_ROOM * view.budget
        and (s.kv_usage is None or s.kv_usage < HEAD_OF_LINE_ROOM)
        and reserve
    ]
    share_capped = len(capped) / len(view.steps)
    share_blocked = len(blocked) / len(view.steps)
    if max(share_capped, share_blocked) < STALL_SHARE:
        return None
    if share_capped >= share_blocked:
        summary = (
            f"in {len(capped)} of {len(view.steps)} steps requests waited while "
            f"{view.max_num_seqs} ran (max_num_seqs)"
        )
        knob = f"raise max_num_seqs (now {view.max_num_seqs})"
        shown = capped
    else:
        summary = (
            f"in {len(blocked)} of {len(view.steps)} steps requests waited with the budget and "
            "the pool half empty: the queue's head (a long prompt, under reserve-full-ISL) "
            "waited for its full length to fit"
        )
        knob = (
            "turn scheduler_reserve_full_isl off (head-of-line blocking), or give the pool more KV"
        )
        shown = blocked
    return Finding(
        symptom="admission stall",
        summary=summary,
        evidence=tuple(
            f"{_at(s)}: {s.running} running, {s.waiting} waiting, {s.tokens} tokens"
            + (f", pool {s.kv_usage:.0%} used" if s.kv_usage is not None else "")
            for s in shown[:5]
        ),
        knob=knob,
        severity=max(share_capped, share_blocked),
        metrics=("ttft", "e2el"),
    )


def fragmented_steps(view: RunView) -> Finding | None:
    """Fragmented steps: many steps far below the budget while requests wait (each pays the
    per-step overhead for little work)."""
    small = [
        s
        for s in view.steps
        if s.waiting and 0 < s.tokens < FRAGMENT * view.budget and s.prefill_tokens
    ]
    if not view.steps or len(small) / len(view.steps) < FRAGMENTED_SHARE:
        return None
    threshold = int(view.settings.get("long_prefill_token_threshold") or 0)
    capped_chunks = threshold and all(
        max((s.prefill_chunks or {}).values(), default=0) <= threshold for s in small
    )
    knob = (
        f"raise long_prefill_token_threshold (now {threshold}): it cuts every long prompt into "
        "chunks this small"
        if capped_chunks
        else f"raise max_num_seqs (now {view.max_num_seqs}) or long_prefill_token_threshold "
        f"({threshold or 'off'}) so steps fill their {view.budget}-token budget"
    )
    return Finding(
        symptom="fragmented steps",
        summary=(
            f"{len(small)} of {len(view.steps)} steps used under {FRAGMENT:.0%} of the "
            f"{view.budget}-token budget while requests waited"
        ),
        evidence=tuple(
            f"{_at(s)}: {s.tokens} tokens ({s.prefill_tokens} prefill), {s.waiting} waiting"
            for s in small[:5]
        ),
        knob=knob,
        severity=len(small) / len(view.steps),
        metrics=("ttft", "e2el"),
    )


DETECTORS: tuple[Callable[[RunView], Finding | None], ...] = (
    spikes,
    starvation,
    kv_thrashing,
    admission_stall,
    fragmented_steps,
)


def judge(finding: Finding, view: RunView) -> Finding:
    """The finding against the study's SLOs on its symptom's metrics (what the users felt):
    one of them broken confirms it (said in its summary); all of them met, the finding says
    so and that no action is needed, instead of a knob to move (the symptom is real, but
    within what the study asked for); none on its metrics, it says that too."""
    if not view.slos:
        return finding
    relevant = [m for m in view.slos if m.slo.metric in finding.metrics]
    if not relevant:
        said = " or ".join(metric.upper() for metric in finding.metrics)
        judged = f"the study sets no SLO on {said}: judged on the steps alone"
        return dataclasses.replace(finding, summary=f"{finding.summary}; {judged}", judged=judged)

    def measured(m: Measured) -> str:
        return f"SLO {m.slo} ({format_seconds(m.value_s)} measured)"

    broken = [m for m in relevant if not m.met]
    if broken:
        judged = "breaks the " + ", ".join(measured(m) for m in broken)
        return dataclasses.replace(finding, summary=f"{finding.summary}; {judged}", judged=judged)
    judged = "within the " + ", ".join(measured(m) for m in relevant)
    return dataclasses.replace(
        finding, knob=f"no action needed: {judged}", judged=judged, within_slo=True
    )


def diagnose(view: RunView) -> list[Finding]:
    """Every finding on the run, judged against its SLOs (:func:`judge`): those that break
    an SLO or have none first, the most severe first; then those within their SLOs."""
    findings = [judge(f, view) for f in (detect(view) for detect in DETECTORS) if f is not None]
    return sorted(findings, key=lambda f: (f.within_slo, -f.severity))
