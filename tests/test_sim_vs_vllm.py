"""The simulator schedules exactly as vLLM's own V1 scheduler does, step for step.

Drives vLLM's real ``Scheduler`` class (no model, no GPU) on the same requests through
``tests/vllm_reference.py`` in a Python that has vLLM: ``$TUNER_VLLM_PYTHON``, or
``.venv-vllm/bin/python`` as the README's test command installs it. Skipped, with the reason,
only outside CI; in CI a missing vLLM is a failure.
"""

from __future__ import annotations

import pytest

from prefill_tuner.engines.sim import ConstantProfile, simulate
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import vllm_python
from tests.sim_crosscheck import (
    first_mismatch,
    run_reference,
    scenario,
    simulated_steps,
)
from tests.sim_scenarios import random_scenario

SCENARIOS = 300


@pytest.fixture(scope="module")
def random_cases() -> list[tuple[str, Trace, object, dict]]:
    python = vllm_python()
    cases = [(f"seed-{seed}", *random_scenario(seed)) for seed in range(SCENARIOS)]
    references = run_reference(python, [scenario(name, t, c) for name, t, c in cases])
    assert len(references) == len(cases)
    return [(name, t, c, ref) for (name, t, c), ref in zip(cases, references, strict=True)]


def test_random_scenarios_match_vllm_step_for_step(random_cases) -> None:
    mismatches = [
        str(m)
        for name, trace, config, reference in random_cases
        if (m := first_mismatch(name, simulated_steps(trace, config), reference))
    ]
    assert not mismatches, f"{len(mismatches)} of {len(random_cases)}: {mismatches[:3]}"


def test_the_scenarios_exercise_every_rule(random_cases) -> None:
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
        ],
        0,
    )
    for _, trace, config, reference in random_cases:
        steps = reference["steps"]
        result = simulate(trace, config, one_second)
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
    assert all(count >= 10 for count in covered.values()), covered


def test_stall_matches_vllm() -> None:
    """A request that can never be admitted: vLLM schedules nothing, forever; so do we."""
    python = vllm_python()
    from prefill_tuner.engines.sim.config import SimConfig

    trace = Trace(
        (Request("small", 0.0, 4, 3), Request("huge", 0.5, 100, 2), Request("after", 0.7, 4, 2))
    )
    config = SimConfig(
        max_num_batched_tokens=64,
        max_num_seqs=4,
        max_model_len=128,
        block_size=4,
        num_gpu_blocks=10,
    )
    (reference,) = run_reference(python, [scenario("stall", trace, config)])
    assert reference["stalled"]
    assert first_mismatch("stall", simulated_steps(trace, config), reference) is None
