"""The equivalence the canonical form rests on (issue 29), checked on vLLM's own scheduler: a
``long_prefill_token_threshold`` at or above ``max_num_batched_tokens`` schedules every step
exactly as with it off, chunked prefill on or off, synchronous or async; below the budget it
does not (so the comparison can fail). The simulator agrees.

Drives vLLM's real ``Scheduler`` (no model, no GPU) through ``tests/support/vllm_reference.py``,
as tests/test_sim_vs_vllm.py does.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from prefill_tuner.engines.sim import SimConfig
from prefill_tuner.search_spaces.rules import canonical
from prefill_tuner.trace.model import Trace
from tests.conftest import vllm_python
from tests.support.sim_crosscheck import first_mismatch, run_reference, scenario, simulated_steps
from tests.support.sim_scenarios import random_scenario

pytestmark = pytest.mark.real_engine  # starts vLLM (CPU build): `-m 'not real_engine'` skips

SCENARIOS = 60
VARIANTS = ("off", "at or above", "below")


def _variants(seed: int, async_scheduling: bool) -> dict[str, tuple[Trace, SimConfig]]:
    """Scenario ``seed`` with its threshold off, at or above its budget (the budget itself,
    the boundary, or a random value up to the context length, which vLLM requires), and below
    it (half the budget)."""
    trace, config = random_scenario(seed, async_scheduling=async_scheduling)
    budget, length = config.max_num_batched_tokens, config.max_model_len
    rng = np.random.default_rng(seed)
    above = budget if rng.random() < 0.5 or budget >= length else int(rng.integers(budget, length))
    return {
        name: (trace, config.model_copy(update={"long_prefill_token_threshold": threshold}))
        for name, threshold in zip(VARIANTS, (0, above, max(1, budget // 2)), strict=True)
    }


@functools.cache
def _schedules() -> dict[tuple[int, bool], dict[str, dict]]:
    """vLLM's schedule of every variant of every scenario, in one process."""
    keys = [(seed, mode) for seed in range(SCENARIOS) for mode in (False, True)]
    cases = [
        (key, name, trace, config)
        for key in keys
        for name, (trace, config) in _variants(*key).items()
    ]
    references = run_reference(vllm_python(), [scenario(f"{k}-{n}", t, c) for k, n, t, c in cases])
    result: dict[tuple[int, bool], dict[str, dict]] = {}
    for (key, name, _, _), reference in zip(cases, references, strict=True):
        result.setdefault(key, {})[name] = reference
    return result


def test_a_threshold_at_or_above_the_budget_schedules_as_off_in_vllm() -> None:
    schedules = _schedules()
    chunked_off = 0
    for (seed, mode), by_variant in schedules.items():
        trace, config = _variants(seed, mode)["at or above"]
        assert canonical(config.model_dump())[0]["long_prefill_token_threshold"] == 0
        mismatch = first_mismatch(f"seed {seed}", by_variant["at or above"], by_variant["off"])
        assert mismatch is None, str(mismatch)
        # The simulator agrees, and schedules as vLLM does.
        assert simulated_steps(trace, config) == simulated_steps(*_variants(seed, mode)["off"])
        chunked_off += not config.enable_chunked_prefill
    assert chunked_off >= 10  # the equivalence holds with chunked prefill off too


def test_a_threshold_below_the_budget_does_change_vllms_schedule() -> None:
    """The control: the comparison above would see a difference if there were one."""
    differ = sum(
        by_variant["below"]["steps"] != by_variant["off"]["steps"]
        for by_variant in _schedules().values()
    )
    assert differ >= SCENARIOS // 3, differ
