"""Command-line options generated from the library fields that declare them
(:mod:`prefill_tuner.declared`): a field's flag, type, default, range and help are read from
the field, never written again here.

:func:`option` gives one option (``SeedOpt = Annotated[int, option(StudyPlan, "seed")]``);
:func:`group` gives the options that together build one object, passed to a command as one
parameter (:class:`OptionGroup`, expanded by ``options.with_options``; ``options.study_options``
builds :func:`~prefill_tuner.study.plan.build_plan`'s keywords from :class:`StudyPlan`'s).
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import NoneType
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError

from prefill_tuner.cli.fields import generated, help_of
from prefill_tuner.declared import Setting, settings_of, union_members
from prefill_tuner.errors import TunerError


@dataclass(frozen=True)
class OptionGroup:
    """Flags that together build one object, passed to the command as one parameter."""

    params: tuple[inspect.Parameter, ...]
    build: Callable[..., Any]
    leading: bool = False
    """Its flags come before the command's own in ``--help`` (a study's: what a user gives
    first); the others' after."""


def option(cls: type, field: str, *, panel: str | None = None, **extra: Any) -> Any:
    """The typer option that sets ``cls``'s ``field`` (its flag, range and help from the
    field), for ``Annotated[TYPE, option(...)]`` where a command spells the type itself (the
    type checker reads it there; ``tests/test_declared.py`` checks it is the field's:
    :func:`cli_type`); ``extra``: what the field cannot say (``show_default``, ``envvar``,
    ``callback``, a longer ``help``)."""
    setting = settings_of(cls)[field]
    flag = setting.flag
    if cli_type(setting) in (bool, bool | None):
        flag = f"{flag}/--no-{flag[2:]}"
    extra.setdefault("help", help_of(cls, field))
    generated(field, setting.flag)  # a library message naming the field says the flag
    info = typer.Option(flag, rich_help_panel=panel, **_typer_bounds(setting), **extra)
    info.declared_by = (cls, field)  # what tests/test_declared.py checks the type against
    return info


def param(
    cls: type, field: str, *, panel: str | None = None, optional: bool = False, **extra: Any
) -> inspect.Parameter:
    """``field``'s option as a keyword parameter named as the field, defaulting as it does (a
    field without a default: a required option, or with ``optional`` one the library fills
    in when left out, as a study's name)."""
    setting = settings_of(cls)[field]
    kind = cli_type(setting)
    default = setting.info.get_default(call_default_factory=True)
    if setting.info.is_required():
        default, kind = (None, kind | None) if optional else (inspect.Parameter.empty, kind)
    return inspect.Parameter(
        field,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[kind, option(cls, field, panel=panel, **extra)],
        default=default,
    )


def group(
    cls: type,
    fields: Iterable[str],
    *,
    panel: str | None = None,
    build: Callable[..., Any] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
) -> OptionGroup:
    """The options of ``cls``'s ``fields``; ``build``: what the command receives from their
    values (default: ``cls`` built of them, checked: :func:`construct`)."""
    extra = extra or {}
    params = tuple(param(cls, name, panel=panel, **extra.get(name, {})) for name in fields)
    return OptionGroup(params, build or (lambda **values: construct(cls, **values)))


def construct(cls: type, **values: Any) -> Any:
    """``cls`` built of ``values``: a pydantic model's validation error in one line naming
    its field (a dataclass checks itself: :func:`prefill_tuner.declared.check_declared`)."""
    if not issubclass(cls, BaseModel):
        return cls(**values)
    try:
        return cls(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        # A check across fields has no location: name the field its message names.
        names = list(cls.model_fields)
        field = str(first["loc"][0]) if first["loc"] else ""
        field = field or next((name for name in names if name in message), "")
        message = message.removeprefix(f"{field} ")
        for name in names:
            message = message.replace(name, f"`{name}`")
        raise TunerError(f"`{field}`: {message}" if field else message) from None


def cli_type(setting: Setting) -> Any:
    """The type the parser reads: a choice is read as text (the library checks it), as is a
    field of several kinds (``float | Literal["auto"]``); a tuple is a repeatable option's
    texts (the library parses them: ``--slo``)."""
    every = union_members(setting.info.annotation)
    members = [member for member in every if member is not NoneType]
    kind = members[0] if len(members) == 1 else str
    if typing.get_origin(kind) is typing.Literal:
        kind = str
    if typing.get_origin(kind) is tuple:
        return list[str] | None
    return kind | None if NoneType in every else kind


def _typer_bounds(setting: Setting) -> dict[str, Any]:
    """The range the parser checks (closed: the library refuses an open end's own value)."""
    bounds = setting.bounds
    found: dict[str, Any] = {}
    low = bounds.get("ge", bounds.get("gt"))
    high = bounds.get("le", bounds.get("lt"))
    if low is not None and math.isfinite(low):
        found["min"] = low
    if high is not None and math.isfinite(high):
        found["max"] = high
    return found
