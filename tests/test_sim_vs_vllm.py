"""The simulator schedules exactly as vLLM's own V1 scheduler does, step for step.

Drives vLLM's real ``Scheduler`` class (no model, no GPU) on the same requests through
``tests/support/vllm_reference.py``, in two halves over the same 300 random scenarios: the
synchronous engine loop (as on CPU), and ``AsyncScheduler`` driven by vLLM's own
``EngineCore.step_with_batch_queue`` (async scheduling, as on GPU); in a Python that has
vLLM: ``$TUNER_VLLM_PYTHON``, or ``.venv-vllm/bin/python`` as the README's test command
installs it. Skipped, with the reason,
only outside CI; in CI a missing vLLM is a failure.
"""

from __future__ import annotations

import functools
import itertools

import pytest

from prefill_tuner.engines.sim import ConstantProfile, SimConfig, simulate
from prefill_tuner.engines.sim.loop import StepRecord
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import vllm_python
from tests.support.sim_crosscheck import (
    first_mismatch,
    run_reference,
    scenario,
    simulated_steps,
)
from tests.support.sim_scenarios import prefix_heavy_scenario, random_scenario

pytestmark = pytest.mark.real_engine  # starts vLLM (CPU build): `-m 'not real_engine'` skips

SCENARIOS = 300


MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def _stall_case(async_scheduling: bool) -> tuple[str, Trace, SimConfig]:
    """A request that can never be admitted, in a pool vLLM would refuse to start with (built
    unchecked)."""
    trace = Trace(
        (Request("small", 0.0, 4, 3), Request("huge", 0.5, 100, 2), Request("after", 7.0, 4, 2))
    )
    config = SimConfig.model_construct(
        **{
            **SimConfig().model_dump(),
            "max_num_batched_tokens": 64,
            "max_num_seqs": 4,
            "max_model_len": 128,
            "block_size": 4,
            "num_gpu_blocks": 10,
            "async_scheduling": async_scheduling,
        }
    )
    return "stall", trace, config


@functools.cache
def _all_cases() -> dict[tuple[str, bool], list[tuple[str, Trace, SimConfig, dict]]]:
    """Every scenario of this module, run by vLLM in one process (importing vLLM takes seconds):
    the random ones and the stall, each by vLLM's synchronous loop and, with async scheduling,
    by its ``AsyncScheduler`` in ``EngineCore.step_with_batch_queue``."""
    groups = {
        (kind, mode): (
            [
                (f"seed-{seed}", *random_scenario(seed, async_scheduling=mode))
                for seed in range(SCENARIOS)
            ]
            if kind == "random"
            else [_stall_case(mode)]
        )
        for kind in ("random", "stall")
        for mode in (False, True)
    }
    cases = [case for group in groups.values() for case in group]
    references = iter(run_reference(vllm_python(), [scenario(n, t, c) for n, t, c in cases]))
    result = {key: [(*case, next(references)) for case in group] for key, group in groups.items()}
    assert next(references, None) is None
    return result


def random_cases(async_scheduling: bool) -> list[tuple[str, Trace, SimConfig, dict]]:
    """The same random scenarios, in one mode."""
    return _all_cases()[("random", async_scheduling)]


@MODES
def test_random_scenarios_match_vllm_step_for_step(async_scheduling: bool) -> None:
    cases = random_cases(async_scheduling)
    mismatches = [
        str(m)
        for name, trace, config, reference in cases
        if (m := first_mismatch(name, simulated_steps(trace, config), reference))
    ]
    assert not mismatches, f"{len(mismatches)} of {len(cases)}: {mismatches[:3]}"
    steps = sum(len(reference["steps"]) for *_, reference in cases)
    assert steps > 10_000  # about 16,000 in each mode


