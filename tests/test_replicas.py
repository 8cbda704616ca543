"""Replicas of the simulated engine behind a router: exact per replica, routed as the
policies say."""

from __future__ import annotations

import dataclasses
import random

import pytest

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.engines.sim.replicas import simulate_replicas
from prefill_tuner.engines.sim.routing import ROUTERS
from prefill_tuner.trace.model import Request, Trace

H100 = load_profile("llama-3.1-8b-h100")


def mixed_trace(seed: int = 0, count: int = 240) -> Trace:
    """Bursty chats and documents, a third of them behind one of two shared system prompts."""
    rng = random.Random(seed)
    requests, clock = [], 0.0
    for index in range(count):
        clock += rng.expovariate(1.0) * (0.05 if rng.random() < 0.3 else 0.6)
        family = index % 3
        prefix = () if family == 2 else tuple(range(100 * family, 100 * family + 4))
        long_doc = rng.random() < 0.15
        requests.append(
            Request(
                f"r{index}",
                clock,
                rng.randint(6000, 14000) if long_doc else rng.randint(2100, 3000),
                rng.randint(5, 40) if long_doc else rng.randint(60, 600),
                prefix_blocks=prefix,
                prefix_block_size=512 if prefix else None,
            )
        )
    return Trace(tuple(requests))


def config(async_scheduling: bool, **values: object) -> SimConfig:
    """A small KV pool, admitting requests without room for their whole output, so that
    preemptions and evictions happen."""
    base = {
        "max_num_batched_tokens": 1024,
        "num_gpu_blocks": 1260,
        "max_model_len": 20000,
        "scheduler_reserve_full_isl": False,
    }
    return SimConfig(
        **{**H100.engine_defaults, **base, **values, "async_scheduling": async_scheduling}
    )


def token_times(records: list) -> list[tuple[str, list[float], str | None]]:
    return [(r.id, list(r.token_times_s), r.error) for r in records]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_the_single_engine(async_scheduling: bool, router: str) -> None:
    trace = mixed_trace()
    single = simulate(trace, config(async_scheduling), H100)
    assert single.preemptions > 0  # the pool is small enough to matter
    one = simulate_replicas(trace, config(async_scheduling), H100, replicas=1, router=router)
    assert token_times(one.result.records) == token_times(single.records)
    assert one.result.steps == single.steps
    assert one.result.peak_running == single.peak_running > 1
    assert one.assignment == [0] * len(trace.requests)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_each_replica_is_exactly_the_engine_on_what_it_was_sent(async_scheduling: bool) -> None:
    """Round-robin's choices do not depend on the replicas' state, so each replica's schedule
    must equal a plain simulation of its share: pausing every loop at every arrival changes
    nothing."""
    trace = mixed_trace(seed=1)
    replicated = simulate_replicas(
        trace, config(async_scheduling), H100, replicas=3, router="round-robin"
    )
    assert replicated.assignment == [i % 3 for i in range(len(trace.requests))]
    by_id = {r.id: r for r in replicated.result.records}
    peaks = []
    for replica in range(3):
        share = Trace(trace.requests[replica::3])
        alone = simulate(share, config(async_scheduling), H100)
        peaks.append(alone.peak_running)
        assert token_times([by_id[r.id] for r in alone.records]) == token_times(alone.records)
        assert replicated.replicas[replica].steps == alone.steps
        assert replicated.replicas[replica].busy_s == pytest.approx(alone.busy_s)
    assert replicated.result.peak_running == max(peaks)  # (per replica: max_num_seqs is)


def test_least_outstanding_steers_around_a_busy_replica() -> None:
    """Replica 0 gets a long decode first; short requests then go where fewer are in flight."""
    requests = [Request("long", 0.0, 100, 4000)]
    requests += [Request(f"s{i}", 0.5 + i * 0.4, 100, 8) for i in range(20)]
    trace = Trace(tuple(requests))
    for router in ("least-outstanding", "prefix-aware"):
        routed = simulate_replicas(trace, config(False), H100, replicas=2, router=router)
        assert routed.assignment[0] == 0
        # each short one is done before the next arrives: replica 1 is always the lighter
        assert routed.assignment[1:] == [1] * 20, router
    round_robin = simulate_replicas(trace, config(False), H100, replicas=2, router="round-robin")
    assert round_robin.assignment[1:].count(0) == 10


def test_prefix_aware_keeps_a_prefix_on_one_replica() -> None:
    """Two system prompts (2,048 tokens of 2,100-3,000) and prompts of their own, at a light
    load: each system prompt stays where it was first sent, and the cache hits more than
    round-robin's."""
    rng = random.Random(3)
    requests = []
    families = [rng.randrange(3) for _ in range(150)]
    for index, family in enumerate(families):
        prefix = () if family == 2 else tuple(range(100 * family, 100 * family + 4))
        requests.append(
            Request(
                f"r{index}",
                index * 1.5,
                rng.randint(2100, 3000),
                rng.randint(20, 200),
                prefix_blocks=prefix,
                prefix_block_size=512 if prefix else None,
            )
        )
    trace = Trace(tuple(requests))
    routed = simulate_replicas(trace, config(False), H100, replicas=3, router="prefix-aware")
    homes = [
        {routed.assignment[i] for i, f in enumerate(families) if f == family} for family in (0, 1)
    ]
    assert [len(home) for home in homes] == [1, 1]
    assert homes[0] != homes[1]  # the second prompt went to the least loaded replica
    spread = simulate_replicas(trace, config(False), H100, replicas=3, router="round-robin")
    assert routed.result.prefix_cache_hits > spread.result.prefix_cache_hits


