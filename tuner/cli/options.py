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
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from prefill_tuner import defaults
from prefill_tuner.cli.assignments import parse_assignments, parse_value
from prefill_tuner.cli.fields import flag_of, help_of
from prefill_tuner.engines.factory import EngineOptions
from prefill_tuner.engines.sim.config import SimConfig, resolve_config
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.space import MAX_ENGINE_INT
from prefill_tuner.storage.store import check_storage_url
from prefill_tuner.study.plan import SpaceSpec, StudyPlan, TraceSpec
from prefill_tuner.trace import ShapeOptions
from prefill_tuner.trace.shaping import MAX_RATE_SCALE

ENGINE_PANEL = "Engine"
TRACE_PANEL = "Trace shaping"
SPACE_PANEL = "Search space"


def _study(field: str) -> str:
    return help_of(StudyPlan, field)


# Options that stand alone ------------------------------------------------------------------
def _storage_url(url: str) -> str:
    """Checked as soon as it is read (before a trace is loaded or an engine probed)."""
    check_storage_url(url)
    return url


StorageOpt = Annotated[
    str,
    typer.Option(
        "--storage",
        envvar="TUNE_STORAGE",
        callback=_storage_url,
        help=_study("storage_url").removesuffix(".")
        + "; from $TUNE_STORAGE when not given, which keeps a password out of command lines and "
        "process lists.",
    ),
]
StudyOpt = Annotated[str | None, typer.Option("--study", help=_study("name"))]
SloOpt = Annotated[list[str], typer.Option("--slo", help=_study("slos"))]
HeadroomOpt = Annotated[float | None, typer.Option("--headroom", help=_study("headroom"))]
HeadroomCheckOpt = Annotated[str, typer.Option("--headroom-check", help=_study("headroom_check"))]
JudgeWindowOpt = Annotated[
    list[str] | None, typer.Option("--judge-window", help=_study("judge_windows"))
]


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


