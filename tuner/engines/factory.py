"""Building the trial engine a study runs on, from options every command shares."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prefill_tuner import defaults
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.space import parse_assignments

if TYPE_CHECKING:
    from prefill_tuner.engines.sim.cost_model import StepModel

ENGINES = ("sim", "vllm")


@dataclass(frozen=True)
class EngineOptions:
    """How to run trials: on the simulator with a profile, or on real vLLM servers."""

    engine: str = "sim"
    """``sim`` (the simulated scheduler) or ``vllm`` (a real server per trial)."""
    model: str = defaults.MODEL
    """What a real server serves, and what serve lines name."""
    profile: str = defaults.PROFILE
    """The simulator's step-time profile: a shipped name or a YAML/JSON file."""
    vllm_python: str | None = None
    """The Python that has vLLM (default: this one)."""
    serve_cmd: str | None = None
    """The command the model name follows (default: ``vllm serve`` when it works)."""
    server_args: tuple[str, ...] = field(default_factory=tuple)
    """Extra server arguments, each a shell-quoted string (``--dtype float32``)."""
    server_env: tuple[str, ...] = field(default_factory=tuple)
    """``KEY=VALUE`` for the server's environment."""
    log_dir: Path | None = None
    """Where each real trial's server log and step trace go (``None``: ``defaults.LOG_DIR``)."""
    hang_timeout_s: float | None = None
    """A real trial fails when requests are in flight but no token arrives for this long
    (``None``: ``defaults.HANG_TIMEOUT_S``)."""


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
            if value not in (None, ())  # given: a default of these is None or ()
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
            env=parse_assignments(list(options.server_env), "`server_env`"),
            log_dir=options.log_dir or defaults.LOG_DIR,
            hang_timeout_s=options.hang_timeout_s or defaults.HANG_TIMEOUT_S,
        )
    raise TunerError(f"`engine`: expected {' or '.join(ENGINES)}, got {options.engine!r}")
