"""The measured kernel tables shipped with the tuner (``data/``), as NumPy arrays.

Derived from NVIDIA AIConfigurator's performance database (Apache-2.0; ``data/NOTICE.md`` and
``data/index.json`` say what came from where) by ``scripts/build-kernel-tables``. Per GPU,
``<gpu>.npz`` holds (latencies in milliseconds, ``NaN`` where nothing was measured):

``gemm.<dtype>.{m,n,k,ms}``
    GEMM latency over the ``n × k × m`` grid (``m`` tokens, ``n`` outputs, ``k`` inputs), for
    the kernel vLLM runs at that weight dtype (``bf16``, ``fp8``).
``ctx.<kv>.{keys,tokens,ms}``
    Context (prefill) attention of one sequence of ``tokens`` tokens, causal, with no prior
    context, per ``(heads, KV heads, head_dim)`` key; KV-cache write included.
``gen.<kv>.{keys,batch,kv,ms}``
    Decode attention of ``batch`` requests each reading ``kv`` KV tokens (its own included),
    per key.
``allreduce.{gpus,elements,ms}``, ``allgather.{gpus,elements,ms}``
    vLLM's all-reduce of ``elements`` bf16 values across ``gpus`` GPUs; NCCL's all-gather.
``moe.<dtype>.{keys,tokens,ms}``
    A mixture-of-experts layer's fused experts over the step's ``tokens``, per ``(hidden,
    expert width, top-k, experts, expert TP, expert EP)`` key, balanced routing (``bf16``,
    ``fp8``, ``fp8_block``, ``mxfp4``: ``kernels/experts.py``).

Nothing here needs pandas or pyarrow, and nothing is fetched: the tables are package data.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefill_tuner.errors import TunerError

DATA_DIR = Path(__file__).parent / "data"


@functools.cache
def index() -> dict[str, Any]:
    """``data/index.json``: the source (repository, commit, directory) and, per GPU, its
    system description and where each table family came from."""
    data: dict[str, Any] = json.loads((DATA_DIR / "index.json").read_text())
    return data


def known_gpus() -> list[str]:
    """The GPUs with measured tables (``h100_sxm``, ...)."""
    return sorted(index()["gpus"])


def expert_gpus() -> dict[str, list[str]]:
    """The GPUs with fused mixture-of-experts tables, and the expert dtypes each times."""
    return {
        gpu: sorted(entry["tables"]["moe"]["kernels"])
        for gpu, entry in sorted(index()["gpus"].items())
        if "moe" in entry["tables"]
    }


@dataclass(frozen=True)
class GpuTables:
    """One GPU's tables and system description."""

    gpu: str
    system: dict[str, Any]
    """Memory capacity and bandwidth, peak throughput, SM version, NCCL buffers (from
    AIConfigurator's ``<gpu>.yaml``)."""
    sources: dict[str, Any]
    """Per table family: the vLLM (or NCCL) version, the files, the kernels."""
    arrays: dict[str, np.ndarray]

    def has(self, prefix: str) -> bool:
        return f"{prefix}.ms" in self.arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


@functools.cache
def gpu_tables(gpu: str) -> GpuTables:
    """The tables of ``gpu``; a one-line :class:`TunerError` for a GPU without any."""
    gpus = index()["gpus"]
    if gpu not in gpus:
        raise TunerError(
            f"`gpu` {gpu!r}: no measured kernel tables (known: {', '.join(sorted(gpus))})"
        )
    with np.load(DATA_DIR / f"{gpu}.npz", allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    for array in arrays.values():
        array.setflags(write=False)
    entry = gpus[gpu]
    return GpuTables(gpu=gpu, system=entry["system"], sources=entry["tables"], arrays=arrays)
