"""Starting and stopping a vLLM server for one trial, leaving nothing behind.

The server runs in its own process group (not its own session: started with ``setsid`` the
replay client was starved for seconds at a time on small machines, docs/cpu-recipe.md), on a
free localhost port, with its output in a log file per trial, written line by line as it comes
with every secret hidden (``prefill_tuner.redaction``: vLLM logs its arguments, a tracing
exporter its endpoint's URL, and the server needs the real values). It is stopped with SIGTERM to
that group, then SIGKILL if it lingers. If the tuner itself dies without cleaning up (SIGKILL,
a crash of the interpreter), the kernel sends the server SIGTERM (``PR_SET_PDEATHSIG``), and the
server stops its own children. Processes are only ever addressed by our own PID or group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from prefill_tuner.errors import TunerError
from prefill_tuner.redaction import redact_text

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LOG_SETTLE_S = 2.0
"""How long a server that exited may take to have its last words in its log (at once when
none of its processes is left holding its output)."""


class ServerStartError(TunerError):
    """The server did not become healthy; ``reason`` is classified from its log."""

    def __init__(self, reason: str, log_path: Path) -> None:
        self.reason = reason
        self.log_path = log_path
        super().__init__(f"vLLM did not start: {reason} (log: {log_path})")


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server."""

    model: str
    args: Sequence[str] = ()
    """``vllm serve`` flags after the model (the trial's settings and any extra ones)."""
    log_path: Path = Path("vllm-server.log")
    python: str | None = None
    """Run ``PYTHON -m vllm.entrypoints.openai.api_server`` (vLLM in its own environment)."""
    serve_command: Sequence[str] = ()
    """Or this command instead of ``vllm serve`` (e.g. ``["vllm", "serve"]`` or a wrapper)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the server (``VLLM_CPU_KVCACHE_SPACE``, ``CUDA_VISIBLE_DEVICES``)."""
    host: str = "127.0.0.1"
    startup_timeout_s: float = 600.0

    def command(self, port: int) -> list[str]:
        if self.serve_command:
            base = [*self.serve_command, self.model]
        elif self.python:
            base = [self.python, "-m", API_SERVER_MODULE, "--model", self.model]
        else:
            base = ["vllm", "serve", self.model]
        return [*base, *self.args, "--host", self.host, "--port", str(port)]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _in_own_group_dying_with_parent() -> None:
    """In the child before exec: a process group of its own, whose id is its pid (Popen's
    ``process_group=0``, which Python 3.10 does not have), and SIGTERM when the tuner dies
    (Linux only)."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


class VllmServer:
    """A running vLLM server; a context manager that always stops it."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        """Seconds from the start to the first healthy answer."""
        self._started = 0.0
        self._log_writer: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        """Whether its process runs (started and not exited)."""
        return self.process is not None and self.process.poll() is None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.port = free_port(self.spec.host)
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        log = self.spec.log_path.open("wb")
        self._started = time.monotonic()
        try:
            self.process = subprocess.Popen(
                self.spec.command(self.port),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_in_own_group_dying_with_parent,
            )
        except OSError as exc:
            log.close()
            raise ServerStartError(
                f"cannot run {self.spec.command(self.port)[0]}: {exc.strerror or exc}",
                self.spec.log_path,
            ) from None
        assert self.process.stdout is not None
        self._log_writer = threading.Thread(
            target=_write_log, args=(self.process.stdout, log), name="server log", daemon=True
        )
        self._log_writer.start()

    def log_settled(self, timeout_s: float = LOG_SETTLE_S) -> None:
        """Wait, at most ``timeout_s``, until all the server has said is in its log (its
        processes are gone and their output is written)."""
        if self._log_writer is not None:
            self._log_writer.join(timeout_s)

    def wait_healthy(self) -> None:
        """Poll ``/health`` until it answers 200; fail early if the server exits."""
        assert self.process is not None
        deadline = time.monotonic() + self.spec.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    self.log_settled()
                    raise ServerStartError(
                        classify_failure(self.spec.log_path, code), self.spec.log_path
                    )
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        self.startup_s = time.monotonic() - self._started
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"not healthy after {self.spec.startup_timeout_s:.0f} s",
                        self.spec.log_path,
                    )
                # Poll every half second, returning at once if the server exits.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=0.5)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL if any of it is left after
        ``grace_s``."""
        process = self.process
        if process is None:
            return
        group = process.pid  # its own group (see _in_own_group_dying_with_parent)
        if not _signal_and_wait(process, group, signal.SIGTERM, grace_s, resume=True):
            _signal_and_wait(process, group, signal.SIGKILL, 10.0)
        self.log_settled()
        self.process = None


