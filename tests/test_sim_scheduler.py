"""The simulated scheduler: worked examples of vLLM's rules, and invariants on every step."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from prefill_tuner.engines.sim import ConstantProfile, SimConfig, StepRecord, simulate
from prefill_tuner.trace.model import Request, Trace
from tests.support.sim_scenarios import random_scenario

ONE_SECOND = ConstantProfile(step_ms=1000.0)


def run(requests: list[Request], **config: object) -> tuple[list[StepRecord], object]:
    steps: list[StepRecord] = []
    defaults = {
        "max_model_len": 256,
        "num_gpu_blocks": 1000,
        "block_size": 16,
        "max_num_seqs": 8,
        "async_scheduling": False,
    }
    result = simulate(
        Trace(tuple(requests)),
        SimConfig(**{**defaults, **config}),
        ONE_SECOND,
        on_step=steps.append,
    )
    return steps, result


def decodes(count: int, output: int = 50) -> list[Request]:
    """Requests that arrive first with a 1-token prompt, so they are decoding from step 1."""
    return [Request(f"d{i}", 0.0, 1, output) for i in range(count)]


def test_worked_example_budget_8() -> None:
    """Budget 8, three running decodes, a 12-token prompt arriving: chunks 5, 5, 2."""
    steps, result = run(
        [*decodes(3), Request("p", 0.5, 12, 4)], max_num_batched_tokens=8, max_num_seqs=8
    )
    assert [s.scheduled.get("p") for s in steps[1:4]] == [5, 5, 2]
    assert [sum(s.scheduled.values()) for s in steps[1:4]] == [8, 8, 5]
    assert steps[4].scheduled == {"d0": 1, "d1": 1, "d2": 1, "p": 1}
    first_token = result.records[3].token_times_s[0]
    assert first_token == steps[3].start_s + 1.0  # produced by the last chunk's step


def test_async_an_arrival_waits_for_the_step_already_scheduled() -> None:
    """The worked example with async scheduling: step 1 was scheduled when step 0 started,
    before the prompt arrived, so its chunks start a step later (TTFT one step longer)."""
    requests = [*decodes(3), Request("p", 0.5, 12, 4)]
    steps, result = run(requests, max_num_batched_tokens=8, async_scheduling=True)
    assert [s.scheduled.get("p") for s in steps[1:5]] == [None, 5, 5, 2]
    _, sync_result = run(requests, max_num_batched_tokens=8)
    assert result.records[3].token_times_s[0] == sync_result.records[3].token_times_s[0] + 1.0


def test_async_a_finished_request_holds_its_slot_one_step_longer() -> None:
    """max_num_seqs 2: the waiting request takes the finished one's slot only once the step
    that sampled its last token has been applied: a step later than synchronously."""
    requests = [Request("a", 0.0, 4, 3), Request("c", 0.0, 4, 10), Request("b", 0.0, 4, 2)]
    sync_steps, _ = run(requests, max_num_seqs=2)
    async_steps, _ = run(requests, max_num_seqs=2, async_scheduling=True)
    assert [sorted(s.scheduled) for s in sync_steps[2:5]] == [["a", "c"], ["b", "c"], ["b", "c"]]
    assert [sorted(s.scheduled) for s in async_steps[2:5]] == [["a", "c"], ["c"], ["b", "c"]]


def test_async_the_long_prefill_threshold_still_counts_a_finishing_request() -> None:
    """The long-prefill cap lifts when a prompt is left alone. Under async scheduling a
    request whose last token is still in flight has not left yet: one more capped chunk."""
    requests = [Request("a", 0.0, 2, 4), Request("long", 0.0, 200, 1)]
    config = {"max_num_batched_tokens": 128, "long_prefill_token_threshold": 16}
    sync_steps, _ = run(requests, **config)
    async_steps, _ = run(requests, **config, async_scheduling=True)
    assert [s.scheduled["long"] for s in sync_steps if "long" in s.scheduled] == [
        *[16] * 4,
        128,
        8,
    ]
    assert [s.scheduled["long"] for s in async_steps if "long" in s.scheduled] == [*[16] * 5, 120]


def test_budget_16_six_decodes_two_prompts() -> None:
    """Six decodes take 6 of 16; A (18) gets 10, then 8 and B's first 2, then B's last 3."""
    prompts = [Request("A", 0.5, 18, 5), Request("B", 0.6, 5, 5)]
    steps, result = run([*decodes(6), *prompts], max_num_batched_tokens=16, max_num_seqs=8)
    assert [(s.scheduled.get("A"), s.scheduled.get("B")) for s in steps[1:4]] == [
        (10, None),
        (8, 2),
        (1, 3),  # A decodes now; B finishes its prefill
    ]
    b_first_16 = result.records[7].token_times_s[0]
    _, wide = run([*decodes(6), *prompts], max_num_batched_tokens=32, max_num_seqs=8)
    b_first_32 = wide.records[7].token_times_s[0]
    assert b_first_32 < b_first_16
    assert (b_first_32, b_first_16) == (2.0, 4.0)


def test_threshold_caps_chunks_but_not_a_lone_request() -> None:
    steps, _ = run(
        [Request("solo", 0.0, 40, 2)], max_num_batched_tokens=64, long_prefill_token_threshold=8
    )
    assert steps[0].scheduled == {"solo": 40}  # alone: nobody to protect
    steps, _ = run(
        [Request("a", 0.0, 40, 2), Request("b", 0.0, 40, 2)],
        max_num_batched_tokens=64,
        long_prefill_token_threshold=8,
    )
    assert steps[0].scheduled == {"a": 8, "b": 8}
    steps, _ = run(
        [Request("a", 0.0, 40, 2), Request("b", 0.0, 40, 2)],
        max_num_batched_tokens=64,
        long_prefill_token_threshold=8,
        long_prefill_token_threshold_adaptive=True,
    )
    assert steps[0].scheduled == {"a": 32, "b": 32}  # floored at 64 // 2


def test_chunked_prefill_off_blocks_the_queue_head() -> None:
    steps, _ = run(
        [Request("a", 0.0, 20, 3), Request("b", 0.0, 20, 3), Request("c", 0.0, 5, 3)],
        max_num_batched_tokens=256,
        max_model_len=256,
        enable_chunked_prefill=False,
    )
    assert steps[0].scheduled == {"a": 20, "b": 20, "c": 5}
    steps, _ = run(
        [*decodes(4), Request("big", 0.5, 253, 3), Request("small", 0.5, 5, 3)],
        max_num_batched_tokens=256,
        max_model_len=256,
        enable_chunked_prefill=False,
    )
    # 4 decodes leave 252 < 253: the big prompt waits, and so does the small one behind it.
    assert steps[1].scheduled == {"d0": 1, "d1": 1, "d2": 1, "d3": 1}


def test_preemption_takes_the_last_admitted_and_requeues_it_first() -> None:
    # 4 usable blocks of 4 tokens; two requests of 8 prompt tokens grow until one must go.
    steps, result = run(
        [Request("a", 0.0, 8, 6), Request("b", 0.0, 8, 6)],
        max_num_batched_tokens=32,
        max_num_seqs=4,
        block_size=4,
        num_gpu_blocks=5,
        max_model_len=16,
        enable_prefix_caching=False,
    )
    preempting = next(s for s in steps if s.preempted)
    assert preempting.preempted == ("b",)
    assert preempting.scheduled == {"a": 1}
    assert result.records[1].preemptions >= 1
    assert all(r.completed for r in result.records)
    # b restarts from scratch: prompt plus the outputs it had, recomputed in one chunk.
    resumed = next(
        s for s in steps if s.index > preempting.index and "b" in s.admitted_cached_tokens
    )
    assert resumed.scheduled["b"] > 1


def test_reserve_full_isl_waits_instead_of_thrashing() -> None:
    requests = [Request("a", 0.0, 20, 8), Request("b", 0.0, 20, 8)]
    kwargs = {
        "max_num_batched_tokens": 8,
        "max_num_seqs": 4,
        "block_size": 4,
        "num_gpu_blocks": 9,
        "max_model_len": 32,
        "enable_prefix_caching": False,
    }
    _, reserving = run(requests, scheduler_reserve_full_isl=True, **kwargs)
    _, optimistic = run(requests, scheduler_reserve_full_isl=False, **kwargs)
    assert reserving.preemptions == 0
    assert optimistic.preemptions > 0
    assert all(r.completed for r in reserving.records + optimistic.records)


def test_prefix_hits_skip_shared_blocks() -> None:
    shared = (1, 2, 3)
    first = Request("x", 0.0, 48, 2, shared, 16)
    second = Request("y", 5.0, 48, 2, shared, 16)
    steps, result = run([first, second], max_num_batched_tokens=64)
    admitted = next(s for s in steps if "y" in s.admitted_cached_tokens)
    assert (
        admitted.admitted_cached_tokens["y"] == 32
    )  # 2 full blocks; the last token is always recomputed
    assert admitted.scheduled["y"] == 16
    assert (result.prefix_cache_queries, result.prefix_cache_hits) == (96, 32)


def test_vllm_refuses_a_pool_that_cannot_hold_one_max_model_len_request() -> None:
    """vLLM 0.32's check_enough_kv_cache_memory: 256 blocks of 16 with max_model_len 4096 is
    refused (255 usable after the null block), 257 accepted."""
    with pytest.raises(ValidationError, match=r"max_model_len \(4096\), 256 KV blocks"):
        SimConfig(num_gpu_blocks=256, block_size=16, max_model_len=4096)
    assert SimConfig(num_gpu_blocks=257, block_size=16, max_model_len=4096).usable_blocks == 256


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_stall_ends_the_run_only_when_no_arrival_can_change_it(async_scheduling: bool) -> None:
    """A head request that can never be admitted (only in a pool vLLM would refuse, built
    unchecked here as vLLM's scheduler can be): the engine keeps polling, so a request
    arriving later is still seen (and waits behind the head, FCFS) before the run ends."""
    config = SimConfig.model_construct(
        **{
            **SimConfig().model_dump(),
            "block_size": 4,
            "num_gpu_blocks": 10,
            "max_model_len": 128,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 4,
            "async_scheduling": async_scheduling,
        }
    )
    steps: list[StepRecord] = []
    trace = Trace(
        (Request("small", 0.0, 4, 3), Request("huge", 0.5, 100, 2), Request("next", 9.0, 4, 2))
    )
    result = simulate(trace, config, ONE_SECOND, on_step=steps.append)
    assert result.stalled and "huge" in result.stalled and "9 usable" in result.stalled
    assert [r.error is not None for r in result.records] == [False, True, True]
    assert "next" not in {rid for step in steps for rid in step.scheduled}


def test_requests_longer_than_max_model_len_are_rejected() -> None:
    _, result = run([Request("ok", 0.0, 10, 5), Request("long", 0.0, 250, 10)])
    assert result.records[0].completed
    assert "max_model_len" in (result.records[1].error or "")
    assert result.metrics.failed == 1


def _check_invariants(trace: Trace, config: SimConfig) -> dict[str, int]:
    steps: list[StepRecord] = []
    result = simulate(trace, config, ONE_SECOND, on_step=steps.append)
    computed: dict[str, int] = {}
    outputs: dict[str, int] = defaultdict(int)
    lengths = {r.id: (r.prompt_tokens, r.output_tokens) for r in trace.requests}
    for step in steps:
        assert sum(step.scheduled.values()) <= config.max_num_batched_tokens
        assert all(n > 0 for n in step.scheduled.values())
        assert step.kv_blocks_in_use <= config.usable_blocks
        assert step.running_after <= config.max_num_seqs
        for request_id in step.preempted:
            computed.pop(request_id, None)
        decoding = prefilling = 0
        for request_id, n in step.scheduled.items():
            if request_id in step.admitted_cached_tokens:
                computed[request_id] = step.admitted_cached_tokens[request_id]
            start = computed[request_id]  # contiguous: each chunk starts where the last ended
            prompt, _ = lengths[request_id]
            samples = start + n >= prompt + outputs[request_id]
            if n == 1 and samples and start >= prompt:  # a decode: one sampled token after
                decoding += 1  # the prompt (not a resumed request's recomputed output)
            else:
                prefilling += n
            computed[request_id] = start + n
            if computed[request_id] >= prompt + outputs[request_id]:
                outputs[request_id] += 1
            assert computed[request_id] <= prompt + outputs[request_id]  # never past the end
        # What the cost model is told (a decode reads its context, a chunk computes pairs).
        assert (step.decode_tokens, step.prefill_tokens) == (decoding, prefilling)
    if result.stalled is None:
        for request in trace.requests:
            prompt, output = lengths[request.id]
            assert outputs[request.id] == output
            # The whole sequence except the last sampled token was computed, exactly once since
            # the last preemption.
            assert computed[request.id] == prompt + output - 1
        assert all(r.completed for r in result.records)
    return {r.id: len(r.token_times_s) for r in result.records}


@settings(max_examples=120)
@given(st.integers(0, 2**31))
def test_invariants_hold_on_every_step(seed: int) -> None:
    trace, config = random_scenario(seed)
    _check_invariants(trace, config)


@settings(max_examples=60)
@given(st.integers(0, 2**31))
def test_chunking_changes_timing_not_output(seed: int) -> None:
    trace, config = random_scenario(seed)
    big = config.max_model_len
    chunked = config.model_copy(
        update={"enable_chunked_prefill": True, "max_num_batched_tokens": big}
    )
    unchunked = config.model_copy(
        update={"enable_chunked_prefill": False, "max_num_batched_tokens": big}
    )
    small = config.model_copy(
        update={
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": max(config.max_num_seqs, 8),
        }
    )
    counts = [
        _check_invariants(trace, SimConfig(**c.model_dump())) for c in (chunked, unchunked, small)
    ]
    if all(
        all(v == r.output_tokens for v, r in zip(c.values(), trace.requests, strict=True))
        for c in counts
    ):
        assert counts[0] == counts[1] == counts[2]


def test_config_mirrors_vllm_validation() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        SimConfig(max_num_batched_tokens=8, max_num_seqs=16)
    with pytest.raises(ValueError, match="chunked prefill off"):
        SimConfig(max_num_batched_tokens=2048, max_model_len=4096, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        SimConfig(max_model_len=4096, long_prefill_token_threshold=5000)
