"""The search space of one study: which knobs, over which ranges, what is fixed, what was
dropped and why; and the mapping between Optuna parameters and engine settings.

Every point of the space is valid: the few rules vLLM enforces between knobs
(:mod:`prefill_tuner.search_spaces.rules`) are applied as a repair after sampling, so no trial
is spent on a configuration vLLM would refuse, and Optuna's distributions stay static
(dynamic ranges would drop the parameters from multivariate TPE's and GP's joint model).

``long_prefill_token_threshold`` caps nothing at or above ``max_num_batched_tokens``
(:func:`~prefill_tuner.search_spaces.rules.threshold_moot`): such a sample runs, is stored and is
shown with the threshold off (the canonical form, applied with the repair). It is searched as
an absolute power of two (parameter ``long_prefill_token_threshold_log2``), the tokens a prompt
may take per step, whatever the budget. :func:`share_of_budget` searches it instead as the
budget halved k times (``long_prefill_token_threshold_halvings``), which never samples a moot
cap; measured, that helps random search but makes the tuner's TPE reach the best settings
later (benchmarks/RESULTS.md, issue 29), so it is not the default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from prefill_tuner.errors import TunerError
from prefill_tuner.files import why_unreadable
from prefill_tuner.search_spaces.knobs import KNOBS, Knob, release
from prefill_tuner.yaml_input import read_yaml

THRESHOLD_SUFFIX = "_log2"
"""Threshold knobs searched as absolute values (the default) are searched as log2 exponents;
the lowest exponent of the range means 0."""
SHARE_SUFFIX = "_permille_log2"
"""Share knobs (the KV watermark) are searched as log2 exponents of thousandths; the lowest
exponent of the range means 0 (off)."""
HALVINGS_SUFFIX = "_halvings"
"""Threshold knobs searched as a share of ``max_num_batched_tokens`` (:func:`share_of_budget`):
0 is off, k is the budget halved k times."""
BUDGET = "max_num_batched_tokens"


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """What an engine accepts and honours: it decides which knobs may be searched."""

    engine: str
    """``sim`` or ``vllm``."""
    version: str
    accepted_flags: frozenset[str] | None = None
    """Flags the engine's own argument parser accepts; ``None`` when not probed (V1 set)."""
    honours_v0_partial_prefill: bool = False
    """Whether the engine enforces V0's partial-prefill limits."""
    honours_async_scheduling: bool = True
    """Whether the engine can schedule asynchronously (vLLM on CPU always resolves
    ``async_scheduling`` to false, whatever the flag says)."""


@dataclass(frozen=True, slots=True)
class Dropped:
    knob: str
    reason: str

    def __str__(self) -> str:
        return f"{self.knob}: {self.reason}"


