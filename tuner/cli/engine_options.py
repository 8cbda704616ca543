"""The engine that runs trials (``tune run``, ``tune worker``): its options, and building it."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from search_spaces.space import parse_assignments
from tuner.cli.simulate_cmd import DEFAULT_PROFILE
from tuner.engines.real.engine import VllmEngine
from tuner.engines.real.guard import DEFAULT_HANG_TIMEOUT_S
from tuner.engines.sim import load_profile
from tuner.engines.sim.adapter import SimEngine
from tuner.errors import TunerError

REAL = "Real engine"

EngineOpt = Annotated[str, typer.Option("--engine", help="sim (simulator) or vllm.")]
ProfileOpt = Annotated[
    str, typer.Option("--profile", help="Simulator step-time profile (name or file).")
]
VllmPythonOpt = Annotated[
    str | None,
    typer.Option(
        "--vllm-python",
        help="--engine vllm: the Python that has vLLM (its own venv).",
        rich_help_panel=REAL,
    ),
]
ServeCmdOpt = Annotated[
    str | None,
    typer.Option(
        "--serve-cmd",
        help="--engine vllm: the command the model name follows (default: 'vllm serve' "
        "if that works, else 'PYTHON -m vllm.entrypoints.openai.api_server --model').",
        rich_help_panel=REAL,
    ),
]
ServerArgOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--server-arg",
        help="--engine vllm: extra server arguments, e.g. "
        "'--kv-cache-memory-bytes 268435456' (repeatable).",
        rich_help_panel=REAL,
    ),
]
ServerEnvOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--server-env",
        help="--engine vllm: KEY=VALUE for the server's environment (repeatable).",
        rich_help_panel=REAL,
    ),
]
HangTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--hang-timeout",
        min=1,
        help="--engine vllm: a trial fails when requests are in flight but no token arrives "
        "for this many seconds (the server hung).",
        rich_help_panel=REAL,
    ),
]
LogDirOpt = Annotated[
    Path,
    typer.Option(
        "--log-dir", help="--engine vllm: where each trial's server log goes.", rich_help_panel=REAL
    ),
]


def build_engine(
    engine: str,
    *,
    model: str,
    profile: str = DEFAULT_PROFILE,
    vllm_python: str | None = None,
    serve_cmd: str | None = None,
    server_arg: list[str] | None = None,
    server_env: list[str] | None = None,
    log_dir: Path = Path("tune-logs"),
    hang_timeout_s: float = DEFAULT_HANG_TIMEOUT_S,
) -> SimEngine | VllmEngine:
    """The trial engine the options name (``model``: what a real server serves)."""
    if engine == "sim":
        return SimEngine(load_profile(profile))
    if engine == "vllm":
        return VllmEngine(
            model,
            python=vllm_python,
            serve_command=shlex.split(serve_cmd or ""),
            server_args=[arg for text in server_arg or [] for arg in shlex.split(text)],
            env=parse_assignments(server_env or [], "--server-env"),
            log_dir=log_dir,
            hang_timeout_s=hang_timeout_s,
        )
    raise TunerError(f"--engine: expected sim or vllm, got {engine!r}")