def test_prefix_aware_balances_once_one_replica_is_far_ahead() -> None:
    """Every request shares one prefix, in a burst: past SGLang's imbalance thresholds (32
    more in flight) the router sends them to the least loaded replica instead."""
    requests = tuple(
        Request(f"r{i}", i * 0.001, 3000, 400, prefix_blocks=(1, 2, 3, 4), prefix_block_size=512)
        for i in range(100)
    )
    routed = simulate_replicas(
        Trace(requests), config(False), H100, replicas=2, router="prefix-aware"
    )
    first = routed.assignment[0]
    # 33 in flight on one replica (more than 32 ahead) before the next goes elsewhere
    assert routed.assignment[:33] == [first] * 33
    assert routed.assignment[33] == 1 - first
    assert routed.assignment.count(1 - first) >= 30


def test_utilisation_is_the_busy_share_of_the_run() -> None:
    trace = mixed_trace()
    routed = simulate_replicas(trace, config(True), H100, replicas=4, router="least-outstanding")
    shares = routed.utilisation()
    assert all(0 < share < 1 for share in shares)
    assert sum(s.requests for s in routed.replicas) == len(trace.requests)
    single = simulate(trace, config(True), H100)
    # four replicas do at least the work of one (smaller batches are less efficient)
    assert sum(s.busy_s for s in routed.replicas) >= 0.95 * single.busy_s


# A closed-loop client in front of the router ---------------------------------------------
def in_flight_peak(records) -> int:
    """The most requests in flight at once, from the records (see test_sim_engine.py)."""
    events = sorted(
        [(r.sent_s, 1) for r in records if r.token_times_s]
        + [(r.token_times_s[-1], -1) for r in records if r.token_times_s]
    )
    peak = current = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def records_of(records: list) -> list[tuple[str, float, list[float], str | None]]:
    return [(r.id, r.sent_s, list(r.token_times_s), r.error) for r in records]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_under_a_client_limit_is_the_single_engine(
    async_scheduling: bool, router: str
) -> None:
    trace = mixed_trace()
    for limit in (1, 4):
        single = simulate(trace, config(async_scheduling), H100, max_concurrency=limit)
        one = simulate_replicas(
            trace, config(async_scheduling), H100, replicas=1, router=router, max_concurrency=limit
        )
        assert records_of(one.result.records) == records_of(single.records)
        assert one.result.steps == single.steps


@pytest.mark.parametrize("limit", [1, 3, 9])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_client_limit_holds_over_all_replicas(async_scheduling: bool, limit: int) -> None:
    """At most N in flight over the replicas together, requests sent in arrival order; and
    each replica's schedule is still exactly the single engine's on what it was sent, at the
    moments it was sent."""
    trace = mixed_trace(seed=2)
    open_loop = simulate_replicas(
        trace, config(async_scheduling), H100, replicas=3, router="least-outstanding"
    )
    assert in_flight_peak(open_loop.result.records) > 9
    routed = simulate_replicas(
        trace,
        config(async_scheduling),
        H100,
        replicas=3,
        router="least-outstanding",
        max_concurrency=limit,
    )
    records = routed.result.records
    assert all(r.completed for r in records)
    assert in_flight_peak(records) == limit
    assert [r.sent_s for r in records] == sorted(r.sent_s for r in records)
    assert all(r.sent_s >= q.arrival_s for r, q in zip(records, trace.requests, strict=True))
    for replica in range(3):
        share = Trace(
            tuple(
                dataclasses.replace(request, arrival_s=record.sent_s)
                for request, record, home in zip(
                    trace.requests, records, routed.assignment, strict=True
                )
                if home == replica
            )
        )
        alone = simulate(share, config(async_scheduling), H100)
        mine = [r for r, home in zip(records, routed.assignment, strict=True) if home == replica]
        assert records_of(mine) == records_of(alone.records)
        assert routed.replicas[replica].steps == alone.steps


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_limit_at_the_replicas_peak_changes_nothing(async_scheduling: bool) -> None:
    trace = mixed_trace(seed=2)
    open_loop = simulate_replicas(
        trace, config(async_scheduling), H100, replicas=3, router="prefix-aware"
    )
    peak = in_flight_peak(open_loop.result.records)
    for limit in (peak, len(trace.requests)):
        closed = simulate_replicas(
            trace,
            config(async_scheduling),
            H100,
            replicas=3,
            router="prefix-aware",
            max_concurrency=limit,
        )
        assert closed.result.records == open_loop.result.records
        assert closed.assignment == open_loop.assignment
        assert closed.result.steps == open_loop.result.steps