@dataclass(frozen=True, slots=True)
class KnobRange:
    """Where one knob is searched."""

    knob: Knob
    low: int = 0
    high: int = 0
    allow_off: bool = True
    """Threshold and share knobs: whether 0 (off) is part of the range."""
    choices: tuple[bool, ...] = (True, False)
    """Boolean knobs: the values searched."""
    halvings: int = 0
    """Threshold knobs: searched as a share of ``max_num_batched_tokens``, the budget halved
    1 to ``halvings`` times (:func:`share_of_budget`); 0, the default: as an absolute power
    of two."""

    def distribution(self) -> BaseDistribution:
        if self.knob.kind == "bool":
            return CategoricalDistribution(list(self.choices))
        if self.knob.kind == "threshold" and self.halvings:
            return IntDistribution(0 if self.allow_off else 1, self.halvings)
        if self.knob.kind in ("threshold", "share"):
            low, high = _log2_floor(self.low), _log2_floor(self.high)
            return IntDistribution(low - 1 if self.allow_off else low, high)
        return IntDistribution(self.low, self.high, log=True)

    @property
    def param(self) -> str:
        if self.knob.kind == "share":
            return self.knob.name + SHARE_SUFFIX
        if self.knob.kind != "threshold":
            return self.knob.name
        return self.knob.name + (HALVINGS_SUFFIX if self.halvings else THRESHOLD_SUFFIX)

    def value(self, param: Any, budget: int | None = None) -> Any:
        """Engine setting for a parameter value (``budget``: the trial's
        ``max_num_batched_tokens``, which a threshold searched as its share needs)."""
        if self.knob.kind == "threshold" and self.halvings:
            halvings = int(param)
            if halvings <= 0 or budget is None:
                return 0
            threshold = min(max(budget >> halvings, self.low), self.high)
            return 0 if threshold >= budget else threshold  # at or above: caps nothing
        if self.knob.kind in ("threshold", "share"):
            exponent = int(param)
            off = _log2_floor(self.low) - 1
            if self.knob.kind == "share":
                return 0.0 if exponent <= off else 2**exponent / PER_MILLE
            return 0 if exponent <= off else 2**exponent
        if self.knob.kind == "bool":
            return bool(param)
        return int(param)

    def param_for(self, value: Any, budget: int | None = None) -> Any:
        """Parameter value for an engine setting (the baseline); may lie outside the range."""
        if self.knob.kind == "threshold" and self.halvings:
            if not value or budget is None or int(value) >= budget:
                return 0
            return max(1, round(math.log2(budget / int(value))))
        if self.knob.kind == "threshold":
            return _log2_floor(self.low) - 1 if not value else _log2_floor(int(value))
        if self.knob.kind == "share":
            permille = round(float(value) * PER_MILLE)
            return _log2_floor(self.low) - 1 if permille < 1 else _log2_floor(permille)
        return value

    def contains(self, value: Any, budget: int | None = None) -> bool:
        """Whether the range holds this engine setting (a point the sampler could propose)."""
        if value is None:
            return False  # unset (``max_num_active_seqs``: no limit below max_num_seqs)
        param = self.param_for(value, budget)
        distribution = self.distribution()
        if isinstance(distribution, CategoricalDistribution):
            return param in distribution.choices
        assert isinstance(distribution, IntDistribution)
        if self.halvings and value and budget is not None and int(value) >= budget:
            value = 0  # caps nothing: the same as off
        inside = distribution.low <= param <= distribution.high
        return inside and self.value(param, budget) == value

    def nearest_param(self, value: Any, budget: int | None = None) -> Any:
        """The parameter value in the range nearest to this setting's (itself when inside;
        an unset limit's: the loosest)."""
        distribution = self.distribution()
        if isinstance(distribution, CategoricalDistribution):
            return value if value in distribution.choices else distribution.choices[0]
        assert isinstance(distribution, IntDistribution)
        if value is None:
            return distribution.high
        return min(max(self.param_for(value, budget), distribution.low), distribution.high)

    def as_record(self) -> dict[str, Any]:
        """JSON-ready fields, read back by :meth:`from_record`."""
        record: dict[str, Any] = {
            "low": self.low,
            "high": self.high,
            "allow_off": self.allow_off,
            "choices": list(self.choices),
        }
        if self.halvings:  # absent for an absolute threshold, as in earlier versions' records
            record["halvings"] = self.halvings
        return record

    @classmethod
    def from_record(cls, name: str, data: Mapping[str, Any]) -> KnobRange:
        if name not in KNOBS:
            raise TunerError(f"unknown knob {name!r} in a stored search space")
        return cls(
            KNOBS[name],
            int(data["low"]),
            int(data["high"]),
            allow_off=bool(data["allow_off"]),
            choices=tuple(bool(c) for c in data["choices"]),
            halvings=int(data.get("halvings", 0)),
        )


