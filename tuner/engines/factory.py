"""Building the trial engine a study runs on, from options every command shares."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from prefill_tuner import defaults
from prefill_tuner.declared import Flag
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.errors import TunerError

if TYPE_CHECKING:
    from prefill_tuner.engines.sim.cost_model import StepModel

ENGINES = ("sim", "vllm")


@dataclass(frozen=True)
class EngineOptions:
    """How to run trials: on the simulator with a profile, or on real vLLM servers."""

    # The first paragraph of each field's docstring is its option's help (tune ... --help).
    engine: str = "sim"
    """sim (simulator) or vllm."""
    model: str = defaults.MODEL
    """Model named in serve lines (and served, with ``engine`` vllm)."""
    hardware: ProfileSpec = field(default_factory=ProfileSpec)
    """The simulator's step-time profile: shipped, given, or built from measured kernels for
    ``model`` on a GPU; with ``engine`` vllm, the one that screens and explains."""
    vllm_python: str | None = None
    """The Python that has vLLM (its own venv).

    ``None``: this one."""
    serve_cmd: str | None = None
    """The command the model name follows (default: 'vllm serve' if that works, else 'PYTHON
    -m vllm.entrypoints.openai.api_server --model')."""
    server_args: Annotated[tuple[str, ...], Flag("--server-arg")] = field(default_factory=tuple)
    """Extra server arguments, e.g. '--kv-cache-memory-bytes 268435456' (repeatable).

    Each a shell-quoted string."""
    server_env: Mapping[str, str] = field(default_factory=dict)
    """KEY=VALUE for the server's environment (repeatable)."""
    log_dir: Path | None = None
    """Where each trial's server log goes.

    ``None``: ``defaults.LOG_DIR``; the step trace goes beside the log."""
    hang_timeout_s: float | None = None
    """A trial fails when requests are in flight but no token arrives for this many seconds
    (the server hung).

    ``None``: ``defaults.HANG_TIMEOUT_S``."""
    reuse_servers: bool = True
    """Keep a trial's vLLM server for the next trials that change only knobs vLLM reads every
    step (a live scheduler takes them); off: a new server for every trial (as with the
    user's own ``--scheduler-cls``)."""


def serving(options: EngineOptions, model: str) -> EngineOptions:
    """The options for serving ``model`` (as ``--model`` names it): serve lines name the
    model, or the folder of a config given without a name."""
    return replace(options, model=options.hardware.serve_name(model))


def given_profile(
    options: EngineOptions, fixed: Mapping[str, Any] | None = None
) -> StepModel | None:
    """The simulator profile the user chose, ``None`` for the shipped default: a real-engine
    study screens with it, and explains with it why nothing met the SLOs."""
    if not options.hardware.given:
        return None
    return options.hardware.step_model(options.model, (fixed or {}).get("max_model_len"))


def build_engine(options: EngineOptions, fixed: Mapping[str, Any] | None = None) -> TrialEngine:
    """The trial engine the options name; a real engine probes vLLM once here. ``fixed``: the
    settings the study fixes, if known (a profile built from measured kernels sizes its KV pool
    to hold one request of their ``max_model_len``, as vLLM checks)."""
    if options.engine == "sim":
        real_only = [
            flag
            for flag, value in (
                ("`server_args`", options.server_args),
                ("`server_env`", options.server_env),
                ("`vllm_python`", options.vllm_python),
                ("`serve_cmd`", options.serve_cmd),
                ("`log_dir`", options.log_dir),
                ("`hang_timeout_s`", options.hang_timeout_s),
            )
            if value not in (None, (), {})  # given: a default of these is None, () or {}
        ]
        if real_only:
            raise TunerError(
                f"{real_only[0]}: only for `engine` vllm; the simulator starts no server "
                "(give its settings with `fixed`, its hardware with `profile` or `gpu`)"
            )
        from prefill_tuner.engines.sim.trial_engine import SimEngine

        context = (fixed or {}).get("max_model_len")
        return SimEngine(options.hardware.step_model(options.model, context))
    if options.engine == "vllm":
        from prefill_tuner.engines.real.engine import VllmEngine

        return VllmEngine(
            options.model,
            python=options.vllm_python,
            serve_command=shlex.split(options.serve_cmd or ""),
            server_args=[arg for text in options.server_args for arg in shlex.split(text)],
            env=dict(options.server_env),
            log_dir=options.log_dir or defaults.LOG_DIR,
            hang_timeout_s=options.hang_timeout_s or defaults.HANG_TIMEOUT_S,
            reuse_servers=options.reuse_servers,
        )
    raise TunerError(f"`engine`: expected {' or '.join(ENGINES)}, got {options.engine!r}")
