"""Options shared by several commands, declared once.

A command names a group of options with one parameter (``engine: EngineOptions``) and the
:func:`with_options` decorator expands it into the group's flags for typer, then packs the
flags' values back into that one object. So ``tune run``, ``tune nightly`` and ``tune worker``
share their engine flags without repeating them, and every default comes from
:mod:`prefill_tuner.defaults`.
"""

from __future__ import annotations

import functools
import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic.fields import FieldInfo

from prefill_tuner import defaults
from prefill_tuner.cli.assignments import parse_assignments, parse_value
from prefill_tuner.cli.declared_options import OptionGroup, construct, group, option, param
from prefill_tuner.cli.fields import help_of
from prefill_tuner.engines.factory import EngineOptions
from prefill_tuner.engines.sim.config import SimConfig, resolve_config
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.space import MAX_ENGINE_INT
from prefill_tuner.storage.store import check_storage_url
from prefill_tuner.study.plan import SpaceSpec, StudyPlan, TraceSpec
from prefill_tuner.trace import ShapeOptions

ENGINE_PANEL = "Engine"
TRACE_PANEL = "Trace shaping"
SPACE_PANEL = "Search space"
STUDY_PANEL = "Study"


# Options that stand alone ------------------------------------------------------------------
def _storage_url(url: str) -> str:
    """Checked as soon as it is read (before a trace is loaded or an engine probed)."""
    check_storage_url(url)
    return url


_STORAGE_EXTRA: dict[str, Any] = {
    "envvar": "TUNE_STORAGE",
    "callback": _storage_url,
    "help": help_of(StudyPlan, "storage_url").removesuffix(".")
    + "; from $TUNE_STORAGE when not given, which keeps a password out of command lines and "
    "process lists.",
}
StorageOpt = Annotated[str, option(StudyPlan, "storage_url", **_STORAGE_EXTRA)]
StudyOpt = Annotated[str | None, option(StudyPlan, "name")]
SloOpt = Annotated[list[str], option(StudyPlan, "slos")]
SeedOpt = Annotated[int, option(StudyPlan, "seed")]


def _model_name(name: str) -> str:
    """A model name that a serve line can carry: ``vllm serve ''`` serves nothing, and
    ``vllm serve -x`` reads the name as a flag."""
    if not name.strip():
        raise TunerError("--model: the model name is empty")
    if name.startswith("-"):
        raise TunerError(
            f"--model {name!r}: a model name cannot start with '-' (it reads as a flag)"
        )
    return name


