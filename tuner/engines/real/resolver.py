"""One long-lived process that answers questions about vLLM's configuration.

Importing vLLM takes about 13 s on a small machine and a resolution then takes milliseconds, so
a study keeps one ``vllm_args.py loop`` process in vLLM's Python and asks it everything: the
version, flags and default config once, then every trial's resolved config. The process reads
its questions from a pipe and ends at its end, so it ends with the tuner however the tuner
ends (even SIGKILL); :meth:`VllmResolver.close` ends it sooner.
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from prefill_tuner.engines.vllm_python import run_vllm_script
from prefill_tuner.errors import TunerError

VLLM_ARGS = Path(__file__).resolve().parent.parent / "vllm_args.py"


class VllmQueryError(TunerError):
    """vLLM refused the arguments (the message is its reason, one line)."""


def error_line(text: str) -> str:
    """The line of vLLM's output that says what was wrong (the last error named), shortened."""
    lines = [line for line in text.splitlines() if line.strip()]
    detail = next(
        (line for line in reversed(lines) if "Error" in line or "error:" in line),
        lines[-1] if lines else "",
    )
    return detail.split("Value error, ")[-1].strip().removeprefix("error: ")[:400]


def ask_vllm(python: str, *args: str, timeout_s: float = 600) -> Any:
    """Run ``vllm_args.py`` once in vLLM's Python and return its JSON answer (one question;
    a study asks its :class:`VllmResolver`, one process for every question)."""
    completed = run_vllm_script(python, VLLM_ARGS, args, timeout_s=timeout_s)
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    if completed.returncode != 0 or not lines:
        raise VllmQueryError(error_line(completed.stderr) or f"exit code {completed.returncode}")
    return json.loads(lines[-1])


class VllmResolver:
    """``probe`` and ``resolve`` answered by one ``vllm_args.py loop`` process, started on the
    first question."""

    def __init__(self, python: str, *, timeout_s: float = 600) -> None:
        self.python = python
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._stderr: IO[str] | None = None
        self._lock = threading.Lock()

    def probe(self, model: str, args: Sequence[str]) -> dict[str, Any]:
        """vLLM's version, accepted flags, and the default config (or why it refuses)."""
        return self._ask("probe", [model, *args])

    def resolve(self, model: str, args: Sequence[str]) -> dict[str, Any]:
        """The engine config ``vllm serve MODEL ARGS`` would build; :class:`VllmQueryError`
        with vLLM's reason when it refuses."""
        return self._ask("resolve", [model, *args])

    def close(self) -> None:
        """End the process (it would end by itself when the tuner exits)."""
        with self._lock:
            process, self._process = self._process, None
            if process is None:
                return
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()  # this process only, by its handle
                process.wait()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None

    def __enter__(self) -> VllmResolver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ask(self, command: str, args: list[str]) -> dict[str, Any]:
        with self._lock:
            process = self._start()
            assert process.stdin is not None
            try:
                process.stdin.write(json.dumps({"command": command, "args": args}) + "\n")
                process.stdin.flush()
                line = self._answers.get(timeout=self.timeout_s)
            except (BrokenPipeError, queue.Empty):
                line = None
            if line is None:
                reason = self._died()
                raise TunerError(f"vLLM's config helper ({self.python}) {reason}")
        reply = json.loads(line)
        if "error" in reply:
            raise VllmQueryError(error_line(reply["error"]) or "vLLM refused the arguments")
        return reply["answer"]

    def _start(self) -> subprocess.Popen[str]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        # Lives as long as the process (closed in close()): its last lines say why it died.
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [self.python, str(VLLM_ARGS), "loop"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                bufsize=1,
                start_new_session=True,  # a Ctrl-C is the tuner's to handle, not the helper's
            )
        except OSError as exc:
            raise TunerError(f"cannot run vLLM's Python {self.python}: {exc}") from None
        self._answers = queue.Queue()
        threading.Thread(
            target=_read_lines, args=(self._process.stdout, self._answers), daemon=True
        ).start()
        return self._process

    def _died(self) -> str:
        """Why no answer came: the process ended (its last error line) or it took too long."""
        process = self._process
        self._process = None
        if process is None:
            return "is not running"
        if process.poll() is None:
            process.kill()
            process.wait()
            return f"gave no answer within {self.timeout_s:.0f} s"
        text = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            text = self._stderr.read()
        said = error_line(text) or "no output"
        if "No module named 'vllm'" in said:  # the tuner's own Python, most often
            said += (
                "; give the Python that has vLLM as `vllm_python` (e.g. "
                ".venv-vllm/bin/python), or install vLLM beside the tuner"
            )
        return f"exited with code {process.returncode}: {said}"


def _read_lines(stream: IO[str] | None, answers: queue.Queue[str | None]) -> None:
    """Hand every line of the helper's stdout to the asker; ``None`` at its end."""
    if stream is not None:
        for line in stream:
            if line.strip():
                answers.put(line)
    answers.put(None)
