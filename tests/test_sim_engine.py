"""The simulation loop: fast-forwarded decode runs change nothing; time, metrics, profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefill_tuner.engines.sim import ConstantProfile, SimConfig, StepRecord, load_profile, simulate
from prefill_tuner.engines.sim.cost_model import StepShape
from prefill_tuner.errors import TunerError
from prefill_tuner.trace import ShapeOptions, load_trace
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import AZURE, MOONCAKE
from tests.support.sim_scenarios import random_scenario

H100 = load_profile("llama-3.1-8b-h100")


def both_ways(trace: Trace, config: SimConfig, profile=H100):
    runs = []
    for fast in (True, False):
        steps: list[StepRecord] = []
        result = simulate(trace, config, profile, on_step=steps.append, fast_forward=fast)
        runs.append((result, steps))
    return runs


def assert_identical(runs) -> None:
    (fast, fast_steps), (slow, slow_steps) = runs
    assert fast_steps == slow_steps
    assert [list(r.token_times_s) for r in fast.records] == [
        list(r.token_times_s) for r in slow.records
    ]
    assert fast.metrics == slow.metrics
    assert (fast.peak_kv_blocks, fast.preemptions) == (slow.peak_kv_blocks, slow.preemptions)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_fast_forward_is_exact_on_real_traces(async_scheduling: bool) -> None:
    azure = load_trace(str(AZURE), options=ShapeOptions(max_requests=400))
    mode = {"async_scheduling": async_scheduling}
    assert_identical(both_ways(azure, SimConfig(**{**H100.engine_defaults, **mode})))
    mooncake = load_trace(
        str(MOONCAKE), options=ShapeOptions(rate_scale=0.1, max_model_len=32768, max_requests=150)
    )
    # A small pool, so the decode runs meet KV pressure, preemption and prefix hits.
    config = SimConfig(
        **{**H100.engine_defaults, "max_model_len": 32768, "num_gpu_blocks": 2500, **mode}
    )
    runs = both_ways(mooncake, config)
    assert runs[0][0].preemptions > 0 and runs[0][0].prefix_cache_hits > 0
    assert_identical(runs)


@settings(max_examples=80)
@given(st.integers(0, 2**31), st.booleans())
def test_fast_forward_is_exact_on_random_scenarios(seed: int, async_scheduling: bool) -> None:
    trace, config = random_scenario(seed, async_scheduling=async_scheduling)
    assert_identical(both_ways(trace, config, ConstantProfile(step_ms=7.0)))
    assert_identical(both_ways(trace, config, H100))


@pytest.mark.parametrize(("async_scheduling", "lag"), [(False, 0), (True, 1)])
def test_constant_steps_map_arrivals_to_steps_exactly(async_scheduling: bool, lag: int) -> None:
    """Arrivals at k × 10 ms with 10 ms steps: each is scheduled in step k (synchronous) or
    k + 1 (async: step k + 1 is scheduled as step k starts), however long the run (a float
    clock summed step by step drifted a step late from k = 211 on)."""
    arrivals = [Request("busy", 0.0, 1, 1200)]
    arrivals += [Request(f"r{k}", round(k * 0.01, 2), 1, 1) for k in range(1, 1001)]
    steps: list[StepRecord] = []
    config = SimConfig(max_num_seqs=64, max_model_len=2048, async_scheduling=async_scheduling)
    simulate(Trace(tuple(arrivals)), config, ConstantProfile(step_ms=10), on_step=steps.append)
    first_step = {}
    for step in steps:
        for request_id in step.scheduled:
            first_step.setdefault(request_id, step.index)
    assert all(first_step[f"r{k}"] == k + lag for k in range(1, 1001))


def test_idle_engine_waits_for_the_next_arrival() -> None:
    trace = Trace((Request("a", 0.0, 10, 2), Request("b", 100.0, 10, 2)))
    steps: list[StepRecord] = []
    simulate(
        trace,
        SimConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, num_gpu_blocks=64),
        ConstantProfile(step_ms=10),
        on_step=steps.append,
    )
    assert [round(s.start_s, 6) for s in steps] == [0.0, 0.01, 100.0, 100.01]


def test_metrics_come_from_token_times() -> None:
    trace = Trace((Request("a", 0.0, 10, 3), Request("b", 0.0, 10, 1)))
    result = simulate(
        trace,
        SimConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, num_gpu_blocks=64),
        ConstantProfile(step_ms=10),
    )
    a, b = result.records
    assert a.token_times_s == pytest.approx([0.01, 0.02, 0.03])
    assert b.token_times_s == pytest.approx([0.01])
    metrics = result.metrics
    assert metrics.ttft_s["max"] == pytest.approx(0.01)
    assert metrics.tpot_s["mean"] == pytest.approx(0.01)  # b has one token: no TPOT
    assert metrics.single_token_requests == 1
    assert metrics.output_tokens == 4 and metrics.completed == 2


def test_the_shipped_profile_times_steps_as_the_measured_kernels_do() -> None:
    decode = H100.step_seconds(StepShape(decode_tokens=1, requests=1, decode_context_tokens=100))
    assert 0.0072 < decode < 0.0082  # the weights' GEMMs at one token, plus 1.5 ms outside
    prefill = H100.step_seconds(
        StepShape(
            prefill_tokens=8192,
            requests=1,
            prefill_context_tokens=8192,
            prefill_attention_pairs=8192 * 8193 // 2,
        )
    )
    assert 0.19 < prefill < 0.215  # AIConfigurator's H100 kernels sum to about 199 ms
    run = H100.decode_run_seconds(32, 32_000, 5)
    singles = [
        H100.step_seconds(
            StepShape(decode_tokens=32, requests=32, decode_context_tokens=32_000 + 32 * j)
        )
        for j in range(5)
    ]
    assert run.tolist() == singles  # bit for bit: fast-forward relies on it
    assert np.all(np.diff(run) > 0)  # longer contexts read more KV


def test_profiles_load_from_files_with_clear_errors(tmp_path: Path) -> None:
    good = tmp_path / "p.json"
    good.write_text('{"kind": "constant", "step_ms": 5}')
    assert load_profile(str(good)).step_seconds(StepShape()) == 0.005
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: fitted\nname: x\nbase_ms: -1\n")
    with pytest.raises(TunerError, match=r"bad\.yaml: field 'fitted\.base_ms'"):
        load_profile(str(bad))
    with pytest.raises(TunerError, match="no shipped profile"):
        load_profile("no-such-profile")
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    with pytest.raises(TunerError, match="cannot read the profile"):
        load_profile(str(broken))