ModelOpt = Annotated[str, option(StudyPlan, "model", callback=_model_name)]
SampledTraceOpt = Annotated[
    Path,
    typer.Option(
        "--trace",
        help=help_of(TraceSpec, "path"),
        show_default="a bundled sample of Mooncake's conversation trace",
    ),
]
"""A trace to tune on, the bundled sample (``defaults.SAMPLE_TRACE``) when none is given."""
STDOUT = Path("-")
"""An output given as ``-``: standard output (export, report, trace convert and synth)."""
MovedTraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="Where the study's trace is now, if it moved (checked by its sha256, then "
        "recorded with the study).",
    ),
]
NoReportOpt = Annotated[
    bool,
    typer.Option(
        "--no-report",
        envvar="TUNE_NO_REPORT",
        help="Write no HTML report at the end (also: TUNE_NO_REPORT=1).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


# Groups of options --------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceChoice:
    """How to read and shape a trace (its path is the command's own option)."""

    format: str | None
    sort: bool
    shaping: ShapeOptions

    def at(self, path: Path) -> TraceSpec:
        return TraceSpec(path=path, format=self.format, sort=self.sort, shaping=self.shaping)


def _option(
    name: str, help: str, panel: str | None = None, **kwargs: Any
) -> typer.models.OptionInfo:
    return typer.Option(name, help=help, rich_help_panel=panel, **kwargs)


def _param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


HARDWARE_PANEL = "Simulated hardware"
_HARDWARE = group(
    ProfileSpec,
    (
        "profile",
        "model_config",
        "gpu",
        "tp",
        "dtype",
        "expert_parallel",
        "kv_cache_dtype",
        "gpu_memory_utilization",
    ),
    panel=HARDWARE_PANEL,
    extra={"profile": {"show_default": defaults.PROFILE}},
).params


def _profile_spec(**values: Any) -> ProfileSpec:
    spec = ProfileSpec(**values)
    spec.check()  # before a trace is read
    return spec


HARDWARE = OptionGroup(params=_HARDWARE, build=_profile_spec)
"""The simulator's hardware: ``--profile``, or a profile built from measured kernels
(``--gpu`` with ``--model``/``--model-config``, ``--tp``, ``--dtype``, ...)."""


def _engine_options(
    engine: str,
    vllm_python: str | None,
    serve_cmd: str | None,
    server_arg: list[str] | None,
    server_env: list[str] | None,
    log_dir: Path | None,
    hang_timeout: float | None,
    reuse_servers: bool,
    **hardware: Any,
) -> EngineOptions:
    return EngineOptions(
        engine=engine,
        hardware=_profile_spec(**hardware) if hardware else ProfileSpec(),
        vllm_python=vllm_python,
        serve_cmd=serve_cmd,
        server_args=tuple(server_arg or ()),
        server_env=parse_assignments(server_env or [], "--server-env"),
        log_dir=log_dir,
        hang_timeout_s=hang_timeout,
        reuse_servers=reuse_servers,
    )


def _engine_help(field: str) -> str:
    """A real server's own option's help: its :class:`EngineOptions` field's, saying so
    first."""
    text = help_of(EngineOptions, field)
    if text[1:2].islower():  # a sentence's capital, not a name's (KEY=VALUE)
        text = text[0].lower() + text[1:]
    return f"--engine vllm: {text}"


_REAL_SERVER = (
    _param(
        "vllm_python",
        Annotated[
            str | None,
            _option("--vllm-python", _engine_help("vllm_python"), ENGINE_PANEL),
        ],
        None,
    ),
    _param(
        "serve_cmd",
        Annotated[str | None, _option("--serve-cmd", _engine_help("serve_cmd"), ENGINE_PANEL)],
        None,
    ),
    _param(
        "server_arg",
        Annotated[
            list[str] | None, _option("--server-arg", _engine_help("server_args"), ENGINE_PANEL)
        ],
        None,
    ),
    _param(
        "server_env",
        Annotated[
            list[str] | None, _option("--server-env", _engine_help("server_env"), ENGINE_PANEL)
        ],
        None,
    ),
    _param(
        "log_dir",
        Annotated[
            Path | None,
            _option(
                "--log-dir",
                _engine_help("log_dir"),
                ENGINE_PANEL,
                show_default=str(defaults.LOG_DIR),
            ),
        ],
        None,
    ),
    _param(
        "hang_timeout",
        Annotated[
            float | None,
            _option(
                "--hang-timeout",
                _engine_help("hang_timeout_s"),
                ENGINE_PANEL,
                min=1,
                show_default=f"{defaults.HANG_TIMEOUT_S:g}",
            ),
        ],
        None,
    ),
    _param(
        "reuse_servers",
        Annotated[
            bool,
            _option(
                "--reuse-servers/--no-reuse-servers",
                _engine_help("reuse_servers"),
                ENGINE_PANEL,
            ),
        ],
        True,
    ),
)

ENGINE = OptionGroup(
    params=(
        _param(
            "engine",
            Annotated[str, _option("--engine", help_of(EngineOptions, "engine"), ENGINE_PANEL)],
            "sim",
        ),
        *_HARDWARE,
        *_REAL_SERVER,
    ),
    build=_engine_options,
)
"""``--engine``, the simulated hardware and the options of a real server."""


def _real_server_options(**values: Any) -> EngineOptions:
    return _engine_options(engine="vllm", **values)


REAL_SERVER = OptionGroup(params=_REAL_SERVER, build=_real_server_options)
"""The real engine's options alone (``tune calibrate`` starts a server, never a simulator)."""


_TRACE_READING = (
    *group(TraceSpec, ("format", "sort"), panel=TRACE_PANEL).params,
    *group(
        ShapeOptions,
        ("start_s", "duration_s", "rate_scale", "max_requests", "dequantize_s", "jitter_seed"),
        panel=TRACE_PANEL,
    ).params,
    *group(ShapeOptions, ("classes",), panel=TRACE_PANEL).params,
)
_TRACE_LENGTH = group(ShapeOptions, ("max_model_len", "over_length"), panel=TRACE_PANEL).params
_TRACE_REPLAY = group(ShapeOptions, ("max_concurrency",), panel=TRACE_PANEL).params
"""How a replayed trace's requests are sent (not ``tune trace``'s: it replays nothing)."""


def _trace_input(format: str | None, sort: bool, **shaping: Any) -> TraceChoice:
    return TraceChoice(format, sort, construct(ShapeOptions, **shaping))


TRACE = OptionGroup(params=_TRACE_READING + _TRACE_REPLAY, build=_trace_input)
"""Reading and shaping a trace whose length limit comes from the engine, and how it is
replayed (run, nightly, plan, simulate, diagnose)."""
TRACE_WITH_LENGTH = OptionGroup(params=_TRACE_READING + _TRACE_LENGTH, build=_trace_input)
"""Reading and shaping a trace, with a length limit of the user's (``tune trace``)."""


def _space_spec(
    space: list[str] | None,
    space_file: Path | None,
    set_values: list[str] | None,
    async_scheduling: bool | None,
) -> SpaceSpec:
    fixed = {k: parse_value(v) for k, v in parse_assignments(set_values or [], "--set").items()}
    if async_scheduling is not None:
        if "async_scheduling" in fixed:
            raise TunerError("give --async-scheduling/--no-async-scheduling or --set, not both")
        fixed["async_scheduling"] = async_scheduling
    ranges = parse_assignments(space or [], "--space")
    return SpaceSpec(fixed=fixed, ranges=ranges, space_file=space_file)


SPACE = OptionGroup(
    params=(
        _param(
            "space",
            Annotated[
                list[str] | None,
                _option(
                    "--space",
                    help_of(SpaceSpec, "ranges"),
                    SPACE_PANEL,
                ),
            ],
            None,
        ),
        _param(
            "space_file",
            Annotated[
                Path | None, _option("--space-file", help_of(SpaceSpec, "space_file"), SPACE_PANEL)
            ],
            None,
        ),
        _param(
            "set_values",
            Annotated[
                list[str] | None,
                _option(
                    "--set",
                    help_of(SpaceSpec, "fixed"),
                    SPACE_PANEL,
                ),
            ],
            None,
        ),
        _param(
            "async_scheduling",
            Annotated[
                bool | None,
                _option(
                    "--async-scheduling/--no-async-scheduling",
                    "Schedule the next step while one runs (vLLM's flag; default: as the "
                    "engine resolves it, on for GPU profiles as vLLM 0.14 and later does, off "
                    "on CPU; give --no-async-scheduling to simulate vLLM 0.13 or older on a "
                    "GPU). Not searched.",
                    SPACE_PANEL,
                ),
            ],
            None,
        ),
    ),
    build=_space_spec,
)
"""``--space``, ``--space-file``, ``--set`` and ``--async-scheduling``."""


@dataclass(frozen=True)
class SimSettings:
    """``tune simulate``'s engine flags: settings named as vLLM names them, and the KV pool."""

    settings: dict[str, Any]
    """Only the flags given (the profile's and vLLM's defaults fill the rest)."""
    kv_cache_memory_bytes: int | None

    def config(self, profile: StepModel) -> SimConfig:
        """The engine config these flags give over ``profile`` (:func:`resolve_config`)."""
        return resolve_config(profile, self.settings, self.kv_cache_memory_bytes)


def _sim_flag(name: str, field: FieldInfo) -> inspect.Parameter:
    flag = "--" + name.replace("_", "-")
    if field.annotation is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    # A count vLLM could take (10**20 tokens a step would be accepted, and mean nothing).
    bounds = {"max": MAX_ENGINE_INT} if field.annotation is int else {}
    return _param(
        name,
        Annotated[
            field.annotation | None,  # type: ignore[operator]
            _option(flag, field.description or "", "Engine (vLLM flags)", **bounds),
        ],
        None,
    )


def _sim_settings(kv_cache_memory_bytes: int | None, **settings: Any) -> SimSettings:
    return SimSettings(settings, kv_cache_memory_bytes)


SIM_CONFIG = OptionGroup(
    params=(
        *(_sim_flag(name, field) for name, field in SimConfig.model_fields.items()),
        _param(
            "kv_cache_memory_bytes",
            Annotated[
                int | None,
                _option(
                    "--kv-cache-memory-bytes",
                    "KV pool size in bytes; blocks derived from the profile's KV bytes per token.",
                    "Engine (vLLM flags)",
                    min=1,
                ),
            ],
            None,
        ),
    ),
    build=_sim_settings,
)
"""One flag per :class:`SimConfig` field (its docstring is the help), and the KV pool size."""


def study_options(*fields: str, **extra: dict[str, Any]) -> OptionGroup:
    """The options of :class:`StudyPlan`'s ``fields``, built into the keywords of
    :func:`~prefill_tuner.study.plan.build_plan` (a repeated option's texts as a tuple);
    ``extra``: by field, what its option takes besides its declaration."""
    shared = {"storage_url": _STORAGE_EXTRA, "model": {"callback": _model_name}}
    params = tuple(
        param(
            StudyPlan,
            name,
            panel=STUDY_PANEL,
            optional=name == "name",
            **{**shared.get(name, {}), **extra.get(name, {})},
        )
        for name in fields
    )

    def build(**values: Any) -> dict[str, Any]:
        if "judge_windows" in values:
            values["judge_windows"] = tuple(values["judge_windows"] or ())
        return values

    return OptionGroup(params, build, leading=True)


STUDY = study_options(
    "slos",
    "objective_mode",
    "trials",
    "model",
    "name",
    "storage_url",
    "timeout_s",
    "seed",
    "sampler",
    "rule_trials",
    "error_budget",
    "capacity_tolerance",
    "early_abort",
    "screen_trials",
    "headroom",
    "headroom_check",
    "judge_windows",
)
"""``tune run``'s study options: every :class:`StudyPlan` field a user sets."""


Command = TypeVar("Command", bound=Callable[..., Any])


def with_options(**groups: OptionGroup) -> Callable[[Command], Command]:
    """Give the command each group's flags; it receives each group as one built object,
    under the keyword it was given here (``@with_options(engine=ENGINE)``)."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in signature.parameters.values()
            if p.name not in groups
        ]
        leading = [p for group in groups.values() if group.leading for p in group.params]
        added = [p for group in groups.values() if not group.leading for p in group.params]

        @functools.wraps(command)
        def wrapper(**values: Any) -> Any:
            for keyword, options in groups.items():
                values[keyword] = options.build(
                    **{p.name: values.pop(p.name) for p in options.params}
                )
            return command(**values)

        parameters = leading + own + added
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def finite_floats(command: Command) -> Command:
    """The command, refusing a number option given ``nan`` or an infinity (``inf``, or
    ``1e309``, which reads as one) before it starts: no option means anything by them, and a
    range check lets them through (``inf ≥ 0``) or names the wrong bound (``nan``)."""
    signature = inspect.signature(command, eval_str=True)
    flags = {
        param.name: _flag(param.name, info)
        for param in signature.parameters.values()
        if typing.get_origin(param.annotation) is Annotated
        for info in typing.get_args(param.annotation)[1:]
        if isinstance(info, typer.models.OptionInfo)
        if float in (typing.get_args(param.annotation)[0], *_members(param.annotation))
    }

    @functools.wraps(command)
    def checked(**values: Any) -> Any:
        for name, flag in flags.items():
            value = values.get(name)
            if isinstance(value, float) and not math.isfinite(value):
                what = "not a number" if math.isnan(value) else "not a finite number"
                raise TunerError(f"{flag}: {value} is {what}")
        return command(**values)

    checked.__signature__ = signature  # type: ignore[attr-defined]
    return checked  # type: ignore[return-value]


def _flag(name: str, info: typer.models.OptionInfo) -> str:
    """An option's flag (in ``Annotated``, typer takes ``Option``'s first argument as one)."""
    given = [*(info.param_decls or ()), info.default]
    return next((d for d in given if isinstance(d, str) and d.startswith("-")), f"--{name}")


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types of an ``Annotated[float | None, ...]`` union (none for a plain type)."""
    return typing.get_args(typing.get_args(annotation)[0])
