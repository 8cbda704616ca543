"""The library's fields as the command line spells them: one table from field to flag, the
help of every option taken from the docstring of the field it sets, and library messages
(which name fields, in backticks) rewritten with flags.

The library takes values and names what is wrong by its field (``InputError("trials", ...)``,
or `` `trials` `` inside a sentence); only here does a field become ``--trials``.
"""

from __future__ import annotations

import re

from prefill_tuner.declared import field_docs

FLAGS: dict[str, str] = {
    # the study (StudyPlan, build_plan)
    "slos": "--slo",
    "name": "--study",
    "objective_mode": "--objective",
    "sampler": "--sampler",
    "screen_trials": "--screen",
    "storage_url": "--storage",
    "model": "--model",
    "trials": "--trials",
    "error_budget": "--error-budget",
    "timeout_s": "--timeout",
    "seed": "--seed",
    "rule_trials": "--rule-trials",
    "capacity_tolerance": "--capacity-tolerance",
    "early_abort": "--early-abort",
    "judge_windows": "--judge-window",
    "headroom": "--headroom",
    "headroom_check": "--headroom-check",
    # its space (SpaceSpec)
    "fixed": "--set",
    "ranges": "--space",
    "space_file": "--space-file",
    # its trace (TraceSpec, ShapeOptions)
    "trace": "--trace",
    "format": "--format",
    "sort": "--sort",
    "classes": "--classes",
    "dequantize_s": "--dequantize",
    "jitter_seed": "--jitter-seed",
    "start_s": "--start",
    "duration_s": "--duration",
    "rate_scale": "--rate-scale",
    "max_model_len": "--max-model-len",
    "over_length": "--over-length",
    "max_requests": "--max-requests",
    "max_concurrency": "--max-concurrency",
    # the engine (EngineOptions)
    "engine": "--engine",
    "profile": "--profile",
    "vllm_python": "--vllm-python",
    "serve_cmd": "--serve-cmd",
    "server_args": "--server-arg",
    "server_env": "--server-env",
    "log_dir": "--log-dir",
    "hang_timeout_s": "--hang-timeout",
    "reuse_servers": "--reuse-servers",
    "model_config": "--model-config",
    "gpu": "--gpu",
    "tp": "--tp",
    "dtype": "--dtype",
    "expert_parallel": "--enable-expert-parallel",
    "kv_cache_dtype": "--kv-cache-dtype",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    # the simulator's own KV pool (tune simulate)
    "num_gpu_blocks": "--num-gpu-blocks",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    # the nightly job (NightlyJob)
    "family": "--study",
    "report_dir": "--report-dir",
    "repeats": "--repeats",
    "min_gain": "--min-gain",
    "deadline_s": "--deadline",
    "verify": "--verify",
    # calibration
    "from_study": "--from-study",
    # tune trace synth
    "rate": "--rate",
    "duration": "--duration",
    "cv": "--cv",
    "count": "--count",
}
"""The flag of each library field a user sets from the command line."""

_FIELD = re.compile(r"`([a-z][a-z0-9_]*)`")
_LITERAL = re.compile(r"``([^`]+)``")


def flag_of(field: str) -> str:
    """The flag that sets ``field`` (a field no table names: ``--`` and its dashed name)."""
    return FLAGS.get(field) or "--" + field.replace("_", "-")


GENERATED: dict[str, str] = {}
"""The flag of each field an option was generated from (``declared_options.option``): a
message naming one says its flag though :data:`FLAGS` does not list it."""


def generated(field: str, flag: str) -> None:
    """Record that ``flag`` sets ``field`` (the first flag a field gets stays)."""
    GENERATED.setdefault(field, flag)


def with_flags(message: str) -> str:
    """A library message as the command line says it: every field it names in backticks
    becomes its flag (a name no flag sets loses its backticks)."""
    return _FIELD.sub(
        lambda m: FLAGS.get(m.group(1)) or GENERATED.get(m.group(1), m.group(1)), message
    )


def help_of(cls: type, field: str, *, prefix: str = "") -> str:
    """The help of the option that sets ``cls``'s ``field``: the first paragraph of the
    field's docstring, its ````field```` references written as flags."""
    first = field_docs(cls)[field].split("\n\n")[0]
    text = _LITERAL.sub(lambda m: FLAGS.get(m.group(1), m.group(1)), " ".join(first.split()))
    return prefix + text
