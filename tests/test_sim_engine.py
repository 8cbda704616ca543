"""The simulation loop: fast-forwarded decode runs change nothing; time, metrics, profiles;
closed-loop load (a client that keeps at most N requests in flight)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prefill_tuner.engines.sim import (
    ConstantProfile,
    SimConfig,
    StepRecord,
    load_profile,
    simulate,
)
from prefill_tuner.engines.sim.cost_model import StepShape
from prefill_tuner.engines.sim.scheduler import Scheduler, SteadyRun
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.metrics import summarize_run
from prefill_tuner.trace import ShapeOptions, load_trace
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import AZURE, MOONCAKE
from tests.support.sim_scenarios import LINEAR, random_scenario

H100 = load_profile("llama-3.1-8b-h100")


def both_ways(trace: Trace, config: SimConfig, profile=H100, max_concurrency: int | None = None):
    runs = []
    for fast in (True, False):
        steps: list[StepRecord] = []
        result = simulate(
            trace,
            config,
            profile,
            on_step=steps.append,
            fast_forward=fast,
            max_concurrency=max_concurrency,
        )
        runs.append((result, steps))
    return runs


def assert_identical(runs) -> None:
    (fast, fast_steps), (slow, slow_steps) = runs
    assert fast_steps == slow_steps
    assert [list(r.token_times_s) for r in fast.records] == [
        list(r.token_times_s) for r in slow.records
    ]
    assert [r.sent_s for r in fast.records] == [r.sent_s for r in slow.records]
    # Compared as written: a statistic of no values is NaN (a scenario where no request has
    # a second token has no TPOT), and NaN == NaN only when both are the same float object.
    assert repr(fast.metrics) == repr(slow.metrics)
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


@pytest.mark.parametrize("limit", [1, 5, 12])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_fast_forward_is_exact_under_a_client_limit(async_scheduling: bool, limit: int) -> None:
    """With a closed-loop client, requests reach the engine when others finish: stepping and
    fast-forwarding still agree exactly (sends included)."""
    azure = load_trace(str(AZURE), options=ShapeOptions(max_requests=200))
    mode = {"async_scheduling": async_scheduling}
    runs = both_ways(azure, SimConfig(**{**H100.engine_defaults, **mode}), max_concurrency=limit)
    held = zip(runs[0][0].records, azure.requests, strict=True)
    assert any(record.sent_s > request.arrival_s for record, request in held)
    assert_identical(runs)
    mooncake = load_trace(
        str(MOONCAKE), options=ShapeOptions(rate_scale=0.1, max_model_len=32768, max_requests=150)
    )
    config = SimConfig(
        **{**H100.engine_defaults, "max_model_len": 32768, "num_gpu_blocks": 2500, **mode}
    )
    assert_identical(both_ways(mooncake, config, max_concurrency=limit))


@settings(max_examples=80)
@given(st.integers(0, 2**31), st.booleans(), st.sampled_from([None, 1, 2, 3]))
@example(87051068, False, None)  # no request gets a second token: TPOT and ITL are NaN
def test_fast_forward_is_exact_on_random_scenarios(
    seed: int, async_scheduling: bool, limit: int | None
) -> None:
    trace, config = random_scenario(seed, async_scheduling=async_scheduling)
    assert_identical(both_ways(trace, config, ConstantProfile(step_ms=7.0), limit))
    assert_identical(both_ways(trace, config, H100, limit))


@pytest.mark.parametrize("interval", [2, 4])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_fast_forward_is_exact_under_a_prefill_cadence(
    async_scheduling: bool, interval: int
) -> None:
    """vLLM 0.33's ``prefill_schedule_interval``: decode runs are still fast-forwarded (its
    counters carried through them), and stepping and fast-forwarding agree exactly, on a
    real trace and under a client limit."""
    cadence = {"async_scheduling": async_scheduling, "prefill_schedule_interval": interval}
    azure = load_trace(str(AZURE), options=ShapeOptions(max_requests=300))
    config = SimConfig(**{**H100.engine_defaults, **cadence})
    with counting_runs() as kinds:
        runs = both_ways(azure, config)
    assert kinds["decode"] > 0
    assert_identical(runs)
    held = both_ways(azure, config, max_concurrency=8)
    assert_identical(held)
    plain = simulate(
        azure, SimConfig(**{**H100.engine_defaults, "async_scheduling": async_scheduling}), H100
    )
    assert plain.metrics.ttft_s["mean"] != runs[0][0].metrics.ttft_s["mean"]  # it holds prefills
    for seed in range(30):
        trace, scenario_config = random_scenario(seed, async_scheduling=async_scheduling)
        config = SimConfig(
            **{**scenario_config.model_dump(), "prefill_schedule_interval": interval}
        )
        assert_identical(both_ways(trace, config, ConstantProfile(step_ms=7.0), 3))


@contextlib.contextmanager
def counting_runs() -> Iterator[collections.Counter[str]]:
    """Count the fast-forwarded runs by kind while the block runs."""
    kinds: collections.Counter[str] = collections.Counter()
    apply = Scheduler.apply_steady_run

    def counted(self: Scheduler, run: SteadyRun, steps: int, times: list[float]):  # type: ignore[no-untyped-def]
        kinds["chunk" if run.chunks else "decode"] += 1
        kinds["several chunks"] += len(run.chunks) > 1
        caching = self.kv.enable_caching
        kinds["chunk, prefix cache"] += bool(run.chunks) and caching
        kinds["several chunks, prefix cache"] += len(run.chunks) > 1 and caching
        kinds["past finishes"] += any(last < steps for last in run.lasts)
        return apply(self, run, steps, times)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Scheduler, "apply_steady_run", counted)
        yield kinds


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_every_kind_of_run_is_fast_forwarded_exactly(async_scheduling: bool) -> None:
    """Random scenarios (prefix cache on and off, preemption pressure, chunked prefill, the
    long-prefill threshold), open and closed loop, on a constant, a linear and a kernels
    profile: every kind of fast-forwarded run occurs (a prefill chunk with decodes, plain
    decodes, decodes past finishes) and stepping gives the same steps, times and sends."""
    with counting_runs() as kinds:
        for seed in range(60):
            trace, config = random_scenario(seed, async_scheduling=async_scheduling)
            profile = (ConstantProfile(step_ms=7.0), LINEAR, H100)[seed % 3]
            for limit in (None, 1 + seed % 3):
                assert_identical(both_ways(trace, config, profile, limit))
    assert min(kinds["decode"], kinds["past finishes"]) >= 20, kinds
    assert kinds["chunk"] >= 10 and kinds["several chunks"] >= 3, kinds
    assert kinds["chunk, prefix cache"] >= 10 and kinds["several chunks, prefix cache"] >= 3, kinds


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_small_budgets_fast_forward_exactly_on_a_real_trace(async_scheduling: bool) -> None:
    """A rule trial's setting (a token budget just above the decode batch) on Mooncake
    with a small pool: prompts go in many chunks beside decodes, under KV pressure, with
    prefix hits; fast-forwarding them changes nothing."""
    mooncake = load_trace(
        str(MOONCAKE), options=ShapeOptions(rate_scale=0.1, max_model_len=32768, max_requests=150)
    )
    config = SimConfig(
        **{
            **H100.engine_defaults,
            "max_model_len": 32768,
            "num_gpu_blocks": 2500,
            "max_num_batched_tokens": 403,
            "max_num_seqs": 256,
            "async_scheduling": async_scheduling,
        }
    )
    for caching in (True, False):
        with counting_runs() as kinds:
            runs = both_ways(mooncake, config.model_copy(update={"enable_prefix_caching": caching}))
        assert runs[0][0].preemptions > 0 and (runs[0][0].prefix_cache_hits > 0) == caching
        assert kinds["chunk"] > 100, kinds
        assert_identical(runs)


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
    assert H100.decode_steps_seconds(32, 32_000, 5) == singles
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


# Closed-loop load ---------------------------------------------------------------------------
def in_flight_peak(records) -> int:
    """The most requests in flight at once (sent, last token not yet delivered), from the
    records: a request sent the moment another's last token came is not in flight with it."""
    events = sorted(
        [(r.sent_s, 1) for r in records if r.token_times_s]
        + [(r.token_times_s[-1], -1) for r in records if r.token_times_s]
    )
    peak = current = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def busy_trace() -> Trace:
    """400 Azure conversations at 4× their rate: dozens in flight at once."""
    return load_trace(str(AZURE), options=ShapeOptions(max_requests=400, rate_scale=4))


