"""Settings declared once: a library class's field is the whole declaration of a setting.

Its type (``Literal`` for a choice), its bounds (``Annotated[int, Field(ge=1, le=64)]``, the
constraints pydantic reads), its default and its docstring (whose first paragraph is the help)
say everything; a :class:`Flag` in the annotation names the command-line flag where the
field's name does not (``slos`` is ``--slo``). From there:

- the library checks a value against the declaration wherever it comes from (a flag, a stored
  JSON record, a caller): pydantic models validate themselves; a plain dataclass calls
  :func:`check_declared` (pydantic's own validators, field by field, strict), so the bounds are
  not written again as ``if`` statements;
- the command line generates each option from the field (``cli/declared_options.py``): its
  flag (:func:`flag_name`), type, default, range and help;
- a stored record or a config file names a setting by the field's name (its JSON name).

A library error names a field in backticks (`` `tp` ``); the command line writes it as the
flag (``cli/fields.py``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from prefill_tuner.errors import TunerError


@dataclass(frozen=True, slots=True)
class Flag:
    """A field's command-line flag where it is not :func:`flag_name`'s rule (``--slo`` for
    ``slos``): put it in the field's annotation, ``Annotated[tuple[str, ...], Flag("--slo")]``."""

    name: str


UNIT_SUFFIXES = ("_s",)
"""A unit the field's name carries and its flag does not (``timeout_s`` is ``--timeout``)."""


@dataclass(frozen=True)
class Setting:
    """What a field declares, read once from its class."""

    name: str
    info: FieldInfo
    """The field as pydantic reads it: its annotation (without ``Annotated``'s extras), its
    default, its constraints (``metadata``)."""
    flag: str
    doc: str
    """Its docstring (``""`` where it has none)."""

    @property
    def bounds(self) -> dict[str, float]:
        """Its numeric bounds, as ``{"ge": 1, "le": 64}`` (``gt``, ``lt`` for open ends)."""
        found: dict[str, float] = {}
        for item in self.info.metadata:
            for key in ("ge", "gt", "le", "lt"):
                value = getattr(item, key, None)
                if value is not None:
                    found[key] = value
        return found

    @property
    def choices(self) -> tuple[Any, ...]:
        """The values a ``Literal`` field takes (``()`` for any other)."""
        return tuple(
            value
            for member in union_members(self.info.annotation)
            if typing.get_origin(member) is typing.Literal
            for value in typing.get_args(member)
        )

    @property
    def checked(self) -> bool:
        """Whether the declaration says more than a plain type: bounds or a choice."""
        return bool(self.bounds or self.choices)


def flag_name(field: str) -> str:
    """The flag of a field that declares none: its name, dashed, less a unit suffix
    (``hang_timeout_s`` → ``--hang-timeout``)."""
    for suffix in UNIT_SUFFIXES:
        field = field.removesuffix(suffix)
    return "--" + field.replace("_", "-")


@functools.cache
def settings_of(cls: type) -> dict[str, Setting]:
    """Each field of ``cls`` (a pydantic model or a dataclass), as it declares itself."""
    docs = field_docs(cls)
    if issubclass(cls, BaseModel):
        infos = dict(cls.model_fields)
    else:
        hints = typing.get_type_hints(cls, include_extras=True)
        infos = {
            field.name: FieldInfo.from_annotated_attribute(hints[field.name], _default(field))
            for field in dataclasses.fields(typing.cast(Any, cls))
        }
    return {
        name: Setting(name, info, _declared_flag(info) or flag_name(name), docs.get(name, ""))
        for name, info in infos.items()
    }


def check_declared(instance: Any) -> None:
    """Check each field of a dataclass ``instance`` that declares bounds or a choice against
    its declaration (call it from ``__post_init__``): :func:`check_values`."""
    cls: type = type(instance)
    check_values(cls, **{name: getattr(instance, name) for name in settings_of(cls)})


def check_values(cls: type, **values: Any) -> None:
    """Check ``values`` against the declarations of ``cls``'s fields of the same names (those
    that declare bounds or a choice), before an object is built of them; a one-line error
    naming the first field that is out, as :func:`problem` words it."""
    settings = settings_of(cls)
    for name, value in values.items():
        if settings[name].checked:
            try:
                _adapter(cls, name).validate_python(value, strict=True)
            except ValidationError as exc:
                raise TunerError(problem(name, value, exc, settings[name].choices)) from None


def problem(field: str, value: Any, exc: ValidationError, choices: tuple[Any, ...] = ()) -> str:
    """A pydantic error on ``field`` in one line: `` `field` VALUE: what is wrong `` (a value
    outside a choice: ``expected one of`` the ``choices``)."""
    error = exc.errors()[0]
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "literal_error" and choices:
        message = "expected one of " + ", ".join(str(choice) for choice in choices)
    return f"`{field}` {value!r}: {message}"


@functools.cache
def _adapter(cls: type, name: str) -> TypeAdapter[Any]:
    info = settings_of(cls)[name].info
    hint: Any = info.annotation
    for item in info.metadata:
        if not isinstance(item, Flag):
            hint = typing.Annotated[hint, item]  # nested, they flatten into one
    return TypeAdapter(hint)


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return ...  # pydantic's "required"


def _declared_flag(info: FieldInfo) -> str | None:
    return next((item.name for item in info.metadata if isinstance(item, Flag)), None)


def union_members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (``X | None``), or the type itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under its declaration), as vLLM's and
    pydantic's attribute docstrings are read: from the class's source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    declaration = tree.body[0]
    assert isinstance(declaration, ast.ClassDef), cls
    docs: dict[str, str] = {}
    for declared, following in itertools.pairwise(declaration.body):
        if (
            isinstance(declared, ast.AnnAssign)
            and isinstance(declared.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[declared.target.id] = inspect.cleandoc(following.value.value)
    return docs
