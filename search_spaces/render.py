"""Rendering engine settings as ``vllm serve`` flags, a command line, or a ``--config`` YAML.

Only flags the target engine accepts are emitted (:class:`EngineCapabilities`); booleans use
vLLM's ``--flag`` / ``--no-flag`` forms; the YAML uses the flag names without dashes, which is
what ``vllm serve --config FILE`` reads (``FlexibleArgumentParser.load_config_file``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import yaml
from prefill_tuner.search_spaces.space import EngineCapabilities

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
        if setting in NOT_FLAGS:
            continue
        flag = "--" + flag_name(setting)
        if accepted is not None and flag not in accepted:
            continue
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag_name(setting))
        else:
            args += [flag, str(value)]
    return args


def serve_command(
    model: str, settings: Mapping[str, Any], capabilities: EngineCapabilities | None = None
) -> str:
    """A ready ``vllm serve MODEL ...`` line."""
    return shlex.join(["vllm", "serve", model, *serve_args(settings, capabilities)])


def serve_yaml(settings: Mapping[str, Any], model: str | None = None) -> str:
    """A YAML file for ``vllm serve [MODEL] --config FILE``.

    A false boolean is written ``no-FLAG: true``: vLLM turns ``FLAG: false`` into ``--no-FLAG``
    only when the top-level parser knows that option, which for ``vllm serve`` it does not, so
    ``enable-chunked-prefill: false`` would be silently ignored (checked on vLLM 0.32).
    """
    document: dict[str, Any] = {"model": model} if model else {}
    for setting, value in settings.items():
        if setting in NOT_FLAGS:
            continue
        if value is False:
            document["no-" + flag_name(setting)] = True
        else:
            document[flag_name(setting)] = value
    return yaml.safe_dump(document, sort_keys=False)
