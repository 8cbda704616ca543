"""A ``--serve-cmd`` wrapper that starts a real vLLM server and injects a fault once the replay
is under way, to test that crashes and hangs during a replay are caught and classified.

Usage: ``python fault_server.py PLAN VLLM_PYTHON MODEL ARGS...`` (the tuner appends MODEL and
ARGS, including ``--port``). PLAN is a file with one fault per line (``crash``, ``engine``,
``hang`` or ``none``); each start takes the first line and removes it, so the trials of one
study get one fault each. Once ``/metrics`` shows a request running, ``crash`` kills the server
(SIGKILL) and exits 1; ``engine`` kills only its engine core process (SIGKILL, as the OOM
killer would), leaving the API server to notice (``EngineDeadError``); ``hang`` stops it
(SIGSTOP) and waits, like a server stuck in a kernel.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

POLL_S = 0.2


def take_fault(plan: Path) -> str:
    lines = plan.read_text().split()
    plan.write_text("\n".join(lines[1:]))
    return lines[0] if lines else "none"


def die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def running_requests(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    ]
    return sum(values)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def main() -> int:
    plan, python, model, *args = sys.argv[1:]
    fault = take_fault(Path(plan))
    port = int(args[args.index("--port") + 1])
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *args]
    server = subprocess.Popen(command, preexec_fn=die_with_parent)
    if fault == "none":
        return server.wait()
    while running_requests(port) < 1:  # the replay has a request in the engine
        if server.poll() is not None:
            return server.returncode
        time.sleep(POLL_S)  # polling a condition, not waiting for one to happen
    print(f"fault_server: injecting {fault}", flush=True)
    if fault == "crash":
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        return 1
    if fault == "engine":
        for child in children(server.pid):
            if "EngineCor" in (Path("/proc") / str(child) / "comm").read_text():
                os.kill(child, signal.SIGKILL)
        return server.wait()
    os.kill(server.pid, signal.SIGSTOP)
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
