"""``tune calibrate``'s command line: ``--set`` as ``tune run`` takes it, reaching the
calibration server (its ``max_model_len`` bounding the designed workload). The profile's
name: tests/test_calibration.py (``--from-study``: the study's model's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefill_tuner.cli import calibrate_cmd
from prefill_tuner.engines.base import EngineRun


class FakeServer:
    """A real engine's face, whose one run fails (after showing what it was given)."""

    version = "vllm 0.32.0"

    def __init__(self) -> None:
        self.validated: dict[str, Any] = {}
        self.runs: list[tuple[Any, dict[str, Any]]] = []
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def validate_fixed(self, fixed: dict[str, Any]) -> dict[str, Any]:
        self.validated = fixed
        return fixed

    def default_settings(self) -> dict[str, Any]:
        return {"max_num_batched_tokens": 2048, "max_num_seqs": 256}

    def max_model_len(self, fixed: dict[str, Any]) -> int:
        return int(fixed.get("max_model_len", 32768))

    def run(self, trace: Any, settings: dict[str, Any], *args: Any, **kwargs: Any) -> EngineRun:
        self.runs.append((trace, settings))
        return EngineRun(metrics=None, resolved_config={}, version=self.version, failure="stop")


def test_calibrate_takes_set_like_tune_run(tune, tmp_path: Path, monkeypatch) -> None:
    server = FakeServer()
    monkeypatch.setattr(calibrate_cmd, "build_engine", lambda options: server)
    output = tmp_path / "p.yaml"
    code, _, err = tune(
        "calibrate", "--engine", "vllm", "--model", "tiny", "--set", "max_model_len=2048",
        "-o", str(output),
    )  # fmt: skip
    assert code == 2 and "the calibration run failed: stop" in err, err
    assert server.validated == {"max_model_len": 2048}
    assert server.closed  # a failed calibration still stops what its engine keeps
    [(trace, settings)] = server.runs
    assert settings["max_model_len"] == 2048
    assert max(r.prompt_tokens + r.output_tokens for r in trace.requests) <= 2048
    code, _, err = tune(
        "calibrate", "--engine", "vllm", "--set", "max_num_seqs=8", "-o", str(output)
    )
    assert code == 2 and "--set max_num_seqs: give --max-num-seqs" in err, err
    code, _, err = tune("calibrate", "--from-study", "s", "--set", "max_model_len=2048",
                        "-o", str(output))  # fmt: skip
    assert code == 2 and "--set: only with --engine vllm" in err, err
    assert not output.exists()


