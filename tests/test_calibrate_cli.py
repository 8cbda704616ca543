"""``tune calibrate``'s command line: ``--set`` as ``tune run`` takes it, reaching the
calibration server (its ``max_model_len`` bounding the designed workload). The profile's
name: tests/test_calibration.py (``--from-study``: the study's model's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefill_tuner.cli import calibrate_cmd
from prefill_tuner.engines.base import EngineRun


class FakeServer:
    """A real engine's face, whose one run fails (after showing what it was given)."""

    version = "vllm 0.32.0"

    def __init__(self) -> None:
        self.validated: dict[str, Any] = {}
        self.runs: list[tuple[Any, dict[str, Any]]] = []

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
