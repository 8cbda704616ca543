"""When nothing meets the SLOs: the floor no setting beats, and the load that would be met."""

from __future__ import annotations

import random

import pytest

from prefill_tuner.defaults import CAPACITY_TOLERANCE
from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.study.evaluation import verdict_of
from prefill_tuner.study.infeasibility import latency_floor, rate_headroom, uncached_tokens
from prefill_tuner.trace.model import Request, Trace
from prefill_tuner.trace.shaping import scale_rate

H100 = load_profile("llama-3.1-8b-h100")


def bursty_trace(seed: int = 0) -> Trace:
    """A quiet stream of short chats, and every 20 s a burst of 30 long documents at once
    (a shared 2,048-token system prompt in half of them)."""
    rng = random.Random(seed)
    requests = []
    for index in range(120):
        requests.append(
            Request(f"chat-{index}", index * 0.5, rng.randint(100, 600), rng.randint(20, 80))
        )
    for burst in range(3):
        for index in range(30):
            shared = index % 2 == 0
            requests.append(
                Request(
                    f"doc-{burst}-{index}",
                    5.0 + 20.0 * burst + 0.01 * index,
                    rng.randint(6000, 12000),
                    rng.randint(10, 40),
                    prefix_blocks=(7, 8, 9, 10) if shared else (),
                    prefix_block_size=512 if shared else None,
                )
            )
    requests.sort(key=lambda r: r.arrival_s)
    return Trace(tuple(requests))


def test_a_shared_prefix_is_cached_only_after_its_first_request() -> None:
    trace = Trace(
        (
            Request("a", 0.0, 3000, 5, (1, 2, 3), 512),
            Request("b", 1.0, 3000, 5, (1, 2, 4), 512),
            Request("c", 2.0, 1000, 5),
        )
    )
    assert uncached_tokens(trace) == [3000, 3000 - 2 * 512, 1000]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_setting_beats_the_floor(seed: int) -> None:
    """The floor is a bound: the simulated engine under any settings is at or above it."""
    trace = bursty_trace(seed)
    slos = tuple(parse_slos(["p99_ttft=1s", "p50_ttft=10ms", "p90_ttft=1s", "p99_tpot=1ms"]))
    floors = {floor.slo.name: floor for floor in latency_floor(trace, H100, slos)}
    rng = random.Random(seed)
    for _ in range(6):
        budget = rng.choice([512, 2048, 8192, 32768])
        settings = {
            "max_num_batched_tokens": budget,
            "max_num_seqs": rng.choice([8, 64, 256]),
            "long_prefill_token_threshold": rng.choice([0, 256, 2048]),
            "async_scheduling": rng.choice([True, False]),
        }
        metrics = simulate(trace, SimConfig(**{**H100.engine_defaults, **settings}), H100).metrics
        for name, floor in floors.items():
            slo = floor.slo
            assert slo.value(metrics) >= floor.floor_s, (settings, name, floor)


def test_capacity_mode_finds_the_load_the_closest_settings_meet() -> None:
    trace = bursty_trace()
    engine = SimEngine(H100)
    defaults = engine.default_settings()
    slos = tuple(parse_slos(["p99_ttft=1.5s"]))
    floor = latency_floor(trace, H100, slos)[0]
    # The bursts alone put p99 TTFT over 1.5 s at this load, whatever the settings...
    assert floor.unreachable and floor.bursts and "at this load" in floor.line()
    assert not verdict_of(engine.run(trace, defaults), slos, 0.0).feasible
    headroom = rate_headroom(engine, trace, defaults, slos, trial_number=0)
    assert 0 < headroom.multiplier < 1
    meets = engine.run(scale_rate(trace, headroom.multiplier), defaults)
    assert verdict_of(meets, slos, 0.0).feasible
    over = headroom.multiplier * (1 + 2 * CAPACITY_TOLERANCE)
    assert not verdict_of(engine.run(scale_rate(trace, over), defaults), slos, 0.0).feasible
    assert f"{headroom.multiplier:.3g}× the trace's request rate" in headroom.line()
    # ... and at the load that is met, the floor is under the limit (as it must be).
    assert not latency_floor(scale_rate(trace, headroom.multiplier), H100, slos)[0].unreachable


def test_bursts_raise_the_floor_and_replicas_share_the_work() -> None:
    trace = bursty_trace()
    slos = tuple(parse_slos(["p99_ttft=1s", "p50_ttft=1s"]))
    one = {floor.slo.name: floor for floor in latency_floor(trace, H100, slos)}
    # 30 documents of 6-12k tokens within 0.3 s: the last of them waits for the others' work
    assert one["p99_ttft"].bursts and one["p99_ttft"].floor_s > 5.0
    # the median request is a chat that arrived alone: its own prefill sets its floor
    assert not one["p50_ttft"].bursts and one["p50_ttft"].floor_s < 0.1
    three = latency_floor(trace, H100, slos, replicas=3)[0]
    thirty = latency_floor(trace, H100, slos, replicas=30)[0]
    assert one["p99_ttft"].floor_s > three.floor_s > thirty.floor_s
    # with a replica per document, only each document's own prefill remains
    assert not thirty.bursts


@pytest.mark.parametrize("limit", [1, 4])
def test_under_a_client_limit_the_bursts_wait_at_the_client(limit: int) -> None:
    """Closed-loop load: a burst waits at the client, before its TTFTs begin. The burst floor
    no longer holds (the simulated p99 TTFT is far under it); each request alone still bounds
    every setting."""
    trace = bursty_trace()
    slos = tuple(parse_slos(["p99_ttft=1s", "p50_ttft=10ms"]))
    open_loop = latency_floor(trace, H100, slos)[0]
    assert open_loop.bursts and open_loop.floor_s > 5.0
    floors = latency_floor(trace, H100, slos, max_concurrency=limit)
    assert not any(floor.bursts for floor in floors)
    rng = random.Random(limit)
    for _ in range(4):
        settings = {
            "max_num_batched_tokens": rng.choice([512, 2048, 8192]),
            "max_num_seqs": rng.choice([8, 64, 256]),
            "long_prefill_token_threshold": rng.choice([0, 256]),
            "async_scheduling": rng.choice([True, False]),
        }
        config = SimConfig(**{**H100.engine_defaults, **settings})
        metrics = simulate(trace, config, H100, max_concurrency=limit).metrics
        assert metrics.ttft_s["p99"] < open_loop.floor_s
        for floor in floors:
            assert floor.slo.value(metrics) >= floor.floor_s, (settings, floor)