@MODES
def test_the_scenarios_exercise_every_rule(async_scheduling: bool) -> None:
    """The comparison above is only as strong as what the scenarios make vLLM do."""
    one_second = ConstantProfile(step_ms=1000.0)
    covered = dict.fromkeys(
        [
            "preemption",
            "prefix hit",
            "threshold",
            "adaptive threshold",
            "chunked off",
            "reserve-full-ISL off",
            "watermark",
            "chunked prompt",
            "KV wait",
            "resumed from blocks only it could hit",
            "active-seqs limit held a request back",
        ],
        0,
    )
    for _, trace, config, reference in random_cases(async_scheduling):
        steps = reference["steps"]
        records: list[StepRecord] = []
        result = simulate(trace, config, one_second, on_step=records.append)
        # The simulator registers a block no other request could hit only when its request is
        # preempted: a resumed request's hit past the prefix it shares is that path.
        shared = _shared_prefix_tokens(trace)
        preempted: set[str] = set()
        resumed_hit = False
        for record in records:
            resumed_hit |= any(
                cached > shared[rid] and rid in preempted
                for rid, cached in record.admitted_cached_tokens.items()
            )
            preempted.update(record.preempted)
        covered["resumed from blocks only it could hit"] += resumed_hit
        covered["preemption"] += any(step["preempted"] for step in steps)
        covered["prefix hit"] += result.prefix_cache_hits > 0
        covered["threshold"] += config.long_prefill_token_threshold > 0
        covered["adaptive threshold"] += config.long_prefill_token_threshold_adaptive
        covered["chunked off"] += not config.enable_chunked_prefill
        covered["reserve-full-ISL off"] += not config.scheduler_reserve_full_isl
        covered["watermark"] += config.watermark > 0
        prompts = {r.id: r.prompt_tokens for r in trace.requests}
        covered["chunked prompt"] += any(
            0 < n < prompts[rid] for step in steps for rid, n in step["scheduled"].items()
        )
        covered["KV wait"] += result.peak_kv_blocks > 0.8 * config.usable_blocks
        active = config.max_num_active_seqs
        covered["active-seqs limit held a request back"] += (
            active is not None
            and active < config.max_num_seqs
            and any(r.running_after >= active and r.waiting_after for r in records)
        )
    assert all(count >= 10 for count in covered.values()), covered


def _shared_prefix_tokens(trace: Trace) -> dict[str, int]:
    """Per request: the leading prompt tokens some other request's prompt starts with too."""
    holders: dict[tuple[int, ...], int] = {}
    for request in trace.requests:
        for k in range(1, len(request.prefix_blocks) + 1):
            prefix = request.prefix_blocks[:k]
            holders[prefix] = holders.get(prefix, 0) + 1
    shared = {}
    for request in trace.requests:
        k = 0
        while k < len(request.prefix_blocks) and holders[request.prefix_blocks[: k + 1]] > 1:
            k += 1
        shared[request.id] = min(request.prompt_tokens, k * (request.prefix_block_size or 1))
    return shared


def test_async_scenarios_exercise_what_async_scheduling_changes() -> None:
    """Async scheduling must schedule differently from the synchronous loop on many of the
    scenarios (a finished request's slot and blocks held a step longer, a preempted request's
    token still in flight), or its half of the comparison proves little."""
    differ = preempted_in_flight = 0
    for _, trace, config, reference in random_cases(True):
        steps = reference["steps"]
        sync = simulated_steps(trace, config.model_copy(update={"async_scheduling": False}))
        differ += [s["scheduled"] for s in steps] != [s["scheduled"] for s in sync["steps"]]
        # Preempted while the step before (still computing when it was scheduled) ran it.
        preempted_in_flight += sum(
            1
            for before, step in itertools.pairwise(steps)
            for rid in step["preempted"]
            if rid in before["scheduled"]
        )
    assert differ >= SCENARIOS // 2, differ
    assert preempted_in_flight >= 50, preempted_in_flight


@MODES
def test_stall_matches_vllm(async_scheduling: bool) -> None:
    """A request that can never be admitted (a pool vLLM would refuse to start with, built
    unchecked): vLLM keeps polling, sees the later arrival, and schedules nothing more
    forever; the simulator ends the run at the same step, stalled."""
    ((_, trace, config, reference),) = _all_cases()[("stall", async_scheduling)]
    assert reference["stalled"]
    assert first_mismatch("stall", simulated_steps(trace, config), reference) is None


PREFIX_HEAVY = 20


@MODES
def test_prefix_heavy_scenarios_match_vllm_step_for_step(async_scheduling: bool) -> None:
    """The conversations under eviction pressure of ``tests/test_sim_kv_equivalence.py`` (its
    first 20: 40 passed too, at about 50 s of CPU), against vLLM's own scheduler and block
    pool."""
    cases = [
        (f"prefix-heavy-{seed}", *prefix_heavy_scenario(seed, async_scheduling=async_scheduling))
        for seed in range(PREFIX_HEAVY)
    ]
    references = run_reference(vllm_python(), [scenario(n, t, c) for n, t, c in cases])
    mismatches = [
        str(m)
        for (name, trace, config), reference in zip(cases, references, strict=True)
        if (m := first_mismatch(name, simulated_steps(trace, config), reference))
    ]
    assert not mismatches, f"{len(mismatches)} of {len(cases)}: {mismatches[:3]}"
