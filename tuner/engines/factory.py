"""Building the trial engine a study runs on, from options every command shares."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prefill_tuner import defaults
from prefill_tuner.engines.base import TrialEngine
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
    profile: str = defaults.PROFILE
    """Simulator step-time profile (name or file); with ``engine`` vllm, the one that screens
    (``screen_trials``) and explains a study nothing met."""
    vllm_python: str | None = None
    """The Python that has vLLM (its own venv).

    ``None``: this one."""
    serve_cmd: str | None = None
    """The command the model name follows (default: 'vllm serve' if that works, else 'PYTHON
    -m vllm.entrypoints.openai.api_server --model')."""
    server_args: tuple[str, ...] = field(default_factory=tuple)
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


def given_profile(options: EngineOptions) -> StepModel | None:
    """The simulator profile the user chose, ``None`` for the shipped default: a real-engine
    study screens with it, and explains with it why nothing met the SLOs."""
    if options.profile == defaults.PROFILE:
        return None
    from prefill_tuner.engines.sim.cost_model import load_profile

    return load_profile(options.profile)


def build_engine(options: EngineOptions) -> TrialEngine:
    """The trial engine the options name; a real engine probes vLLM once here."""
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
                "(give its settings with `fixed`, its hardware with `profile`)"
            )
        from prefill_tuner.engines.sim import load_profile
        from prefill_tuner.engines.sim.trial_engine import SimEngine

        return SimEngine(load_profile(options.profile))
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
        )
    raise TunerError(f"`engine`: expected {' or '.join(ENGINES)}, got {options.engine!r}")