@pytest.mark.parametrize("limit", [1, 2, 7, 30])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_a_client_limit_holds_the_requests_in_flight(async_scheduling: bool, limit: int) -> None:
    """At every moment at most N requests are in flight, as the records show; requests go in
    arrival order, none before its arrival, and one waits only while N others are in flight."""
    trace = busy_trace()
    config = SimConfig(**{**H100.engine_defaults, "async_scheduling": async_scheduling})
    assert in_flight_peak(simulate(trace, config, H100).records) > 30
    records = simulate(trace, config, H100, max_concurrency=limit).records
    assert all(r.completed for r in records)
    assert in_flight_peak(records) == limit
    sent = [r.sent_s for r in records]
    assert sent == sorted(sent)
    finishes = sorted(r.token_times_s[-1] for r in records)
    for index, (record, request) in enumerate(zip(records, trace.requests, strict=True)):
        assert record.sent_s >= request.arrival_s
        if record.sent_s > request.arrival_s:  # it waited: sent as a slot freed
            assert record.sent_s in finishes
            just_before = [
                r
                for r in records[:index]
                if r.sent_s < record.sent_s and r.token_times_s[-1] >= record.sent_s
            ]
            assert len(just_before) == limit  # every slot was taken until then


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_one_request_in_flight_serialises_the_trace(async_scheduling: bool) -> None:
    trace = busy_trace()
    config = SimConfig(**{**H100.engine_defaults, "async_scheduling": async_scheduling})
    records = simulate(trace, config, H100, max_concurrency=1).records
    for earlier, later in itertools.pairwise(records):
        assert later.sent_s >= earlier.token_times_s[-1]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_a_limit_at_the_peak_concurrency_changes_nothing(async_scheduling: bool) -> None:
    """N at least the open loop's peak: no request ever waits, and the run is the open loop's,
    bit for bit (every step, token and send)."""
    trace = busy_trace()
    config = SimConfig(**{**H100.engine_defaults, "async_scheduling": async_scheduling})
    open_steps: list[StepRecord] = []
    open_loop = simulate(trace, config, H100, on_step=open_steps.append)
    peak = in_flight_peak(open_loop.records)
    for limit in (peak, peak + 1, len(trace)):
        steps: list[StepRecord] = []
        closed = simulate(trace, config, H100, on_step=steps.append, max_concurrency=limit)
        assert steps == open_steps
        assert closed.records == open_loop.records
        assert closed.metrics == open_loop.metrics
    below = simulate(trace, config, H100, max_concurrency=peak - 1)
    assert below.records != open_loop.records


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_ttft_counts_from_the_send(async_scheduling: bool) -> None:
    """Two requests arrive together, one allowed in flight: the second is sent when the first
    delivers its last token, and its TTFT and E2E latency count from then."""
    trace = Trace((Request("a", 0.0, 10, 3), Request("b", 0.0, 10, 2)))
    config = SimConfig(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=64,
        num_gpu_blocks=64,
        async_scheduling=async_scheduling,
    )
    a, b = simulate(trace, config, ConstantProfile(step_ms=10), max_concurrency=1).records
    assert a.sent_s == 0.0 and a.token_times_s == pytest.approx([0.01, 0.02, 0.03])
    assert b.sent_s == pytest.approx(0.03)
    assert b.token_times_s == pytest.approx([0.04, 0.05])
    metrics = summarize_run([a, b])
    assert metrics.ttft_s["max"] == pytest.approx(0.01)
    assert metrics.e2el_s["max"] == pytest.approx(0.03)


