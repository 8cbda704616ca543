"""Profiles say what they are: estimated or calibrated, and how; every run names it."""

from __future__ import annotations

from pathlib import Path

import yaml

from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.cost_model import PROFILES_DIR
from prefill_tuner.engines.sim.hardware import ProfileSpec
from tests.conftest import AZURE


def test_the_shipped_profile_is_measured_and_rebuilds_from_the_tables() -> None:
    """The default profile is the measured-kernel one (no datasheet estimate ships), says
    where its numbers come from, and is exactly what its header's command builds."""
    profile = load_profile("llama-3.1-8b-h100")
    assert profile.provenance.kind == "measured-kernels"
    assert profile.provenance.summary().startswith(
        "measured kernels (vLLM 0.24.0 tables, ai-dynamo/aiconfigurator@095f58a51c4c)"
    )
    header = (PROFILES_DIR / "llama-3.1-8b-h100.yaml").read_text().splitlines()[0]
    assert header == (
        "# made by: tune profile --model meta-llama/Llama-3.1-8B-Instruct --gpu h100_sxm "
        "--name llama-3.1-8b-h100 -o FILE"
    )
    rebuilt = ProfileSpec(gpu="h100_sxm").build(
        "meta-llama/Llama-3.1-8B-Instruct", name="llama-3.1-8b-h100"
    )
    assert profile == rebuilt


def test_runs_name_the_profile_and_its_provenance(tune, tmp_path: Path) -> None:
    data = yaml.safe_load((PROFILES_DIR / "llama-3.1-8b-h100.yaml").read_text())
    data["name"] = "fitted"
    data["provenance"] = {
        "kind": "calibrated",
        "method": "fitted to vLLM's per-step log",
        "vllm_version": "0.32.0",
        "hardware": "AMD EPYC 9654",
        "date": "2026-11-30",
        "held_out_error": {"median": 0.07, "p90": 0.2},
    }
    calibrated = tmp_path / "fitted.yaml"
    calibrated.write_text(yaml.safe_dump(data))
    trace = ["--trace", str(AZURE), "--max-requests", "40"]
    code, out, _ = tune("simulate", *trace)
    assert code == 0 and "profile       measured kernels (vLLM 0.24.0 tables" in out
    code, out, _ = tune("simulate", *trace, "--profile", str(calibrated))
    assert code == 0
    assert "calibrated (fitted to vLLM's per-step log): vLLM 0.32.0, on AMD EPYC 9654" in out
    assert "held-out step-time error 7% (median)" in out
    code, _, err = tune(
        "run", *trace, "--slo", "p99_tpot=50ms", "--trials", "2",
        "--storage", f"sqlite:///{tmp_path / 't.db'}", "--profile", str(calibrated),
    )  # fmt: skip
    assert code in (0, 4), err
    assert "  profile fitted: calibrated (fitted to vLLM's per-step log)" in err