ModelOpt = Annotated[str, typer.Option("--model", callback=_model_name, help=_study("model"))]
SampledTraceOpt = Annotated[
    Path,
    typer.Option(
        "--trace",
        help=help_of(TraceSpec, "path"),
        show_default="a bundled sample of Mooncake's conversation trace",
    ),
]
"""A trace to tune on, the bundled sample (``defaults.SAMPLE_TRACE``) when none is given."""
MAX_SEED = 2**32 - 1
"""Seeds go to numpy and Optuna, which take 0..2**32-1."""
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
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help=_study("seed"))]
MAX_TRIALS = 1_000_000
"""The most trials a study may ask for (more would never finish; 10**20 overflowed SQLite)."""
TrialsOpt = Annotated[int, typer.Option("--trials", min=1, max=MAX_TRIALS, help=_study("trials"))]
ErrorBudgetOpt = Annotated[
    float,
    typer.Option(
        "--error-budget",
        min=0,
        max=1,
        help=_study("error_budget"),
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
ScreenOpt = Annotated[
    int,
    typer.Option(
        "--screen",
        min=0,
        help=_study("screen_trials"),
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


@dataclass(frozen=True)
class OptionGroup:
    """Flags that together build one object, passed to the command as one parameter."""

    params: tuple[inspect.Parameter, ...]
    build: Callable[..., Any]


def _hardware_help(field: str) -> str:
    return help_of(ProfileSpec, field)


HARDWARE_PANEL = "Simulated hardware"
_HARDWARE = (
    _param(
        "profile",
        Annotated[
            str | None,
            _option(
                "--profile",
                _hardware_help("profile"),
                HARDWARE_PANEL,
                show_default=defaults.PROFILE,
            ),
        ],
        None,
    ),
    _param(
        "model_config",
        Annotated[
            str | None, _option("--model-config", _hardware_help("model_config"), HARDWARE_PANEL)
        ],
        None,
    ),
    _param(
        "gpu", Annotated[str | None, _option("--gpu", _hardware_help("gpu"), HARDWARE_PANEL)], None
    ),
    _param(
        "tp",
        Annotated[int, _option("--tp", _hardware_help("tp"), HARDWARE_PANEL, min=1, max=64)],
        1,
    ),
    _param(
        "dtype",
        Annotated[str, _option("--dtype", _hardware_help("dtype"), HARDWARE_PANEL)],
        "bf16",
    ),
    _param(
        "kv_cache_dtype",
        Annotated[
            str, _option("--kv-cache-dtype", _hardware_help("kv_cache_dtype"), HARDWARE_PANEL)
        ],
        "auto",
    ),
    _param(
        "gpu_memory_utilization",
        Annotated[
            float,
            _option(
                "--gpu-memory-utilization",
                _hardware_help("gpu_memory_utilization"),
                HARDWARE_PANEL,
                min=0.01,
                max=1,
            ),
        ],
        defaults.GPU_MEMORY_UTILIZATION,
    ),
)


def _profile_spec(**values: Any) -> ProfileSpec:
    for name, allowed in (("dtype", ("bf16", "fp8")), ("kv_cache_dtype", ("auto", "bf16", "fp8"))):
        if values[name] not in allowed:
            raise TunerError(
                f"{flag_of(name)}: expected {' or '.join(allowed)}, got {values[name]!r}"
            )
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


def _shaping(field: str) -> str:
    return help_of(ShapeOptions, field)


_TRACE_READING = (
    _param(
        "format",
        Annotated[
            str | None,
            _option(
                "--format",
                help_of(TraceSpec, "format"),
                TRACE_PANEL,
            ),
        ],
        None,
    ),
    _param(
        "sort",
        Annotated[
            bool,
            _option("--sort", help_of(TraceSpec, "sort"), TRACE_PANEL),
        ],
        False,
    ),
    _param(
        "start",
        Annotated[float, _option("--start", _shaping("start_s"), TRACE_PANEL, min=0)],
        0.0,
    ),
    _param(
        "duration",
        Annotated[float | None, _option("--duration", _shaping("duration_s"), TRACE_PANEL, min=0)],
        None,
    ),
    _param(
        "rate_scale",
        Annotated[
            float,
            _option("--rate-scale", _shaping("rate_scale"), TRACE_PANEL, min=0, max=MAX_RATE_SCALE),
        ],
        1.0,
    ),
    _param(
        "max_requests",
        Annotated[
            int | None,
            _option("--max-requests", _shaping("max_requests"), TRACE_PANEL, min=1),
        ],
        None,
    ),
    _param(
        "dequantize",
        Annotated[
            str | None,
            _option(
                "--dequantize",
                _shaping("dequantize_s"),
                TRACE_PANEL,
            ),
        ],
        None,
    ),
    _param(
        "jitter_seed",
        Annotated[
            int,
            _option("--jitter-seed", _shaping("jitter_seed"), TRACE_PANEL, min=0, max=MAX_SEED),
        ],
        0,
    ),
    _param(
        "classes",
        Annotated[
            str | None,
            _option(
                "--classes",
                _shaping("classes"),
                TRACE_PANEL,
            ),
        ],
        None,
    ),
)
_TRACE_LENGTH = (
    _param(
        "max_model_len",
        Annotated[
            int | None,
            _option(
                "--max-model-len",
                _shaping("max_model_len"),
                TRACE_PANEL,
                min=2,
            ),
        ],
        None,
    ),
    _param(
        "over_length",
        Annotated[
            str,
            _option("--over-length", _shaping("over_length"), TRACE_PANEL),
        ],
        "clip",
    ),
)


_TRACE_REPLAY = (
    _param(
        "max_concurrency",
        Annotated[
            int | None,
            _option(
                "--max-concurrency",
                _shaping("max_concurrency"),
                TRACE_PANEL,
                min=1,
                max=MAX_ENGINE_INT,
            ),
        ],
        None,
    ),
)
"""How a replayed trace's requests are sent (not ``tune trace``'s: it replays nothing)."""


def _trace_input(
    format: str | None,
    sort: bool,
    start: float,
    duration: float | None,
    rate_scale: float,
    max_requests: int | None,
    dequantize: str | None,
    jitter_seed: int,
    classes: str | None = None,
    max_model_len: int | None = None,
    over_length: str = "clip",
    max_concurrency: int | None = None,
) -> TraceChoice:
    return TraceChoice(
        format,
        sort,
        shape_options(
            start=start,
            duration=duration,
            rate_scale=rate_scale,
            max_model_len=max_model_len,
            over_length=over_length,
            max_requests=max_requests,
            dequantize=dequantize,
            jitter_seed=jitter_seed,
            classes=classes,
            max_concurrency=max_concurrency,
        ),
    )


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
        added = [param for group in groups.values() for param in group.params]

        @functools.wraps(command)
        def wrapper(**values: Any) -> Any:
            for keyword, group in groups.items():
                values[keyword] = group.build(**{p.name: values.pop(p.name) for p in group.params})
            return command(**values)

        wrapper.__signature__ = signature.replace(parameters=own + added)  # type: ignore[attr-defined]
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


# Converting values ---------------------------------------------------------------------------
def shape_options(
    *,
    start: float = 0.0,
    duration: float | None = None,
    rate_scale: float = 1.0,
    max_model_len: int | None = None,
    over_length: str = "clip",
    max_requests: int | None = None,
    dequantize: str | None = None,
    jitter_seed: int = 0,
    classes: str | None = None,
    max_concurrency: int | None = None,
) -> ShapeOptions:
    """:class:`ShapeOptions` from CLI values, as a one-line error naming the flag."""
    quantum: float | str | None = dequantize
    if dequantize is not None and dequantize != "auto":
        try:
            quantum = float(dequantize)
        except ValueError:
            raise TunerError(
                f"--dequantize: expected seconds or 'auto', got {dequantize!r}"
            ) from None
        if not math.isfinite(quantum):
            raise TunerError(f"--dequantize: {dequantize} is not a finite number of seconds")
    try:
        return ShapeOptions(
            start_s=start,
            duration_s=duration,
            rate_scale=rate_scale,
            max_model_len=max_model_len,
            over_length=over_length,  # type: ignore[arg-type]
            max_requests=max_requests,
            dequantize_s=quantum,  # type: ignore[arg-type]
            jitter_seed=jitter_seed,
            classes=classes,
            max_concurrency=max_concurrency,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        # A check across fields has no location: name the field its message names.
        fields = ShapeOptions.model_fields
        field = str(first["loc"][0]) if first["loc"] else ""
        field = field or next((name for name in fields if name in message), "")
        message = message.removeprefix(f"{field} ")
        for name in fields:
            message = message.replace(name, flag_of(name))
        raise TunerError(f"{flag_of(field)}: {message}" if field else message) from None