class SimulatedGpuServer(FakeServer):
    """A GPU server's face whose one run is the simulator with ``truth``, logged as vLLM logs
    it: synchronously the step timer is the step less the host's share, and under async
    scheduling the device time less the host's share of the next step (its timer starts once
    that step is launched); each log line at the step's end."""

    version = "vllm 0.11.0"

    def __init__(self, truth: Any, folder: Path, *, async_scheduling: bool, tp: int = 1) -> None:
        super().__init__()
        self.truth, self.folder = truth, folder
        self.async_scheduling, self.tp = async_scheduling, tp

    def run(self, trace: Any, settings: dict[str, Any], *args: Any, **kwargs: Any) -> EngineRun:
        from prefill_tuner.engines.sim import SimConfig, StepRecord, simulate
        from tests.test_calibration import logged_steps

        self.runs.append((trace, settings))
        config = SimConfig(
            async_scheduling=self.async_scheduling,
            max_num_batched_tokens=settings["max_num_batched_tokens"],
            max_num_seqs=settings["max_num_seqs"],
            max_model_len=settings["max_model_len"],
            long_prefill_token_threshold=settings.get("long_prefill_token_threshold", 0),
            num_gpu_blocks=20_000,
        )
        limit = kwargs.get("max_concurrency")  # the calibration's closed loop
        logs, _, _ = logged_steps(trace, config, self.truth, limit)
        records: list[StepRecord] = []
        result = simulate(
            trace,
            config,
            self.truth,
            on_step=records.append,
            fast_forward=False,
            max_concurrency=limit,
        )
        path = self.folder / "calibration.steps.jsonl"
        with path.open("w") as stream:
            for log, step in zip(logs, records, strict=True):
                host = self.truth.host_seconds(len(step.scheduled))
                timer = step.duration_s - host
                at = 1.8e9 + step.start_s + step.duration_s
                stream.write(json.dumps({**log, "duration_s": timer, "logged_at_s": at}) + "\n")
        scheduler = {
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "max_num_seqs": config.max_num_seqs,
            "max_model_len": config.max_model_len,
            "enable_chunked_prefill": True,
            "long_prefill_token_threshold": config.long_prefill_token_threshold,
            "async_scheduling": self.async_scheduling,
        }
        return EngineRun(
            metrics=result.metrics,
            resolved_config={
                "scheduler_config": scheduler,
                "cache_config": {"block_size": 16, "enable_prefix_caching": True},
                "server_reported": {"cache_config": {"num_gpu_blocks": 20_000}},
                "parallel_config": {"tensor_parallel_size": self.tp},
                "model_config": {"quantization": None},
            },
            version=self.version,
            details={"server_steps": {"trace": str(path)}},
            records=result.records,
        )


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "synchronous"])
def test_refit_on_a_server(tune, tmp_path: Path, monkeypatch, async_scheduling) -> None:
    """``tune calibrate --engine vllm --profile P`` on a (simulated) H100 server whose time
    outside kernels is not the profile's estimate: the designed workload, the refit, the
    report's before and after."""
    from prefill_tuner.calibration import observations
    from prefill_tuner.engines.sim import load_profile

    given = load_profile("llama-3.1-8b-h100")
    terms = {"overhead_ms": 1.2, "per_request_us": 12.0, "host_ms": 2.5, "host_request_us": 20.0}
    server = SimulatedGpuServer(
        given.model_copy(update={**terms, "resend_ms": 2.0}),  # its client: 2 ms a response
        tmp_path,
        async_scheduling=async_scheduling,
    )
    monkeypatch.setattr(calibrate_cmd, "build_engine", lambda options: server)
    monkeypatch.setattr(observations, "hardware", lambda: "1× NVIDIA H100 80GB HBM3")
    output = tmp_path / "refit.yaml"
    code, out, err = tune(
        "calibrate", "--engine", "vllm", "--model", "meta-llama/Llama-3.1-8B-Instruct",
        "--set", "max_model_len=4096", "--max-num-seqs", "64", "--profile", "llama-3.1-8b-h100",
        "-o", str(output),
    )  # fmt: skip
    assert code == 0, err
    assert "refitting llama-3.1-8b-h100's time outside kernels to" in err
    profile = load_profile(str(output))
    assert profile.kind == "kernels" and profile.gemms == given.gemms
    assert profile.overhead_ms == pytest.approx(terms["overhead_ms"], abs=0.15)
    assert profile.per_request_us == pytest.approx(terms["per_request_us"], abs=3.0)
    assert profile.host_ms == pytest.approx(terms["host_ms"], abs=0.1)
    assert profile.host_request_us == pytest.approx(terms["host_request_us"], abs=3.0)
    assert profile.resend_ms == pytest.approx(2.0, abs=0.01)  # measured in the closed loop
    provenance = profile.provenance
    assert provenance.kind == "calibrated" and provenance.vllm_version == "vllm 0.11.0"
    assert provenance.hardware == "1× NVIDIA H100 80GB HBM3"  # the server's machine
    assert "designed workload" in provenance.method and "designed" in provenance.workload
    assert "before → after" in out and "warning" not in out
    assert ("scheduled asynchronously" in out) == async_scheduling
    # Another GPU, another tensor-parallel size: said, not refused.
    server.tp = 2
    monkeypatch.setattr(observations, "hardware", lambda: "2× NVIDIA A100-SXM4-80GB")
    code, out, err = tune(
        "calibrate", "--engine", "vllm", "--set", "max_model_len=4096", "--max-num-seqs", "64",
        "--profile", "llama-3.1-8b-h100", "-o", str(output),
    )  # fmt: skip
    assert code == 0, err
    assert "warning: the server runs on 2× NVIDIA A100-SXM4-80GB" in out
    assert "warning: the server's tensor-parallel size is 2" in out


def test_refit_refuses_vllm_cpu_before_a_server_starts(tune, tmp_path: Path, monkeypatch) -> None:
    """A kernels profile's kernels are a GPU's: vllm-cpu's steps less their sum are not time
    outside kernels, so the refit is refused before any server starts."""
    server = FakeServer()
    server.version = "vllm 0.32.0 (vllm-cpu 0.32.0)"
    monkeypatch.setattr(calibrate_cmd, "build_engine", lambda options: server)
    code, _, err = tune(
        "calibrate", "--engine", "vllm", "--profile", "llama-3.1-8b-h100",
        "-o", str(tmp_path / "p.yaml"),
    )  # fmt: skip
    assert code == 2 and "runs on a CPU" in err and "drop --profile" in err, err
    assert server.runs == [] and not (tmp_path / "p.yaml").exists()
    code, _, err = tune(
        "calibrate", "--engine", "vllm", "--profile", "llama-3.1-8b-h100", "--gpu", "h100_sxm",
        "-o", str(tmp_path / "p.yaml"),
    )  # fmt: skip
    assert code == 2 and "give --profile or --gpu" in err, err
