"""Building a :class:`~prefill_tuner.engines.sim.kernels.profile.KernelProfile`: the measured
tables read at one model's tensor-parallel shard on one GPU.

Where the shard's shape falls between measured points, the curves are interpolated as
AIConfigurator does (``docs/kernel-profiles.md``): a GEMM's utilisation (its speed-of-light
time over its measured time) bilinearly in log₂ N and log₂ K at each measured token count; an
attention curve linearly in the number of query heads. Beyond the measured points the
utilisation of the nearest one is held. Every such reading is listed in the profile's
provenance. What no table covers is refused with one line naming the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from prefill_tuner.defaults import GPU_MEMORY_UTILIZATION
from prefill_tuner.engines.sim.kernels.experts import expert_dtype, expert_layout, experts_curve
from prefill_tuner.engines.sim.kernels.memory import (
    BLOCK_SIZE,
    SAMPLER_PASSES,
    KvPool,
    gib,
    kv_pool,
    memory_bound_ops,
    shard,
)
from prefill_tuner.engines.sim.kernels.models import ModelShape
from prefill_tuner.engines.sim.kernels.profile import (
    Curve,
    DecodeGrid,
    GemmCurve,
    KernelProfile,
)
from prefill_tuner.engines.sim.kernels.tables import GpuTables, gpu_tables, index
from prefill_tuner.engines.sim.profile_base import Provenance
from prefill_tuner.errors import TunerError

_KV_DTYPES = {
    None: "bf16",
    "auto": "bf16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
}


@dataclass
class _Notes:
    interpolated: list[str] = field(default_factory=list)
    extrapolated: list[str] = field(default_factory=list)


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _sol(
    system: dict[str, Any], dtype: str, m: np.ndarray | float, n: float, k: float
) -> np.ndarray:
    """A GEMM's speed-of-light time (seconds): arithmetic at the datasheet's peak or its
    operands and result at peak bandwidth, whichever is longer (AIConfigurator's)."""
    flops = system["fp8_tc_flops"] if dtype == "fp8" else system["bfloat16_tc_flops"]
    width = 1.0 if dtype == "fp8" else 2.0
    m = np.asarray(m, dtype=np.float64)
    arithmetic = 2.0 * m * n * k / flops
    traffic = width * (m * n + m * k + n * k) / system["mem_bw"]
    return np.maximum(arithmetic, traffic)


def _site_curve(
    system: dict[str, Any], dtype: str, m_axis: np.ndarray, ms: np.ndarray, n: float, k: float
) -> tuple[np.ndarray, int] | None:
    """A measured (N, K) site's latency at every token count of the grid: measured points as
    they are, missing ones linear in tokens between measured ones, beyond the last measured
    one its utilisation held (the first one held below). ``None`` for a site never measured;
    else the curve and how many points were filled."""
    measured = ~np.isnan(ms)
    if not measured.any():
        return None
    xs, ys = m_axis[measured], ms[measured]
    curve = np.interp(m_axis, xs, ys)
    beyond = m_axis > xs[-1]
    if beyond.any():
        curve[beyond] = (
            ys[-1] * _sol(system, dtype, m_axis[beyond], n, k) / _sol(system, dtype, xs[-1], n, k)
        )
    curve[measured] = ys
    return curve, int((~measured).sum())


def _bracket(axis: np.ndarray, value: float) -> tuple[int, int, float, str]:
    """Indices of the measured values around ``value`` (the same twice at or beyond an end),
    its log₂ weight between them, and how it was read (``""``, ``"between"``, ``"beyond"``)."""
    if value <= axis[0]:
        return 0, 0, 0.0, "" if value == axis[0] else "beyond"
    if value >= axis[-1]:
        return axis.size - 1, axis.size - 1, 0.0, "" if value == axis[-1] else "beyond"
    hi = int(np.searchsorted(axis, value))
    if axis[hi] == value:
        return hi, hi, 0.0, ""
    lo = hi - 1
    weight = (math.log2(value) - math.log2(axis[lo])) / (math.log2(axis[hi]) - math.log2(axis[lo]))
    return lo, hi, weight, "between"


def _gemm(tables: GpuTables, dtype: str, name: str, n: int, k: int, notes: _Notes) -> GemmCurve:
    """GEMM ``name`` of ``n`` outputs and ``k`` inputs at every token count of the tables."""
    system = tables.system
    m_axis = tables[f"gemm.{dtype}.m"].astype(np.float64)
    n_axis, k_axis = tables[f"gemm.{dtype}.n"], tables[f"gemm.{dtype}.k"]
    grid = tables[f"gemm.{dtype}.ms"]
    n0, n1, wn, how_n = _bracket(n_axis, n)
    k0, k1, wk, how_k = _bracket(k_axis, k)
    label = f"GEMM {name} (N {_n(n)}, K {_n(k)})"
    if not how_n and not how_k:
        site = _site_curve(system, dtype, m_axis, grid[n0, k0], n, k)
        if site is not None:
            curve, filled = site
            if filled:
                notes.interpolated.append(
                    f"{label}: {filled} of {m_axis.size} token counts not measured at this "
                    "shape, linear in tokens between measured ones (utilisation held beyond)"
                )
            return GemmCurve(n=n, k=k, ms=tuple(float(v) for v in curve))
    # Between or beyond measured shapes: the utilisation of the nearest sites, bilinear in
    # log₂ N and log₂ K, at each token count; latency = speed of light / utilisation.
    total = np.zeros_like(m_axis)
    weights = 0.0
    for i, w_i in ((n0, 1.0 - wn), (n1, wn)):
        for j, w_j in ((k0, 1.0 - wk), (k1, wk)):
            weight = w_i * w_j
            if weight == 0.0:
                continue
            site = _site_curve(
                system, dtype, m_axis, grid[i, j], float(n_axis[i]), float(k_axis[j])
            )
            if site is None:
                continue
            utilisation = _sol(system, dtype, m_axis, n_axis[i], k_axis[j]) / site[0]
            total += weight * utilisation
            weights += weight
    if weights == 0.0:
        raise TunerError(f"{label}: no measured {tables.gpu} {dtype} GEMM near this shape")
    curve = _sol(system, dtype, m_axis, n, k) / (total / weights)
    for axis_name, axis, lo, hi, how in (
        ("N", n_axis, n0, n1, how_n),
        ("K", k_axis, k0, k1, how_k),
    ):
        if how == "between":
            notes.interpolated.append(
                f"{label}: {axis_name} between the measured {_n(axis[lo])} and "
                f"{_n(axis[hi])} (utilisation, bilinear in log₂ N and K)"
            )
        elif how == "beyond":
            notes.extrapolated.append(
                f"{label}: {axis_name} beyond the measured {_n(axis[lo])} (its utilisation held)"
            )
    return GemmCurve(n=n, k=k, ms=tuple(float(v) for v in curve))


def _attention_rows(
    tables: GpuTables,
    prefix: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    what: str,
    notes: _Notes,
) -> list[tuple[int, float]]:
    """The table rows of ``(heads, kv_heads, head_dim)``: the row itself, or the two with the
    nearest query-head counts around it (same KV heads), weighted linearly."""
    keys = tables[f"{prefix}.keys"]
    dims = sorted({int(d) for d in keys[:, 2]})
    if head_dim not in dims:
        raise TunerError(
            f"head_dim {head_dim}: the {tables.gpu} {what} attention tables measure head_dim "
            f"{', '.join(map(str, dims))}"
        )
    same = keys[(keys[:, 1] == kv_heads) & (keys[:, 2] == head_dim)]
    if not same.size:
        measured = sorted({int(v) for v in keys[keys[:, 2] == head_dim][:, 1]})
        raise TunerError(
            f"{kv_heads} KV heads per GPU (head_dim {head_dim}): the {tables.gpu} {what} "
            f"attention tables measure {', '.join(map(str, measured))}"
        )
    rows = {int(key[0]): int(np.flatnonzero((keys == key).all(axis=1))[0]) for key in same}
    if heads in rows:
        return [(rows[heads], 1.0)]
    lower = [h for h in rows if h < heads]
    upper = [h for h in rows if h > heads]
    if not lower or not upper:
        raise TunerError(
            f"{heads} query heads per GPU with {kv_heads} KV heads (head_dim {head_dim}): the "
            f"{tables.gpu} {what} attention tables measure {', '.join(map(str, sorted(rows)))}"
        )
    lo, hi = max(lower), min(upper)
    weight = (heads - lo) / (hi - lo)
    notes.interpolated.append(
        f"{what} attention: {heads} query heads per GPU between the measured {lo} and {hi} "
        f"({kv_heads} KV heads), linear in heads"
    )
    return [(rows[lo], 1.0 - weight), (rows[hi], weight)]


def _context_curve(
    tables: GpuTables, kv: str, heads: int, kv_heads: int, head_dim: int, notes: _Notes
) -> Curve:
    prefix = f"ctx.{kv}"
    tokens = tables[f"{prefix}.tokens"].astype(np.float64)
    grid = tables[f"{prefix}.ms"]
    total = np.zeros_like(tokens)
    filled = 0
    for row, weight in _attention_rows(tables, prefix, heads, kv_heads, head_dim, "context", notes):
        ys = grid[row].copy()
        measured = ~np.isnan(ys)
        xs = tokens[measured]
        ys_m = ys[measured]
        filled += int((~measured).sum())
        curve = np.interp(tokens, xs, ys_m)
        beyond = tokens > xs[-1]
        curve[beyond] = ys_m[-1] * tokens[beyond] * (tokens[beyond] + 1) / (xs[-1] * (xs[-1] + 1))
        total += weight * curve
    if filled:
        notes.interpolated.append(
            f"context attention: {filled} sequence lengths not measured at this shape, "
            "filled from their neighbours"
        )
    notes.extrapolated.append(
        f"context attention beyond {_n(tokens[-1])} tokens of context: the per-pair time "
        f"at {_n(tokens[-1])} held"
    )
    if tokens[0] > 1:
        notes.extrapolated.append(
            f"context attention below {_n(tokens[0])} tokens: the {_n(tokens[0])}-token time held"
        )
    return Curve(x=tuple(float(v) for v in tokens), ms=tuple(float(v) for v in total))


def _decode_grid(
    tables: GpuTables, kv: str, heads: int, kv_heads: int, head_dim: int, notes: _Notes
) -> DecodeGrid:
    prefix = f"gen.{kv}"
    batch = tables[f"{prefix}.batch"].astype(np.float64)
    lengths = tables[f"{prefix}.kv"].astype(np.float64)
    grid = tables[f"{prefix}.ms"]
    total = np.zeros((batch.size, lengths.size))
    filled = 0
    for row, weight in _attention_rows(tables, prefix, heads, kv_heads, head_dim, "decode", notes):
        values = grid[row].copy()
        missing = np.isnan(values)
        filled = max(filled, int(missing.sum()))
        for i in range(batch.size):
            ys = values[i]
            measured = ~np.isnan(ys)
            if not measured.any():
                if i == 0:  # nothing smaller to scale from: not guessed
                    first = next(j for j in range(batch.size) if not np.isnan(values[j]).all())
                    raise TunerError(
                        f"`kv_cache_dtype` {kv}: the {tables.gpu} decode attention tables "
                        f"measure {heads} query heads per GPU with {kv_heads} KV heads "
                        f"(head_dim {head_dim}) only from batch {_n(batch[first])}"
                    )
                # No point at this batch size: the smaller batch's row, in proportion.
                values[i] = values[i - 1] * batch[i] / batch[i - 1]
                continue
            xs, ys_m = lengths[measured], ys[measured]
            row_values = np.interp(lengths, xs, ys_m)
            beyond = lengths > xs[-1]
            row_values[beyond] = ys_m[-1] * lengths[beyond] / xs[-1]
            values[i] = row_values
        total += weight * values
    if filled:
        notes.extrapolated.append(
            f"decode attention: {filled} of {total.size} batch × KV-length points beyond the "
            "measured ones (long contexts at large batches), time in proportion to the KV "
            "read from the batch's longest measured context"
        )
    notes.extrapolated.append(
        f"decode attention beyond {_n(batch[-1])} requests or {_n(lengths[-1])} KV tokens: in "
        "proportion"
    )
    return DecodeGrid(
        batch=tuple(int(b) for b in batch),
        kv_tokens=tuple(int(v) for v in lengths),
        ms=tuple(tuple(float(v) for v in row) for row in total),
    )


def with_windows(
    model: ModelShape, context: Curve, decode: DecodeGrid, notes: _Notes
) -> tuple[Curve, DecodeGrid]:
    """A layer's attention averaged over the model's full and sliding-window layers (the
    profile charges every layer alike): a window layer's prefill of ``s`` tokens costs the
    full curve's ``min(s, w)`` time, per token beyond ``w`` in proportion; its decode reads at
    most ``w`` KV tokens (the full kernel at ``min(kv, w)``)."""
    w, share = float(model.window), model.window_layers / model.layers
    x = np.asarray(context.x)
    full = np.asarray(context.ms)
    at_w = float(np.interp(w, x, full))
    windowed = np.where(x <= w, full, at_w * x / w)
    lengths = np.asarray(decode.kv_tokens, dtype=np.float64)
    rows = np.asarray(decode.ms)
    read = np.array([np.interp(np.minimum(lengths, w), lengths, row) for row in rows])
    notes.extrapolated.append(
        f"sliding-window attention ({model.window_layers} of {model.layers} layers, a "
        f"{model.window}-token window): the full-attention kernels at the window's length "
        "(prefill per token beyond it in proportion; decode reading at most the window)"
    )
    return (
        Curve(x=context.x, ms=tuple(float(v) for v in (1 - share) * full + share * windowed)),
        DecodeGrid(
            batch=decode.batch,
            kv_tokens=decode.kv_tokens,
            ms=tuple(tuple(float(v) for v in row) for row in (1 - share) * rows + share * read),
        ),
    )


def _comm_curve(tables: GpuTables, prefix: str, tp: int) -> Curve:
    gpus = [int(g) for g in tables[f"{prefix}.gpus"]]
    row = tables[f"{prefix}.ms"][gpus.index(tp)]
    elements = tables[f"{prefix}.elements"].astype(np.float64)
    measured = ~np.isnan(row)
    return Curve(
        x=tuple(float(v) for v in elements[measured]),
        ms=tuple(float(v) for v in row[measured]),
    )


def _short_name(model: str) -> str:
    base = model.rstrip("/").split("/")[-1].removesuffix(".json")
    if base == "config":
        base = model.rstrip("/").split("/")[-2] if "/" in model.rstrip("/") else "model"
    return re.sub(r"[^a-z0-9.]+", "-", base.lower()).strip("-") or "model"


def build_kernel_profile(
    model: ModelShape,
    gpu: str,
    tp: int,
    dtype: Literal["bf16", "fp8"],
    kv_cache_dtype: str | None = None,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    max_model_len: int | None = None,
    name: str | None = None,
    expert_parallel: bool = False,
) -> KernelProfile:
    """The kernel profile of ``model`` on ``tp`` GPUs ``gpu`` with ``dtype`` weights (and a
    ``kv_cache_dtype`` KV cache: ``bf16`` unless ``fp8``), its KV pool sized as vLLM sizes it
    at ``gpu_memory_utilization``, serving up to ``max_model_len`` tokens (the model's context
    unless given); a mixture-of-experts model's experts split over the GPUs, or spread whole
    with ``expert_parallel``. A one-line :class:`TunerError` naming the field for anything the
    tables do not cover or vLLM would refuse."""
    tables = gpu_tables(gpu)
    system = tables.system
    notes = _Notes()
    kv = _checked_request(tables, gpu, tp, dtype, kv_cache_dtype, gpu_memory_utilization)
    if model.checkpoint_dtype in ("fp8", "fp8_block") and dtype != "fp8":
        raise TunerError(
            f"`dtype` {dtype}: {model.name} is an {model.checkpoint_dtype} checkpoint, which "
            "vLLM runs in fp8"
        )
    if model.checkpoint_dtype == "mxfp4" and dtype != "bf16":
        raise TunerError(
            f"`dtype` {dtype}: {model.name}'s checkpoint keeps all but its MXFP4 experts in "
            "bf16, as vLLM runs them"
        )
    if expert_parallel and not model.moe:
        raise TunerError(f"`expert_parallel`: {model.name} has no experts")
    heads, kv_heads, hd, mlp, vocab, vocab_shard = shard(model, tp)

    gemms = {
        "qkv": _gemm(tables, dtype, "qkv", (heads + 2 * kv_heads) * hd, model.hidden, notes),
        "o": _gemm(tables, dtype, "o", model.hidden, heads * hd, notes),
    }
    experts = experts_dtype = None
    if model.moe:
        experts_dtype = expert_dtype(model, dtype)
        moe_tp, moe_ep = expert_layout(model, tp, expert_parallel)
        experts, read = experts_curve(tables, model, experts_dtype, moe_tp, moe_ep)
        notes.interpolated.append(read)
        gemms["router"] = _gemm(tables, "bf16", "router", model.experts, model.hidden, notes)
        if model.shared_intermediate:
            width = model.shared_intermediate // tp
            gemms["shared_gate_up"] = _gemm(
                tables, dtype, "shared_gate_up", 2 * width, model.hidden, notes
            )
            gemms["shared_down"] = _gemm(tables, dtype, "shared_down", model.hidden, width, notes)
    else:
        gemms["gate_up"] = _gemm(tables, dtype, "gate_up", 2 * mlp, model.hidden, notes)
        gemms["down"] = _gemm(tables, dtype, "down", model.hidden, mlp, notes)
    lm_head = _gemm(tables, "bf16", "lm_head", vocab_shard, model.hidden, notes)
    m_axis = tables[f"gemm.{dtype}.m"]
    if tables[f"gemm.{dtype}.m"].tolist() != tables["gemm.bf16.m"].tolist():
        raise TunerError(f"{gpu}: the bf16 and {dtype} GEMM tables measure different token counts")
    notes.extrapolated.append(
        f"steps beyond {_n(m_axis[-1])} tokens (or requests): token-dependent kernel time "
        "in proportion"
    )
    context = _context_curve(tables, kv, heads, kv_heads, hd, notes)
    decode = _decode_grid(tables, kv, heads, kv_heads, hd, notes)
    if model.window_layers:
        context, decode = with_windows(model, context, decode, notes)
    allreduce = _comm_curve(tables, "allreduce", tp) if tp > 1 else None
    gather = _comm_curve(tables, "allgather", tp) if tp > 1 else None

    memory_ops = memory_bound_ops(model, heads, kv_heads, hd, mlp, vocab)
    bandwidth = system["mem_bw"] * system["mem_bw_empirical_scaling_factor"]

    pool = kv_pool(
        model, tables, gpu, tp, dtype, kv, gpu_memory_utilization, max_model_len, expert_parallel
    )
    provenance = _provenance(model, tables, gpu, tp, dtype, kv, pool, notes, experts_dtype)
    label = name or f"{_short_name(model.name)}-{gpu}-tp{tp}" + (
        "-ep" if expert_parallel else ""
    ) + f"-{dtype}" + ("-kv-fp8" if kv == "fp8" else "")
    return KernelProfile(
        name=label,
        description=(
            f"{model.name}, {dtype}"
            + (
                f" with {experts_dtype} experts{' spread over the GPUs' if expert_parallel else ''}"
                if experts_dtype
                else ""
            )
            + f", on {tp} × {gpu}: sum of measured vLLM kernel times "
            f"(AIConfigurator vLLM {provenance.vllm_version} tables)"
        ),
        model=model.name,
        gpu=gpu,
        tp=tp,
        dtype=dtype,
        checkpoint_dtype=model.checkpoint_dtype,
        expert_dtype=experts_dtype,
        expert_parallel=expert_parallel,
        experts=experts,
        kv_cache_dtype="fp8" if kv == "fp8" else "bf16",
        layers=model.layers,
        hidden=model.hidden,
        logits_per_request=vocab,
        gemm_tokens=tuple(int(m) for m in m_axis),
        gemms=gemms,
        lm_head=lm_head,
        context_attention=context,
        decode_attention=decode,
        allreduce=allreduce,
        allreduces_per_step=(2 * model.layers + 1) if tp > 1 else 0,
        logits_gather=gather,
        memory_ops=tuple(memory_ops),
        memory_bandwidth_gbps=bandwidth / 1e9,
        memory_op_us=system["mem_empirical_constant_latency"] * 1e6,
        kv_bytes_per_token=float(pool.kv_bytes),
        memory=pool.plan,
        engine_defaults={
            "max_num_batched_tokens": pool.batched,
            "max_num_seqs": pool.seqs,
            "block_size": BLOCK_SIZE,
            "max_model_len": pool.context_length,
            "num_gpu_blocks": pool.blocks,
            "async_scheduling": True,
        },
        provenance=provenance,
    )


def _checked_request(
    tables: GpuTables,
    gpu: str,
    tp: int,
    dtype: str,
    kv_cache_dtype: str | None,
    gpu_memory_utilization: float,
) -> str:
    """The KV cache's dtype the tables time (``bf16`` or ``fp8``), once ``tp``, ``dtype``,
    ``kv_cache_dtype`` and ``gpu_memory_utilization`` are known to be ones the tables cover;
    a one-line :class:`TunerError` naming the field otherwise."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise TunerError(f"`tp` {tp!r}: a tensor-parallel size is a whole number from 1")
    reduce_gpus = [int(g) for g in tables["allreduce.gpus"]]
    if tp > 1 and tp not in reduce_gpus:
        if tp > max(reduce_gpus):
            raise TunerError(
                f"`tp` {tp}: the {gpu} tables measure all-reduce up to {max(reduce_gpus)} GPUs"
            )
        raise TunerError(
            f"`tp` {tp}: the {gpu} tables measure all-reduce at "
            f"{', '.join(map(str, reduce_gpus))} GPUs"
        )
    if dtype not in ("bf16", "fp8"):
        raise TunerError(f"`dtype` {dtype!r}: bf16 or fp8")
    if not tables.has(f"gemm.{dtype}"):
        why = (
            " (A100 has no fp8 tensor cores: vLLM runs fp8 checkpoints there with weight-only "
            "Marlin kernels, which the tables do not measure)"
            if gpu.startswith("a100")
            else ""
        )
        raise TunerError(f"`dtype` {dtype}: the {gpu} tables have no {dtype} GEMMs{why}")
    if kv_cache_dtype not in _KV_DTYPES:
        raise TunerError(f"`kv_cache_dtype` {kv_cache_dtype!r}: auto, bf16 or fp8")
    kv = _KV_DTYPES[kv_cache_dtype]
    if not tables.has(f"gen.{kv}"):
        raise TunerError(f"`kv_cache_dtype` {kv}: the {gpu} attention tables have no {kv} KV cache")
    if not 0 < gpu_memory_utilization <= 1:
        raise TunerError(f"`gpu_memory_utilization` {gpu_memory_utilization}: in (0, 1]")

    return kv


def _provenance(
    model: ModelShape,
    tables: GpuTables,
    gpu: str,
    tp: int,
    dtype: str,
    kv: str,
    pool: KvPool,
    notes: _Notes,
    experts_dtype: str | None = None,
) -> Provenance:
    """Where every number of the profile comes from: the tables, their kernels and versions,
    and what is estimated."""
    system = tables.system
    plan = pool.plan
    capacity, gpu_memory_utilization = plan.capacity_bytes, plan.gpu_memory_utilization
    weight_bytes, reserve = plan.weight_bytes, plan.activation_reserve_bytes
    source = index()["source"]
    sources = tables.sources
    gemm_kernel = sources["gemm"]["kernels"][dtype]["kernel_source"]
    attention = sources["attention"]["kernels"][kv]
    kernels = {
        "gemm": gemm_kernel,
        "lm_head": sources["gemm"]["kernels"]["bf16"]["kernel_source"],
        "context attention": attention["context"],
        "decode attention": attention["generation"],
    }
    table_versions = {
        "gemm": sources["gemm"]["described"],
        "attention": sources["attention"]["described"],
    }
    if experts_dtype is not None:
        moe = sources["moe"]
        kernels["experts"] = " or ".join(moe["kernels"][experts_dtype]["kernel_sources"])
        table_versions["experts"] = moe["described"] + " (" + moe["source"] + ")"
    if tp > 1:
        kernels["all-reduce"] = sources["allreduce"]["kernel_source"]
        kernels["logits gather"] = "NCCL all_gather"
        table_versions["all-reduce"] = sources["allreduce"]["described"]
        table_versions["logits gather"] = f"NCCL {sources['allgather']['nccl_version']}"
    device = ", ".join(system["device"])
    estimated = (
        "memory-bound kernels (embedding, norms, rotary embedding, SiLU·mul): bytes moved at "
        f"{system['mem_bw_empirical_scaling_factor']:.0%} of {system['mem_bw'] / 1e9:,.0f} GB/s "
        "plus 3 µs a launch (AIConfigurator's rule)",
        f"sampling: {SAMPLER_PASSES} passes over each request's fp32 logits at that bandwidth",
        "outside kernels: 0.5 ms + 5 µs a request on the device, 1.0 ms + 5 µs a request on "
        "the host (tune calibrate can refit them)",
        f"KV pool: {gib(capacity)} × {gpu_memory_utilization} − {gib(weight_bytes)} weights "
        f"− {gib(reserve)} activations, CUDA graphs and non-torch memory (estimated)",
    )
    return Provenance(
        kind="measured-kernels",
        method="sum of measured vLLM kernel times per step (AIConfigurator's vLLM tables)",
        vllm_version=sources["gemm"]["vllm_version"],
        model=model.name,
        hardware=f"{tp} × {device}",
        source=f"{source['repository']} ({source['directory']}, {source['license']})",
        source_commit=source["commit"],
        gpu=gpu,
        tables=table_versions,
        kernel_sources=kernels,
        interpolated=tuple(notes.interpolated),
        extrapolated=tuple(notes.extrapolated),
        estimated=estimated,
    )
