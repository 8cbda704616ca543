"""A setting is declared once, as a library field (``prefill_tuner.declared``): the command
line's options are generated from it, and the library checks what the field declares wherever
a value comes from."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Literal

import pytest
import typer
from pydantic import Field

from prefill_tuner.cli import nightly_cmd, options, plan_cmd, run_cmd
from prefill_tuner.cli.declared_options import cli_type, group
from prefill_tuner.cli.fields import FLAGS, with_flags
from prefill_tuner.declared import Flag, check_declared, flag_name, settings_of, union_members
from prefill_tuner.engines.factory import EngineOptions
from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.errors import TunerError
from prefill_tuner.nightly.job import NightlyJob
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.settings import EngineSettings, searched_settings
from prefill_tuner.search_spaces.space import EngineCapabilities, knob_removed
from prefill_tuner.study.plan import SpaceSpec, StudyPlan, TraceSpec
from prefill_tuner.study.summary import COLUMNS
from prefill_tuner.trace import ShapeOptions
from prefill_tuner.worker.shared import Liveness


@dataclass(frozen=True)
class Example:
    """A class that declares its settings."""

    count: Annotated[int, Field(ge=1, le=8)] = 2
    """How many.

    More words."""
    mode: Annotated[Literal["a", "b"], Flag("--way")] = "a"
    """Which way."""
    wait_s: float | None = None
    """Seconds to wait."""

    def __post_init__(self) -> None:
        check_declared(self)


def test_a_field_declares_its_flag_bounds_choices_default_and_help() -> None:
    settings = settings_of(Example)
    assert settings["count"].flag == "--count"
    assert settings["count"].bounds == {"ge": 1, "le": 8}
    assert settings["count"].doc.startswith("How many.")
    assert settings["mode"].flag == "--way"
    assert settings["mode"].choices == ("a", "b")
    assert settings["wait_s"].flag == "--wait"  # a unit suffix is not spelled in the flag
    assert flag_name("hang_timeout_s") == "--hang-timeout"
    assert not settings["wait_s"].checked


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"count": 0}, "`count` 0: Input should be greater than or equal to 1"),
        ({"count": 9}, "`count` 9: Input should be less than or equal to 8"),
        ({"mode": "c"}, "`mode` 'c': expected one of a, b"),
        ({"count": True}, "`count` True: Input should be a valid integer"),
    ],
)
def test_the_library_checks_what_a_field_declares(values: dict, message: str) -> None:
    with pytest.raises(TunerError) as caught:
        Example(**values)
    assert str(caught.value) == message
    assert Example(count=8, mode="b").count == 8


def test_options_are_generated_from_the_fields() -> None:
    """The flag, the parser's type and range, the default and the help all come from the
    field."""
    params = {p.name: p for p in group(Example, ("count", "mode", "wait_s")).params}
    count = params["count"].annotation
    assert typing.get_args(count)[0] is int
    info = typing.get_args(count)[1]
    assert (info.param_decls or (info.default,))[0] == "--count" or info.default == "--count"
    assert (info.min, info.max) == (1, 8)
    assert info.help == "How many."
    assert params["count"].default == 2
    assert typing.get_args(params["mode"].annotation)[0] is str  # the library checks a choice
    assert typing.get_args(params["wait_s"].annotation)[0] == float | None


def _declared_by(annotation: object) -> tuple[type, str] | None:
    extras = typing.get_args(annotation)[1:] if typing.get_origin(annotation) is Annotated else ()
    infos = [e for e in extras if isinstance(e, typer.models.OptionInfo)]
    return getattr(infos[0], "declared_by", None) if infos else None


def _spelled() -> list[tuple[str, object]]:
    """Every option type a command module spells with a generated option: the aliases of
    ``cli/options.py`` and ``tune run``'s own parameters."""
    found = [(name, value) for name, value in vars(options).items() if _declared_by(value)]
    for options_group in (options.STUDY, nightly_cmd.NIGHT, nightly_cmd.STUDY_OF_THE_NIGHT):
        found += [(p.name, p.annotation) for p in options_group.params]
    for command in (run_cmd.run_command, nightly_cmd.nightly_command, plan_cmd.plan_command):
        signature = inspect.signature(command, eval_str=True)
        found += [(p.name, p.annotation) for p in signature.parameters.values()]
    return [(name, value) for name, value in found if _declared_by(value)]


