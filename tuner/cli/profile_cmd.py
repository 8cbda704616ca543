"""``tune profile``: a simulator profile built from measured kernel timings, for a model on a
GPU at a tensor-parallel size and dtype, written to a file (a thin shell over
:class:`~prefill_tuner.engines.sim.hardware.ProfileSpec`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from prefill_tuner import defaults
from prefill_tuner.cli.display import output_console
from prefill_tuner.cli.options import HARDWARE, ModelOpt, with_options
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.engines.sim.kernels import KernelProfile, bundled_models, known_gpus
from prefill_tuner.engines.sim.kernels.models import config_files
from prefill_tuner.engines.sim.kernels.tables import expert_gpus
from prefill_tuner.engines.sim.profile_base import StepShape, check_profile_name
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_text, check_output


@with_options(hardware=HARDWARE)
def profile_command(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the profile (YAML) here.")
    ] = None,
    model: ModelOpt = defaults.MODEL,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            "--max-model-len",
            min=2,
            max=2**31 - 1,
            help="Context length the KV pool must hold one request of (default: the model's).",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="The profile's name (default: model, GPU, TP and dtypes)."),
    ] = None,
    listing: Annotated[
        bool, typer.Option("--list", help="List the GPUs and bundled models, and exit.")
    ] = False,
    *,
    hardware: ProfileSpec,
) -> None:
    """Build a simulator profile from measured kernel timings (NVIDIA AIConfigurator's vLLM
    tables) for a dense or mixture-of-experts model on a GPU, and write it: tune
    run/simulate/plan take it with --profile (or build the same with --gpu)."""
    out = output_console()
    if listing:
        out.print(f"GPUs: {', '.join(known_gpus())}", markup=False, soft_wrap=True)
        experts = "; ".join(f"{gpu} ({', '.join(kinds)})" for gpu, kinds in expert_gpus().items())
        out.print(f"mixture-of-experts tables: {experts}", markup=False, soft_wrap=True)
        out.print(f"bundled models: {', '.join(bundled_models())}", markup=False, soft_wrap=True)
        return
    if hardware.gpu is None:
        raise TunerError("--gpu: give the GPU to build for (tune profile --list shows them)")
    hardware.check()
    if hardware.profile is not None:
        raise TunerError("--profile: tune profile builds a profile; give --gpu, not --profile")
    if output is None:
        raise TunerError("--output: give the file to write the profile to (-o profile.yaml)")
    if name is not None:
        check_profile_name(name, "--name")
    check_output(output, config_files(hardware.model_config) if hardware.model_config else [])
    profile = hardware.build(model, max_model_len, name)
    with atomic_text(output) as stream:
        stream.write(f"# made by: {_command(hardware, model, max_model_len, name)}\n")
        stream.write(profile.yaml_text())
    out.print(escape(f"wrote profile {profile.name} to {output}"), soft_wrap=True)
    for line in _summary(profile):
        out.print(escape(f"  {line}"), soft_wrap=True)


def _command(hardware: ProfileSpec, model: str, max_model_len: int | None, name: str | None) -> str:
    """The ``tune profile`` line that builds this profile again (any output file)."""
    args = ["tune", "profile"]
    args += (
        ["--model-config", hardware.model_config] if hardware.model_config else ["--model", model]
    )
    args += ["--gpu", str(hardware.gpu)]
    given = {
        "--tp": (hardware.tp, 1),
        "--dtype": (hardware.dtype, None),
        "--enable-expert-parallel": (hardware.expert_parallel, False),
        "--kv-cache-dtype": (hardware.kv_cache_dtype, "auto"),
        "--gpu-memory-utilization": (
            hardware.gpu_memory_utilization,
            defaults.GPU_MEMORY_UTILIZATION,
        ),
        "--max-model-len": (max_model_len, None),
        "--name": (name, None),
    }
    for flag, (value, default) in given.items():
        if value is True:
            args.append(flag)
        elif value != default:
            args += [flag, str(value)]
    return shlex.join([*args, "-o", "FILE"])


def _summary(profile: KernelProfile) -> list[str]:
    """What a user checks first: the pool, the defaults, a few step times, the provenance."""
    defaults_ = profile.engine_defaults
    blocks, size = int(defaults_["num_gpu_blocks"]), int(defaults_["block_size"])
    steps = {
        "a decode at 1k context": StepShape(
            decode_tokens=1, requests=1, decode_context_tokens=1024
        ),
        "64 decodes at 2k": StepShape(
            decode_tokens=64, requests=64, decode_context_tokens=64 * 2048
        ),
        "a 2,048-token prefill": _prefill(2048),
        "an 8,192-token prefill": _prefill(8192),
    }
    times = "; ".join(
        f"{what} {profile.step_seconds(shape) * 1000:.1f} ms" for what, shape in steps.items()
    )
    provenance = profile.provenance
    lines = [
        profile.description,
        f"KV pool: {blocks:,} blocks of {size} tokens ({(blocks - 1) * size:,} tokens); "
        f"max_model_len {int(defaults_['max_model_len']):,}",
        f"vLLM's defaults there: max_num_batched_tokens {defaults_['max_num_batched_tokens']}, "
        f"max_num_seqs {defaults_['max_num_seqs']}",
        f"steps: {times}",
        f"provenance: {provenance.summary()}",
        *(f"interpolated: {note}" for note in provenance.interpolated),
        *(f"extrapolated: {note}" for note in provenance.extrapolated),
    ]
    if profile.serve_args:
        lines.append(f"serve lines carry: {' '.join(profile.serve_args)}")
    return lines


def _prefill(tokens: int) -> StepShape:
    return StepShape(
        prefill_tokens=tokens,
        requests=1,
        prefill_context_tokens=tokens,
        prefill_attention_pairs=tokens * (tokens + 1) // 2,
        prefill_chunks=((0, tokens),),
    )