@dataclass(frozen=True)
class SearchSpace:
    """Searched knobs, fixed settings, and what was left out."""

    ranges: dict[str, KnobRange]
    fixed: dict[str, Any] = field(default_factory=dict)
    dropped: tuple[Dropped, ...] = ()

    def distributions(self) -> dict[str, BaseDistribution]:
        return {r.param: r.distribution() for r in self.ranges.values()}

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Sample the knobs (engine settings, before repair). The budget is sampled before a
        threshold searched as its share (``KNOBS`` lists it first)."""
        values: dict[str, Any] = {}
        for name, knob_range in self.ranges.items():
            distribution = knob_range.distribution()
            if isinstance(distribution, CategoricalDistribution):
                param = trial.suggest_categorical(knob_range.param, distribution.choices)
            else:
                assert isinstance(distribution, IntDistribution)
                param = trial.suggest_int(
                    knob_range.param, distribution.low, distribution.high, log=distribution.log
                )
            values[name] = knob_range.value(param, self._budget(values))
        return values

    def _budget(self, settings: Mapping[str, Any]) -> int | None:
        """The ``max_num_batched_tokens`` of these settings (a fixed one over them)."""
        budget = self.fixed.get(BUDGET, settings.get(BUDGET))
        return None if budget is None else int(budget)

    def settings_from_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        for name, r in self.ranges.items():
            if r.param in params:
                settings[name] = r.value(params[r.param], self._budget(settings))
        return settings

    def params_for(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Optuna parameters that reproduce these settings (to enqueue a known config); a
        setting outside its range gets the nearest parameter in it (Optuna refuses a choice
        outside a categorical's): see :meth:`outside`."""
        budget = self._budget(settings)
        return {r.param: r.nearest_param(settings[name], budget) for name, r in self.ranges.items()}

    def outside(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The settings that lie outside their knob's searched range."""
        budget = self._budget(settings)
        return {
            name: settings[name]
            for name, r in self.ranges.items()
            if name in settings and not r.contains(settings[name], budget)
        }

    def describe(self) -> list[str]:
        lines = []
        for name, r in self.ranges.items():
            if r.knob.kind == "bool":
                lines.append(f"{name} in {{{', '.join(str(c).lower() for c in r.choices)}}}")
            elif r.knob.kind == "threshold" and r.halvings:
                off = "0 (off) or " if r.allow_off else ""
                lines.append(
                    f"{name}: {off}max_num_batched_tokens halved 1..{r.halvings} times, "
                    f"within {r.low}..{r.high} (never at or above the budget)"
                )
            elif r.knob.kind == "threshold":
                off = "0 (off) or " if r.allow_off else ""
                lines.append(f"{name}: {off}powers of two {r.low}..{r.high}")
            elif r.knob.kind == "share":
                off = "0 (off) or " if r.allow_off else ""
                low, high = r.low / PER_MILLE, r.high / PER_MILLE
                lines.append(f"{name}: {off}{low:g}..{high:g}, each twice the last")
            else:
                lines.append(f"{name}: {r.low}..{r.high} (log scale)")
        lines += [f"{name} = {value} (fixed)" for name, value in self.fixed.items()]
        return lines


BASELINE_OUTSIDE = "the baseline (the engine's defaults) lies outside the searched space"


def baseline_outside_note(outside: Mapping[str, Any]) -> str:
    """What the header and the summary say of a baseline outside the space."""
    values = ", ".join(
        f"{name}={str(value).lower() if isinstance(value, bool) else value}"
        for name, value in outside.items()
    )
    return f"{BASELINE_OUTSIDE}: {values}; it runs as the baseline all the same"


def knob_of_param(param: str) -> str:
    """The knob an Optuna parameter searches (``long_prefill_token_threshold_log2`` →
    ``long_prefill_token_threshold``; a plain knob's parameter is its name)."""
    for suffix in (THRESHOLD_SUFFIX, HALVINGS_SUFFIX, SHARE_SUFFIX):
        if param.endswith(suffix) and param[: -len(suffix)] in KNOBS:
            return param[: -len(suffix)]
    return param


PER_MILLE = 1000
"""A share knob's range is kept in thousandths (``KnobRange.low``/``high`` are integers)."""


def _log2_floor(value: int) -> int:
    return max(1, value).bit_length() - 1


def knob_removed(knob: Knob, capabilities: EngineCapabilities) -> str | None:
    """Why a vLLM server of this version must never get the knob (it was removed upstream, or
    it came in a later release: the server refuses the flag), else ``None`` (a release that
    has it, not vLLM, or a version that cannot be read, which the probed flags then decide)."""
    if capabilities.engine != "vllm":
        return None
    running = release(capabilities.version)
    if running is None:
        return None
    added = release(knob.added_in) if knob.added_in else None
    if added is not None and running < added:
        return (
            f"added to vLLM in {knob.added_in}: vLLM {capabilities.version} refuses "
            f"{knob.flag} and does not start"
        )
    removed = release(knob.removed_in) if knob.removed_in else None
    if removed is None or running < removed:
        return None
    by = f" ({knob.removed_by})" if knob.removed_by else ""
    return (
        f"removed from vLLM in {knob.removed_in}{by}: vLLM {capabilities.version} refuses "
        f"{knob.flag} and does not start"
    )


def knob_availability(knob: Knob, capabilities: EngineCapabilities) -> str | None:
    """``None`` when the engine honours and accepts the knob, else why it is dropped."""
    removed = knob_removed(knob, capabilities)
    if removed is not None:
        return removed
    if knob.v0_only and not capabilities.honours_v0_partial_prefill:
        gone = f"; removed from vLLM in {knob.removed_in}" if knob.removed_in else ""
        return (
            f"a V0-engine limit: never enforced by vLLM's V1 engine{gone}; "
            f"the {capabilities.engine} engine runs V1"
        )
    honoured = release(knob.honoured_from) if knob.honoured_from else None
    running = release(capabilities.version) if capabilities.engine == "vllm" else None
    if honoured is not None and running is not None and running < honoured:
        return (
            f"vLLM {capabilities.version} accepts {knob.flag} but ignores it on one engine "
            f"(vLLM {knob.honoured_from} and later honour it there): it would change nothing"
        )
    if knob.name == "async_scheduling" and not capabilities.honours_async_scheduling:
        return (
            f"{capabilities.engine} {capabilities.version} always schedules synchronously "
            "here (vLLM resolves async_scheduling to false on CPU)"
        )
    flags = capabilities.accepted_flags
    if flags is not None and knob.flag not in flags:
        return f"{capabilities.engine} {capabilities.version} does not accept {knob.flag}"
    return None


def build_space(
    capabilities: EngineCapabilities,
    overrides: Mapping[str, str] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> SearchSpace:
    """The default space for an engine, with the user's range overrides and fixed settings.

    ``overrides``: knob → ``LOW..HIGH`` (numbers), ``true,false``/``true``/``false`` (booleans).
    ``fixed``: knob or other engine setting → value; a fixed knob is not searched.
    """
    overrides = dict(overrides or {})
    fixed = dict(fixed or {})
    for name, value in fixed.items():
        if name in KNOBS and type(value) is int and value > MAX_ENGINE_INT:
            raise TunerError(f"`fixed` {name}={value}: at most {MAX_ENGINE_INT:,} (2**31 - 1)")
    unknown = [name for name in overrides if name not in KNOBS]
    if unknown:
        raise TunerError(f"`ranges`: unknown knob {unknown[0]!r}; knobs: {', '.join(KNOBS)}")
    ranges: dict[str, KnobRange] = {}
    dropped: list[Dropped] = []
    for name, knob in KNOBS.items():
        reason = knob_availability(knob, capabilities)
        if reason is not None:
            if name in overrides or name in fixed:
                raise TunerError(f"{name}: cannot be tuned or set here: {reason}")
            dropped.append(Dropped(name, reason))
            continue
        if name in fixed or (not knob.searched_by_default and name not in overrides):
            continue
        ranges[name] = _range(knob, overrides.get(name))
    return SearchSpace(ranges=ranges, fixed=fixed, dropped=tuple(dropped))


def share_of_budget(space: SearchSpace) -> SearchSpace:
    """The space with each threshold knob searched as a share of the budget, where the budget
    is searched or fixed (else the space unchanged): the budget halved from once to as often
    as takes the largest budget to the threshold's lowest value, or off. No sample is then a
    cap at or above its budget. Not the default (see the module's docstring)."""
    largest = space.ranges[BUDGET].high if BUDGET in space.ranges else space.fixed.get(BUDGET)
    if type(largest) is not int or largest < 1:
        return space
    ranges = dict(space.ranges)
    for name, knob_range in ranges.items():
        if knob_range.knob.kind == "threshold":
            halvings = max(1, _log2_floor(largest) - _log2_floor(knob_range.low))
            ranges[name] = dataclasses.replace(knob_range, halvings=halvings)
    return dataclasses.replace(space, ranges=ranges)


MAX_ENGINE_INT = 2**31 - 1
"""The largest count (tokens, sequences, context length) a knob or engine flag may take: the
largest 32-bit integer, far beyond any server's; 10**20 was accepted and meant nothing."""


def _range(knob: Knob, text: str | None) -> KnobRange:
    if text is None:
        return KnobRange(knob, knob.low, knob.high)
    spec = text.strip().lower()
    if knob.kind == "bool":
        choices = tuple(_parse_bool(part, knob.name) for part in spec.split(","))
        if not choices or len(set(choices)) != len(choices):
            raise TunerError(f"`ranges` {knob.name}={text}: expected true, false or true,false")
        return KnobRange(knob, choices=choices)
    if knob.kind == "share":
        return _share_range(knob, text, spec)
    low_text, sep, high_text = spec.partition("..")
    try:
        low, high = int(low_text), int(high_text if sep else low_text)
    except ValueError:
        raise TunerError(
            f"`ranges` {knob.name}={text}: expected LOW..HIGH, e.g. 256..16384"
        ) from None
    if high > MAX_ENGINE_INT:
        raise TunerError(
            f"`ranges` {knob.name}={text}: HIGH must be at most {MAX_ENGINE_INT:,} (2**31 - 1)"
        )
    if knob.kind == "threshold":
        allow_off = low == 0
        low = max(low, 1) if allow_off else low
        if not 1 <= low <= high:
            raise TunerError(
                f"`ranges` {knob.name}={text}: expected 0..HIGH or LOW..HIGH with 1 ≤ LOW ≤ HIGH"
            )
        if allow_off and high == 0:
            raise TunerError(
                f"`ranges` {knob.name}={text}: use `fixed` {knob.name}=0 to fix it off"
            )
        return KnobRange(knob, max(low, 2), high, allow_off=allow_off)
    if not 1 <= low <= high:
        raise TunerError(f"`ranges` {knob.name}={text}: expected 1 ≤ LOW ≤ HIGH")
    return KnobRange(knob, low, high)


def _share_range(knob: Knob, text: str, spec: str) -> KnobRange:
    """``0..0.05`` (off or a share up to 5%) or ``0.01..0.05``: shares of the KV pool, each
    searched value twice the last, from a thousandth up."""
    low_text, sep, high_text = spec.partition("..")
    try:
        low, high = float(low_text), float(high_text if sep else low_text)
    except ValueError:
        raise TunerError(f"`ranges` {knob.name}={text}: expected LOW..HIGH, e.g. 0..0.1") from None
    if not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high < 1):
        raise TunerError(f"`ranges` {knob.name}={text}: expected 0 ≤ LOW ≤ HIGH < 1")
    allow_off = low == 0
    low_permille = max(1, round(low * PER_MILLE))
    high_permille = round(high * PER_MILLE)
    if high_permille < max(low_permille, 1):
        raise TunerError(
            f"`ranges` {knob.name}={text}: HIGH must be at least 0.001 (a thousandth of the pool)"
            if allow_off or high < 0.001
            else f"`ranges` {knob.name}={text}: expected LOW ≤ HIGH in thousandths"
        )
    return KnobRange(knob, low_permille, high_permille, allow_off=allow_off)


def _parse_bool(text: str, name: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise TunerError(f"{name}: expected true or false, got {text!r}")


def load_space_file(path: str | Path) -> dict[str, str]:
    """A YAML file of ``knob: LOW..HIGH`` (or ``[LOW, HIGH]``, booleans as a list)."""
    try:
        data = read_yaml(path)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TunerError(f"{path}: cannot read the space file: {why_unreadable(exc)}") from None
    if not isinstance(data, dict):
        raise TunerError(f"{path}: expected a mapping of knob: range")
    result: dict[str, str] = {}
    for name, value in data.items():
        if isinstance(value, list):
            value = (
                ",".join(str(v).lower() for v in value)
                if all(isinstance(v, bool) for v in value)
                else "..".join(str(v) for v in value)
            )
        result[str(name)] = str(value).lower() if isinstance(value, bool) else str(value)
    return result