@pytest.mark.parametrize(("name", "alias"), _spelled(), ids=lambda x: str(x)[:40])
def test_a_hand_spelled_option_type_is_its_fields(name: str, alias: object) -> None:
    """Where a command spells an option's type itself (the type checker reads it there), it
    is the type the field gives the parser, optional or not (a command may require what the
    library defaults, or leave out what the library fills in)."""
    cls, field = _declared_by(alias)  # type: ignore[misc]
    assert _given(typing.get_args(alias)[0]) == _given(cli_type(settings_of(cls)[field])), name


def _given(kind: object) -> set[object]:
    return set(union_members(kind)) - {type(None)}


def test_the_spelled_options_are_found() -> None:
    names = {name for name, _ in _spelled()}
    assert {"SeedOpt", "StorageOpt", "repeats", "deadline_s"} <= names
    assert {"slos", "objective_mode", "trials", "headroom_check"} <= names  # tune run's group


@pytest.mark.parametrize(
    "cls", [StudyPlan, SpaceSpec, TraceSpec, ShapeOptions, EngineOptions, ProfileSpec, NightlyJob]
)
def test_messages_name_a_field_by_the_flag_it_declares(cls: type) -> None:
    """``FLAGS`` (which writes a library message's fields as flags) agrees with every
    declaration."""
    for name, setting in settings_of(cls).items():
        if name in FLAGS:
            assert FLAGS[name] == setting.flag, (cls.__name__, name)


def test_hardware_bounds_hold_in_the_library_not_only_on_the_command_line() -> None:
    with pytest.raises(TunerError, match="`tp` 0: Input should be greater than or equal to 1"):
        ProfileSpec(gpu="h100_sxm", tp=0)
    with pytest.raises(TunerError, match="`dtype` 'fp4'"):
        ProfileSpec(gpu="h100_sxm", dtype="fp4")  # type: ignore[arg-type]


def test_a_knob_is_declared_once_as_an_engine_setting() -> None:
    """Every knob the simulator's engine has is an ``EngineSettings`` field marked
    ``Searched``: the search's knob, the simulator's config field (type, default, vLLM's
    bounds) and the table's label all come from it; its search range is within the values
    vLLM accepts."""
    searched = searched_settings()
    engine_knobs = [name for name, knob in KNOBS.items() if not knob.v0_only]
    assert engine_knobs == list(searched)
    for name in engine_knobs:
        assert name in SimConfig.model_fields
        knob, bounds = KNOBS[name], settings_of(EngineSettings)[name].bounds
        assert knob.label == searched[name].label == COLUMNS[name]
        if knob.kind != "bool":
            assert bounds.get("ge", 0) <= knob.low <= knob.high, name
    labels = [knob.label for knob in KNOBS.values()]
    assert len(set(labels)) == len(labels) and max(map(len, labels)) <= 8


def test_a_knob_newer_than_the_server_is_never_given_to_it() -> None:
    """The releases a knob's declaration names decide which servers get it: one added after
    the server's release is refused as one removed before it is."""
    newer = dataclasses.replace(KNOBS["max_num_seqs"], added_in="0.33.0")
    old = EngineCapabilities(engine="vllm", version="0.32.0")
    why = knob_removed(newer, old)
    assert why is not None and why.startswith("added to vLLM in 0.33.0")
    assert knob_removed(newer, dataclasses.replace(old, version="0.33.1")) is None
    assert knob_removed(KNOBS["max_num_seqs"], old) is None


def test_a_message_names_a_generated_option_by_its_flag() -> None:
    """A library message naming a field some option was generated from says that option's
    flag, whether or not ``FLAGS`` lists it."""
    import prefill_tuner.cli  # noqa: F401  (every command, so every generated option)

    with pytest.raises(TunerError) as caught:
        Liveness(heartbeat_s=10, grace_s=5)
    assert with_flags(str(caught.value)) == "--grace 5: must be longer than --heartbeat 10"
    assert "heartbeat_s" not in FLAGS