@pytest.mark.parametrize("limit", [1, 3, 12])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_the_engine_sees_a_held_request_as_an_arrival_at_its_send(
    async_scheduling: bool, limit: int
) -> None:
    """A closed-loop run is exactly the open-loop run of the same requests arriving when the
    client sent them: the limit only decides when requests are sent."""
    trace = busy_trace()
    config = SimConfig(**{**H100.engine_defaults, "async_scheduling": async_scheduling})
    closed = simulate(trace, config, H100, max_concurrency=limit)
    as_sent = Trace(
        tuple(
            dataclasses.replace(request, arrival_s=record.sent_s)
            for request, record in zip(trace.requests, closed.records, strict=True)
        )
    )
    replayed = simulate(as_sent, config, H100)
    assert replayed.records == closed.records
    assert replayed.steps == closed.steps


def test_a_rejected_request_waits_its_turn_and_holds_no_slot() -> None:
    """A request longer than max_model_len is refused at once: it is sent in its turn (after
    the one in flight) and the next one goes at the same moment."""
    trace = Trace(
        (Request("a", 0.0, 10, 3), Request("long", 0.0, 100, 1), Request("b", 0.0, 10, 1))
    )
    config = SimConfig(
        max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, num_gpu_blocks=64
    )
    a, long, b = simulate(trace, config, ConstantProfile(step_ms=10), max_concurrency=1).records
    assert long.error is not None and long.error.startswith("rejected")
    assert long.sent_s == b.sent_s == pytest.approx(a.token_times_s[-1])
    assert b.completed


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_a_max_num_seqs_above_the_peak_running_gives_the_same_run(async_scheduling: bool) -> None:
    """``SimResult.peak_running`` below both limits: the two limits give the same run (what
    the simulator engine's memory of runs relies on); at or under it they may differ (and
    in these scenarios some do, so the comparison can tell)."""
    premises = differing = 0
    for seed in range(40):
        trace, config = random_scenario(seed, async_scheduling=async_scheduling)
        runs = {}
        for limit in range(1, min(config.max_num_batched_tokens, 12) + 1):
            moved = SimConfig(
                **{**config.model_dump(), "max_num_seqs": limit, "max_num_active_seqs": None}
            )
            result = simulate(trace, moved, LINEAR, max_concurrency=(None, 2)[seed % 2])
            assert result.peak_running <= limit
            runs[limit] = (result.peak_running, result.records, result.steps)
        for a, (peak, records, steps) in runs.items():
            for b, (_, other, other_steps) in runs.items():
                if peak < min(a, b):
                    premises += 1
                    assert (records, steps) == (other, other_steps), (seed, a, b)
                elif records != other:
                    differing += 1
    assert premises >= 1000 and differing >= 200, (premises, differing)


@pytest.mark.parametrize("host_ms", [4.5, 20.0])
def test_host_bound_async_runs_fast_forward_exactly(host_ms: float) -> None:
    """Under async scheduling a step whose device part is shorter than the next step's host
    part starts when that host part is done, not when the device is free: runs whose steps are
    all host-bound (20 ms of host a step) or some of them (4.5 ms: short decode steps are,
    steps with a prefill are not) give the same steps and times as stepping."""
    profile = LINEAR.model_copy(update={"name": "host-bound", "host_ms": host_ms})
    for seed in range(40):
        trace, config = random_scenario(seed, async_scheduling=True)
        for limit in (None, 2):
            assert_identical(both_ways(trace, config, profile, limit))