def _write_log(output: IO[bytes], log: IO[bytes]) -> None:
    """Copy a server's output to its log as it comes, line by line, every secret hidden
    (:func:`prefill_tuner.redaction.redact_text`), until the last of its processes closes
    it. A log that can no longer be written (a full disk) is still read, so that the server
    never blocks on its output."""
    writable = True
    with output, log:
        for line in output:
            if not writable:
                continue
            text = redact_text(line.decode("utf-8", "surrogateescape"))
            try:
                log.write(text.encode("utf-8", "surrogateescape"))
                log.flush()
            except OSError:
                writable = False


def group_members(group: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc (Linux)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(entry.name))
    return members


def _signal_and_wait(
    process: subprocess.Popen[bytes],
    group: int,
    sig: signal.Signals,
    timeout_s: float,
    resume: bool = False,
) -> bool:
    """Signal the group; True once none of it is alive (within ``timeout_s``). ``resume``:
    also SIGCONT, so that a stopped (hung) process handles the signal too."""
    try:
        os.killpg(group, sig)
        if resume:
            os.killpg(group, signal.SIGCONT)
    except ProcessLookupError:
        process.poll()
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        process.poll()  # reap the leader, so it does not linger as a zombie
        if not group_members(group):
            return True
        if time.monotonic() > deadline:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.1)


_FAILURES = (
    (re.compile(r"unrecognized arguments?: (.+)"), "vLLM rejected a flag: {0}"),
    (re.compile(r"error: argument ([^:]+): (.+)"), "vLLM rejected {0}: {1}"),
    (re.compile(r"(?i)(out of memory|OutOfMemoryError|Cannot allocate memory)"), "out of memory"),
    (
        re.compile(r"(?i)(max_model_len|max seq len).*(larger than|KV cache|too (?:large|small))"),
        "the KV cache is too small for max_model_len",
    ),
    (
        re.compile(r"(?i)(No available memory for the cache blocks|insufficient.*KV cache)"),
        "no memory left for the KV cache",
    ),
    (re.compile(r"(?i)Value error, (.+?)(?: \[type=|$)"), "configuration rejected: {0}"),
    (re.compile(r"(?i)address already in use"), "the port was taken"),
)


_VLLM_PREFIX = re.compile(r"^(\(\w+ pid=\d+\) )?((?P<level>[A-Z]+) \d\d-\d\d [\d:]+ \[[^\]]+\] )?")
_EXCEPTION = re.compile(r"\b(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Exit)): (?P<message>.+)")
_UNEXPECTED = re.compile(
    r"(?i)(died|exited|terminated) unexpectedly|Fatal Python error|Segmentation fault"
)
_NOISE = re.compile(r"(?i)UserWarning|resource_tracker|warnings\.warn|KeyError: '/psm_")
_QUIET_LEVELS = ("DEBUG", "INFO", "WARNING")
"""vLLM logs handled exceptions at these levels (a missing tokenizer at start-up): no cause."""


def _tail(log_path: Path, count: int = 400) -> list[str]:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-count:]


def failure_cause(log_path: Path) -> str | None:
    """Why the server failed, from its log: a known failure (a flag rejected, out of memory),
    else the root exception (``EngineDeadError: RuntimeError: ...``, the engine core's own
    error before vLLM's generic ``EngineDeadError``) or a process that died unexpectedly;
    ``None`` when the log says nothing of it."""
    lines = _tail(log_path)
    return _known_failure(lines) or _root_cause(lines)


def _known_failure(lines: list[str]) -> str | None:
    """The last line that matches a known failure, as its reason."""
    for line in reversed(lines):
        for pattern, template in _FAILURES:
            match = pattern.search(line)
            if match:
                return template.format(*(g.strip() for g in match.groups()))
    return None


def _root_cause(lines: list[str]) -> str | None:
    root: str | None = None
    dead: str | None = None
    unexpected: str | None = None
    for raw in lines:
        prefix = _VLLM_PREFIX.match(raw.strip())
        line = raw.strip()[prefix.end() :] if prefix else raw.strip()
        if not line or _NOISE.search(line) or line.startswith(("File ", "raise ", "^")):
            continue
        if _UNEXPECTED.search(line):
            unexpected = line.removeprefix("[shutdown] ")
        if prefix and prefix["level"] in _QUIET_LEVELS:
            continue
        match = _EXCEPTION.search(line)
        if match:
            name = match["name"].rsplit(".", 1)[-1]
            text = f"{name}: {match['message'].strip()}"
            if name == "EngineDeadError":
                dead = name
            else:
                root = text
    cause = root or unexpected
    if dead:
        return f"{dead}: {cause}"[:400] if cause else "EngineDeadError (the engine core failed)"
    return cause[:400] if cause else None


def classify_failure(log_path: Path, exit_code: int | None = None) -> str:
    """A one-line reason from a failed server's log: :func:`failure_cause`, else its last
    line."""
    lines = _tail(log_path)
    known = _known_failure(lines)
    if known:
        return known
    code = f"exited with code {exit_code}: " if exit_code is not None else ""
    cause = _root_cause(lines)
    if cause:
        return f"{code}{cause}"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
    return f"{code}{last[:300]}"
