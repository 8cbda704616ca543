"""vLLM's rules between scheduler knobs, kept once.

vLLM's ``SchedulerConfig`` refuses a configuration that breaks one of these. The tuner uses
each rule twice, from here: the simulator's config validation refuses what vLLM refuses
(:meth:`Rule.broken`), and every sampled trial is repaired to satisfy them
(:func:`effective_settings`, :meth:`Rule.repair`), so no trial is spent on a configuration
vLLM would refuse while Optuna's distributions stay static.

A rule reads its knobs from a mapping of settings; a knob that is not there (not set, not
sampled) satisfies every rule it is in. ``max_model_len`` is always given by the caller.

Beside the rules vLLM enforces, one setting has more than one spelling that schedules the same:
:func:`canonical` gives each its one form, so two trials that would schedule identically carry
identical settings, and no serve line carries a flag that changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """One rule vLLM enforces between knobs."""

    name: str
    broken: Callable[[Mapping[str, Any]], str | None]
    """What is wrong with the settings, as vLLM would refuse them (``None``: the rule holds)."""
    repair: Callable[[dict[str, Any]], str]
    """Change the settings (in place) so that the rule holds; returns a note of the change.
    Called only when :attr:`broken` says so."""


def _budget_covers_context(settings: Mapping[str, Any]) -> str | None:
    budget, length = settings.get("max_num_batched_tokens"), settings["max_model_len"]
    if settings.get("enable_chunked_prefill") is False and budget is not None and budget < length:
        return (
            f"with chunked prefill off, max_num_batched_tokens ({budget}) must be at least "
            f"max_model_len ({length})"
        )
    return None


def _raise_budget(settings: dict[str, Any]) -> str:
    settings["max_num_batched_tokens"] = length = settings["max_model_len"]
    return f"chunked prefill off: max_num_batched_tokens raised to max_model_len {length}"


def _budget_covers_seqs(settings: Mapping[str, Any]) -> str | None:
    budget, seqs = settings.get("max_num_batched_tokens"), settings.get("max_num_seqs")
    if budget is not None and seqs is not None and budget < seqs:
        return f"max_num_batched_tokens ({budget}) must be at least max_num_seqs ({seqs})"
    return None


def _lower_seqs(settings: dict[str, Any]) -> str:
    settings["max_num_seqs"] = budget = settings["max_num_batched_tokens"]
    return f"max_num_seqs lowered to max_num_batched_tokens {budget}"


def _active_within_seqs(settings: Mapping[str, Any]) -> str | None:
    active, seqs = settings.get("max_num_active_seqs"), settings.get("max_num_seqs")
    if active is not None and seqs is not None and active > seqs:
        return f"max_num_active_seqs ({active}) cannot be greater than max_num_seqs ({seqs})"
    return None


def _lower_active(settings: dict[str, Any]) -> str:
    settings["max_num_active_seqs"] = seqs = settings["max_num_seqs"]
    return f"max_num_active_seqs lowered to max_num_seqs {seqs}"


def _threshold_within_context(settings: Mapping[str, Any]) -> str | None:
    threshold, length = settings.get("long_prefill_token_threshold"), settings["max_model_len"]
    if threshold and threshold > length:
        return (
            f"long_prefill_token_threshold ({threshold}) must not exceed max_model_len ({length})"
        )
    return None


def _lower_threshold(settings: dict[str, Any]) -> str:
    settings["long_prefill_token_threshold"] = length = settings["max_model_len"]
    return f"long_prefill_token_threshold lowered to max_model_len {length}"


RULES: tuple[Rule, ...] = (
    # First: raising the budget can only help the next rule.
    Rule("budget covers max_model_len without chunking", _budget_covers_context, _raise_budget),
    Rule("budget covers max_num_seqs", _budget_covers_seqs, _lower_seqs),
    # After it: lowering max_num_seqs can break this one.
    Rule("active requests within max_num_seqs", _active_within_seqs, _lower_active),
    Rule("threshold within max_model_len", _threshold_within_context, _lower_threshold),
)
"""vLLM's ``SchedulerConfig`` checks between knobs (``verify_max_model_len`` and
``__post_init__``), in the order they are repaired."""

THRESHOLD, BUDGET = "long_prefill_token_threshold", "max_num_batched_tokens"
ACTIVE = "max_num_active_seqs"
OFF = 0
"""``long_prefill_token_threshold`` off (vLLM's default)."""


def threshold_moot(settings: Mapping[str, Any]) -> bool:
    """Whether ``long_prefill_token_threshold`` caps nothing in these settings: it is at or
    above ``max_num_batched_tokens``. vLLM 0.32's scheduler (``vllm/v1/core/sched/
    scheduler.py``) cuts a request's new tokens to the threshold and then to the budget left in
    the step, which is never more than ``max_num_batched_tokens``: a threshold at or above it
    leaves every chunk as it was, chunked prefill on or off (off, the budget holds the whole
    context, so no prompt is longer than the threshold), adaptive or not (adaptive only raises
    it). Below the budget it does cut, even with chunked prefill off (a prompt is then split
    into threshold-sized chunks), so that is the only equivalence."""
    threshold, budget = settings.get(THRESHOLD), settings.get(BUDGET)
    return bool(threshold) and budget is not None and threshold >= budget


def canonical(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The one form of settings that schedule alike: a ``long_prefill_token_threshold`` at or
    above ``max_num_batched_tokens`` is off (0; :func:`threshold_moot`); a
    ``max_num_active_seqs`` at or above ``max_num_seqs`` is left out (it limits nothing).
    Returns the settings and a note for every change. Settings without a budget (the engine's
    default stands) are left as they are."""
    result = dict(settings)
    notes: list[str] = []
    active, seqs = result.get(ACTIVE), result.get("max_num_seqs")
    if active is not None and seqs is not None and active >= seqs:
        notes.append(
            f"max_num_active_seqs {active} is at max_num_seqs {seqs}, where it limits nothing: "
            "left out"
        )
        del result[ACTIVE]
    if threshold_moot(result):
        notes.append(
            f"long_prefill_token_threshold {result[THRESHOLD]} is at or above "
            f"max_num_batched_tokens {result[BUDGET]}, where it caps nothing: off (0)"
        )
        result[THRESHOLD] = OFF
    return result, notes


def first_broken(settings: Mapping[str, Any]) -> str | None:
    """What vLLM would refuse in ``settings`` (with ``max_model_len``), or ``None``."""
    return next((why for rule in RULES if (why := rule.broken(settings))), None)


def effective_settings(
    sampled: Mapping[str, Any], fixed: Mapping[str, Any], max_model_len: int
) -> tuple[dict[str, Any], list[str]]:
    """The settings a trial runs with: ``fixed`` over ``sampled``, repaired to satisfy every
    rule (``max_model_len``: the engine's context length), in their :func:`canonical` form.
    Returns the settings and a note for every repair or change made."""
    settings = {**sampled, **fixed}
    checked = {**settings, "max_model_len": max_model_len}
    notes: list[str] = []
    for rule in RULES:
        if rule.broken(checked):
            notes.append(rule.repair(checked))
    # A repair changes only knobs the settings have (a rule holds for a missing one).
    settings.update({key: checked[key] for key in settings if key != "max_model_len"})
    settings, changes = canonical(settings)
    return settings, notes + changes
