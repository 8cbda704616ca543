"""Rendering engine settings as ``vllm serve`` flags, a command line, or a ``--config`` YAML.

Only flags the target engine accepts are emitted (:class:`EngineCapabilities`: the flags its
parser accepts, and never a knob removed from its vLLM version, see ``Knob.removed_in``);
booleans use vLLM's ``--flag`` / ``--no-flag`` forms; the YAML uses the flag names without
dashes, which is what ``vllm serve --config FILE`` reads
(``FlexibleArgumentParser.load_config_file``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.rules import BUDGET, OFF, THRESHOLD, threshold_moot
from prefill_tuner.search_spaces.space import EngineCapabilities, knob_removed

VLLM_NAMES = {"num_gpu_blocks": "num_gpu_blocks_override"}
"""Simulator settings whose ``vllm serve`` flag has another name."""
NOT_FLAGS = frozenset({"kv_cache_memory_bytes"})


def flag_name(setting: str) -> str:
    """``max_num_seqs`` → ``max-num-seqs`` (no leading dashes)."""
    return VLLM_NAMES.get(setting, setting).replace("_", "-")


def serve_args(
    settings: Mapping[str, Any], capabilities: EngineCapabilities | None = None
) -> list[str]:
    """``--max-num-seqs 64 --no-enable-chunked-prefill ...`` for the given settings."""
    accepted = capabilities.accepted_flags if capabilities else None
    args: list[str] = []
    for setting, value in settings.items():
        if setting in NOT_FLAGS or value is None:  # None: vLLM's own default stands
            continue
        flag = "--" + flag_name(setting)
        if accepted is not None and flag not in accepted:
            continue
        knob = KNOBS.get(setting)
        if capabilities is not None and knob is not None and knob_removed(knob, capabilities):
            continue  # the server would refuse it, even where its flags were not probed
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag_name(setting))
        else:
            args += [flag, str(value)]
    return args


def canonical_command(command: str) -> str:
    """A stored ``vllm serve`` line in its canonical form: a ``--long-prefill-token-threshold``
    at or above the line's ``--max-num-batched-tokens`` caps nothing (:func:`~prefill_tuner.
    search_spaces.rules.threshold_moot`) and is written 0 (off), as this version writes every
    serve line; an earlier version recorded such lines. Any other line is returned as it is."""
    words = shlex.split(command)
    last = {word: index for index, word in enumerate(words[:-1]) if word.startswith("--")}
    threshold_at = last.get("--" + flag_name(THRESHOLD))
    budget_at = last.get("--" + flag_name(BUDGET))
    if threshold_at is None or budget_at is None:
        return command
    try:
        moot = threshold_moot(
            {THRESHOLD: int(words[threshold_at + 1]), BUDGET: int(words[budget_at + 1])}
        )
    except ValueError:
        return command
    if not moot:
        return command
    words[threshold_at + 1] = str(OFF)
    return shlex.join(words)


def serve_command(
    model: str,
    settings: Mapping[str, Any],
    capabilities: EngineCapabilities | None = None,
    server_args: Sequence[str] = (),
) -> str:
    """A ready ``vllm serve MODEL ...`` line: the user's own ``server_args`` (``--dtype
    float32``; secrets already redacted, ``--api-key '<redacted>'``), then the settings (as
    the trial's server got them: a setting given twice is the later one)."""
    return shlex.join(["vllm", "serve", model, *server_args, *serve_args(settings, capabilities)])


def args_document(args: Sequence[str]) -> dict[str, Any]:
    """Server arguments as ``--config`` YAML keys: ``--dtype float32`` → ``dtype: float32``,
    ``--enforce-eager`` → ``enforce-eager: true``, ``--x a b`` → a list, whole numbers as
    numbers. Short options (``-tp``) have no YAML key and are refused."""
    document: dict[str, Any] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if not arg.startswith("--"):
            raise ValueError(f"server argument {arg!r} has no --config YAML key; use its --name")
        key, eq, inline = arg[2:].partition("=")
        values = [inline] if eq else []
        while not eq and index < len(args) and not args[index].startswith("--"):
            values.append(args[index])
            index += 1
        typed = [_number(value) for value in values]
        document[key] = True if not typed else typed[0] if len(typed) == 1 else typed
    return document


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def serve_yaml(
    settings: Mapping[str, Any], model: str | None = None, server_args: Sequence[str] = ()
) -> str:
    """A YAML file for ``vllm serve [MODEL] --config FILE``: the user's own ``server_args``
    (secrets redacted), then the settings.

    A false boolean is written ``no-FLAG: true``: vLLM turns ``FLAG: false`` into ``--no-FLAG``
    only when the top-level parser knows that option, which for ``vllm serve`` it does not, so
    ``enable-chunked-prefill: false`` would be silently ignored (checked on vLLM 0.32).
    """
    document: dict[str, Any] = {"model": model} if model else {}
    document.update(args_document(server_args))
    for setting, value in settings.items():
        if setting in NOT_FLAGS:
            continue
        if value is False:
            document["no-" + flag_name(setting)] = True
        else:
            document[flag_name(setting)] = value
    return yaml.safe_dump(document, sort_keys=False)


def command_yaml(command: str, with_model: bool = True) -> str:
    """The ``--config`` YAML of a stored ``vllm serve MODEL ARGS...`` line (the user's own
    arguments and the settings, exactly as the line has them); ``with_model=False`` for
    ``vllm serve MODEL --config FILE``."""
    words = shlex.split(command)
    if words[:2] != ["vllm", "serve"] or len(words) < 3:
        raise ValueError(f"not a 'vllm serve MODEL ...' line: {command[:80]}")
    document: dict[str, Any] = {"model": words[2]} if with_model else {}
    document.update(args_document(words[3:]))
    return yaml.safe_dump(document, sort_keys=False)
