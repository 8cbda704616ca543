"""How good are the measured-kernel step-time profiles (issue 28, item 6)?

    .venv/bin/python benchmarks/kernel_profiles.py [--vidur DIR] [--only SECTION ...] [--smoke]

Deterministic, no network, NumPy only (the shipped tables, read by ``tables.py``); prints
markdown tables, four sections:

``loo``
    Each table's own measured points predicted, leave-one-out, by the rule the builder reads
    between measured points (``tuner/engines/sim/kernels/build.py``): a GEMM site's whole N
    (or K) grid line removed and its points predicted from the neighbouring lines
    (utilisation bilinear in log₂ N and log₂ K, by the builder's own ``_gemm``); an attention
    table's row of one query-head count removed and predicted linearly in heads from its
    neighbours (``_context_curve``, ``_decode_grid``); a decode KV length or batch column, a
    context length and an all-reduce message size removed and predicted from their
    neighbours as the profile reads them. Error: ``|predicted / measured − 1|``.
``roofline``
    The H100 Llama-3.1-8B bf16 TP1 ``kernels`` profile against the datasheet roofline estimate
    it replaces (reproduced here from its constants: it is leaving the package), on a grid of
    step compositions.
``tp``
    Llama-3.1-70B and Qwen3-32B at TP 1/2/4/8 on each GPU and dtype: a 2,048-token chunk, 64
    decodes at 4k, the KV pool; refusals with their one-line reason.
``vidur``
    Agreement with a second, independent set of measured timings: Vidur's published
    per-operator profiles (github.com/microsoft/vidur, ``data/profiling/compute/<gpu>/<model>/
    mlp.csv`` and ``attention.csv``), given as ``--vidur DIR`` (that ``compute`` folder, or a
    copy of it: the benchmark never fetches anything). Our curves are built for Vidur's model
    shapes (its own model configs, below), so the comparison is like for like.

Some of the builder's functions used here are private (``_gemm``, ``_context_curve``,
``_decode_grid``, ``_comm_curve``, ``_Notes``, and the profile's ``_get``): they are called
anyway, so that what is measured is the builder's own rule, not a copy of it.

``--smoke``: ``loo`` on the H100's tables only (the other sections whole); without
``--vidur``, ``vidur`` reads a made-up stand-in for Vidur's folder written to a temporary
folder (Llama-3-8B on the H100 at TP 1, three token counts, a prefill and a decode attention
row, every time 0.1 ms: its ratios mean nothing, the code that reads a real folder runs). The
suite runs that, so the script does not rot.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from prefill_tuner.engines.sim.kernels import (
    KernelProfile,
    ModelShape,
    build_kernel_profile,
    known_gpus,
    load_model_shape,
)

# Private: the builder's own readings of the tables (see the module docs).
from prefill_tuner.engines.sim.kernels.build import (
    _comm_curve,
    _context_curve,
    _decode_grid,
    _gemm,
    _Notes,
)
from prefill_tuner.engines.sim.kernels.models import shape_from_config
from prefill_tuner.engines.sim.kernels.tables import GpuTables, gpu_tables, index
from prefill_tuner.engines.sim.profile_base import StepShape, shape_of
from prefill_tuner.errors import TunerError

SECTIONS = ("loo", "roofline", "tp", "vidur")


# --- small helpers ------------------------------------------------------------------------


def pct(value: float) -> str:
    return f"{100.0 * value:.1f}%"


def ms(seconds: float) -> str:
    return f"{1000.0 * seconds:.2f}"


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A markdown table; ``align`` one letter per column (``l`` or ``r``, default ``r`` after
    the first)."""
    rows = [[str(cell) for cell in row] for row in rows]
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    """Median, 90th percentile, max of ``|values|``; median of the signed values."""
    signed = np.asarray(values, dtype=np.float64)
    absolute = np.abs(signed)
    return (
        float(np.median(absolute)),
        float(np.percentile(absolute, 90)),
        float(absolute.max()),
        float(np.median(signed)),
    )


def ratio_summary(values: Sequence[float]) -> str:
    """``median (min–max)`` of ratios."""
    v = np.asarray(values, dtype=np.float64)
    return f"{np.median(v):.2f} ({v.min():.2f}–{v.max():.2f})"


def with_arrays(tables: GpuTables, **changes: np.ndarray) -> GpuTables:
    """``tables`` with some arrays replaced (names with ``.`` given with ``__``)."""
    arrays = dict(tables.arrays)
    arrays.update({name.replace("__", "."): value for name, value in changes.items()})
    return dataclasses.replace(tables, arrays=arrays)


def drop(array: np.ndarray, index: int, axis: int = 0) -> np.ndarray:
    return np.delete(array, index, axis=axis)


# --- 1. leave-one-out ---------------------------------------------------------------------


@dataclasses.dataclass
class Family:
    """The leave-one-out errors of one operator family, per GPU."""

    name: str
    errors: dict[str, list[float]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    worst: tuple[float, str] = (0.0, "")
    unpredicted: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    """What the builder's reading raised where it could not predict (other than a refusal)."""

    def fail(self, gpu: str, points: int, where: str, exc: Exception) -> None:
        self.unpredicted += points
        if not isinstance(exc, TunerError):
            self.failures.append(f"{gpu} {where}: {type(exc).__name__}")

    def add(
        self,
        gpu: str,
        predicted: np.ndarray,
        measured: np.ndarray,
        where: str | Callable[[int], str],
    ) -> None:
        """Errors of ``predicted`` against ``measured``; ``where`` says which point (given
        the index of the worst one, when a callable)."""
        errors = predicted / measured - 1.0
        self.errors[gpu].extend(errors.tolist())
        i = int(np.argmax(np.abs(errors)))
        if abs(errors[i]) > abs(self.worst[0]):
            said = where(i) if callable(where) else where
            self.worst = (float(errors[i]), f"{gpu} {said}")


MODEL_SIZED = 1024
"""GEMM sites with N and K at least this are also reported apart: a dense model's layers
(hidden sizes, MLP widths at any TP) are all there; the smaller sites are microsecond
kernels no layer of a 7B+ model runs."""


def loo_gemm(
    tables: GpuTables, dtype: str, by_n: Family, by_k: Family, big_n: Family, big_k: Family
) -> None:
    """Each interior N (or K) grid line removed; each of its measured sites predicted by the
    builder's ``_gemm`` from the lines either side (log₂-bilinear utilisation)."""
    m_axis = tables[f"gemm.{dtype}.m"]
    n_axis, k_axis = tables[f"gemm.{dtype}.n"], tables[f"gemm.{dtype}.k"]
    grid = tables[f"gemm.{dtype}.ms"]  # [n, k, m]
    for family, big, axis, name in ((by_n, big_n, 0, "n"), (by_k, big_k, 1, "k")):
        line_axis = n_axis if axis == 0 else k_axis
        for i in range(1, line_axis.size - 1):
            loo = with_arrays(
                tables,
                **{
                    f"gemm__{dtype}__{name}": drop(line_axis, i),
                    f"gemm__{dtype}__ms": drop(grid, i, axis),
                },
            )
            other = k_axis if axis == 0 else n_axis
            for j in range(other.size):
                n, k = (line_axis[i], other[j]) if axis == 0 else (other[j], line_axis[i])
                measured = grid[i, j] if axis == 0 else grid[j, i]
                mask = ~np.isnan(measured)
                if not mask.any():
                    continue
                try:
                    curve = _gemm(loo, dtype, "loo", int(n), int(k), _Notes())
                except TunerError as exc:
                    family.fail(tables.gpu, int(mask.sum()), f"N {int(n):,} K {int(k):,}", exc)
                    continue
                tokens = m_axis[mask]
                for into in (family, big) if min(n, k) >= MODEL_SIZED else (family,):
                    into.add(
                        tables.gpu,
                        np.asarray(curve.ms)[mask],
                        measured[mask],
                        lambda i, n=n, k=k, tokens=tokens: (
                            f"{dtype} N {int(n):,} K {int(k):,} M {int(tokens[i]):,}"
                        ),
                    )


def _interior_heads(keys: np.ndarray) -> list[int]:
    """Rows whose query-head count has measured rows below and above it with the same KV
    heads and head_dim (what the builder interpolates between)."""
    rows = []
    for r, (heads, kv_heads, head_dim) in enumerate(keys.tolist()):
        same = keys[(keys[:, 1] == kv_heads) & (keys[:, 2] == head_dim)][:, 0]
        if (same < heads).any() and (same > heads).any():
            rows.append(r)
    return rows


def loo_attention(tables: GpuTables, families: dict[str, Family]) -> None:
    for kv in ("bf16", "fp8"):
        if not tables.has(f"ctx.{kv}"):
            continue
        # Context attention, in query heads: the builder's _context_curve without the row.
        prefix = f"ctx.{kv}"
        keys, grid = tables[f"{prefix}.keys"], tables[f"{prefix}.ms"]
        tokens = tables[f"{prefix}.tokens"]
        for r in _interior_heads(keys):
            loo = with_arrays(
                tables,
                **{f"ctx__{kv}__keys": drop(keys, r), f"ctx__{kv}__ms": drop(grid, r)},
            )
            heads, kv_heads, hd = (int(v) for v in keys[r])
            curve = _context_curve(loo, kv, heads, kv_heads, hd, _Notes())
            mask = ~np.isnan(grid[r])
            families["ctx_heads"].add(
                tables.gpu,
                np.asarray(curve.ms)[mask],
                grid[r][mask],
                f"{kv} KV, {heads} heads ({kv_heads} KV, d {hd})",
            )
        # Context attention, in sequence length: √time linear between the neighbouring
        # measured lengths (the profile's reading, KernelProfile._Derived.context).
        for r in range(keys.shape[0]):
            row = grid[r]
            measured = np.flatnonzero(~np.isnan(row))
            for a, b, c in zip(measured, measured[1:], measured[2:], strict=False):
                root = np.interp(
                    tokens[b], [tokens[a], tokens[c]], [math.sqrt(row[a]), math.sqrt(row[c])]
                )
                families["ctx_length"].add(
                    tables.gpu,
                    np.array([root * root]),
                    np.array([row[b]]),
                    f"{kv} KV, key {tuple(int(v) for v in keys[r])}, {int(tokens[b]):,} tokens",
                )

        # Decode attention, in query heads: the builder's _decode_grid without the row.
        prefix = f"gen.{kv}"
        keys, grid = tables[f"{prefix}.keys"], tables[f"{prefix}.ms"]
        batch, lengths = tables[f"{prefix}.batch"], tables[f"{prefix}.kv"]
        for r in _interior_heads(keys):
            loo = with_arrays(
                tables,
                **{f"gen__{kv}__keys": drop(keys, r), f"gen__{kv}__ms": drop(grid, r)},
            )
            heads, kv_heads, hd = (int(v) for v in keys[r])
            mask = ~np.isnan(grid[r])
            try:
                predicted = np.asarray(_decode_grid(loo, kv, heads, kv_heads, hd, _Notes()).ms)
            except (TunerError, ValueError) as exc:
                # ValueError: pydantic's, from the builder's DecodeGrid where a neighbour row
                # has no measurement at the smallest batches (l40s, fp8 KV): not a refusal.
                families["gen_heads"].fail(
                    tables.gpu, int(mask.sum()), f"{kv} KV, {heads} heads ({kv_heads} KV)", exc
                )
                continue
            families["gen_heads"].add(
                tables.gpu,
                predicted[mask],
                grid[r][mask],
                f"{kv} KV, {heads} heads ({kv_heads} KV, d {hd})",
            )
        # Decode attention, in KV length and in batch: a column (row) removed and the cell
        # read linearly between its measured neighbours, as the grid is read (the builder's
        # _decode_grid, then linear between grid points).
        for r in range(keys.shape[0]):
            heads, kv_heads, hd = (int(v) for v in keys[r])
            for j in range(1, lengths.size - 1):
                cells = [
                    i for i in range(batch.size) if not np.isnan(grid[r, i, j - 1 : j + 2]).any()
                ]
                if not cells:
                    continue
                loo = with_arrays(
                    tables,
                    **{f"gen__{kv}__kv": drop(lengths, j), f"gen__{kv}__ms": drop(grid, j, 2)},
                )
                try:
                    read = _decode_grid(loo, kv, heads, kv_heads, hd, _Notes())
                except (TunerError, ValueError) as exc:
                    families["gen_kv"].fail(
                        tables.gpu, len(cells), f"{kv} KV, key {(heads, kv_heads, hd)}", exc
                    )
                    continue
                kept = np.asarray(read.kv_tokens, dtype=np.float64)
                predicted = np.array(
                    [np.interp(lengths[j], kept, read.ms[i]) for i in cells], dtype=np.float64
                )
                families["gen_kv"].add(
                    tables.gpu,
                    predicted,
                    grid[r, cells, j],
                    f"{kv} KV, {heads} heads, {int(lengths[j]):,} KV tokens",
                )
            for i in range(1, batch.size - 1):
                cols = [
                    j for j in range(lengths.size) if not np.isnan(grid[r, i - 1 : i + 2, j]).any()
                ]
                if not cols:
                    continue
                loo = with_arrays(
                    tables,
                    **{f"gen__{kv}__batch": drop(batch, i), f"gen__{kv}__ms": drop(grid, i, 1)},
                )
                try:
                    read = _decode_grid(loo, kv, heads, kv_heads, hd, _Notes())
                except (TunerError, ValueError) as exc:
                    families["gen_batch"].fail(
                        tables.gpu, len(cols), f"{kv} KV, key {(heads, kv_heads, hd)}", exc
                    )
                    continue
                kept = np.asarray(read.batch, dtype=np.float64)
                values = np.asarray(read.ms)
                predicted = np.array(
                    [np.interp(batch[i], kept, values[:, j]) for j in cols], dtype=np.float64
                )
                families["gen_batch"].add(
                    tables.gpu,
                    predicted,
                    grid[r, i, cols],
                    f"{kv} KV, {heads} heads, batch {int(batch[i])}",
                )


def loo_allreduce(tables: GpuTables, family: Family) -> None:
    """Each interior measured message size predicted linearly between its neighbours (the
    profile reads the all-reduce curve linearly in message size)."""
    for tp in (int(g) for g in tables["allreduce.gpus"]):
        curve = _comm_curve(tables, "allreduce", tp)
        x, y = np.asarray(curve.x), np.asarray(curve.ms)
        for i in range(1, x.size - 1):
            predicted = np.interp(x[i], drop(x, i), drop(y, i))
            family.add(
                tables.gpu,
                np.array([predicted]),
                np.array([y[i]]),
                f"{tp} GPUs, {int(x[i]):,} values",
            )


FAMILIES = {
    "gemm_bf16_n": "GEMM bf16, an N line removed",
    "gemm_bf16_k": "GEMM bf16, a K line removed",
    "gemm_fp8_n": "GEMM fp8, an N line removed",
    "gemm_fp8_k": "GEMM fp8, a K line removed",
    "gemm_bf16_n_big": "… bf16, N line, N and K ≥ 1,024",
    "gemm_bf16_k_big": "… bf16, K line, N and K ≥ 1,024",
    "gemm_fp8_n_big": "… fp8, N line, N and K ≥ 1,024",
    "gemm_fp8_k_big": "… fp8, K line, N and K ≥ 1,024",
    "ctx_heads": "context attention, in query heads",
    "gen_heads": "decode attention, in query heads",
    "gen_kv": "decode attention, in KV length",
    "allreduce": "all-reduce, in message size",
    "ctx_length": "context attention, in length (√time)",
    "gen_batch": "decode attention, in batch",
}


def raw_token_seconds(profile: KernelProfile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The profile's token-dependent time (seconds, all layers) at its own token counts,
    before and after the running maximum that makes more tokens never faster: the sum
    ``KernelProfile._Derived.of`` makes (GEMMs, all-reduces, memory-bound kernels), repeated
    here and checked equal to the profile's after the maximum."""
    derived = profile._get()  # private: the profile's derived curves
    x = np.asarray(derived.token_x, dtype=np.float64)
    gemms = sum(
        (np.interp(x, profile.gemm_tokens, g.ms) for g in profile.gemms.values()),
        np.zeros_like(x),
    )
    raw = profile.layers * gemms
    if profile.allreduce is not None:
        reduce = np.interp(x * profile.hidden, profile.allreduce.x, profile.allreduce.ms)
        raw = raw + profile.allreduces_per_step * reduce
    ops = [op for op in profile.memory_ops if op.per == "token"]
    fixed = sum(op.launches for op in ops) * profile.memory_op_us / 1e6
    per_token = sum(op.bytes_per_unit for op in ops) / (profile.memory_bandwidth_gbps * 1e9)
    seconds = raw / 1000.0 + fixed + per_token * x
    charged = np.asarray(derived.token_y, dtype=np.float64)
    assert np.allclose(np.maximum.accumulate(seconds), charged, rtol=1e-9, atol=0.0)
    return x, seconds, charged


LIFT_MODELS = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B-Instruct",
    "Qwen/Qwen3-32B",
)
LIFT_TOKENS = (256, 512, 1024, 2048, 4096, 8192)


def section_lift() -> None:
    """What the running maximum (more tokens never faster) charges above the measured sum."""
    print(
        "#### The measured token counts as a profile charges them\n\n"
        "A profile charges a step's token-dependent kernels (GEMMs, all-reduces, memory-bound "
        "ops) the running maximum over token counts of their measured sum, so that more "
        "tokens are never faster. Where a table is faster at a larger token count than at a "
        "smaller one (tile-aligned counts: the tables measure 2^k and 2^k + 1; isolated "
        "spikes), the profile charges more than was measured. GEMM spikes: measured points more "
        "than twice both their token-count neighbours, in the GPU's GEMM table. Lift = "
        "charged / measured sum − 1 at the tables' own token counts; for Llama-3.1-8B at TP "
        "1, the lift of a whole step (one chunk of that many tokens, attention and overheads "
        "included).\n"
    )
    rows = []
    for gpu in known_gpus():
        for dtype in ("bf16", "fp8"):
            lifts: list[float] = []
            worst = (0.0, "")
            step_lifts: list[str] = []
            for model in LIFT_MODELS:
                shape = load_model_shape(model)
                for tp in (1, 2, 4, 8):
                    try:
                        profile = build_kernel_profile(shape, gpu, tp, dtype)  # type: ignore[arg-type]
                    except TunerError:
                        continue
                    x, measured, charged = raw_token_seconds(profile)
                    at = np.isin(x, profile.gemm_tokens)
                    lift = charged[at] / measured[at] - 1.0
                    lifts.extend(lift.tolist())
                    i = int(np.argmax(lift))
                    if lift[i] > worst[0]:
                        short = model.split("/")[-1].removesuffix("-Instruct")
                        worst = (float(lift[i]), f"{short} TP {tp}, {int(x[at][i]):,} tokens")
                    if model == LIFT_MODELS[0] and tp == 1:
                        for tokens in LIFT_TOKENS:
                            j = int(np.flatnonzero(x == tokens)[0])
                            total = profile.step_seconds(step(chunks=[(0, tokens)]))
                            extra = charged[j] - measured[j]
                            step_lifts.append(pct(extra / (total - extra)))
            if not lifts:
                continue
            share = float(np.mean(np.asarray(lifts) > 0.05))
            grid = gpu_tables(gpu)[f"gemm.{dtype}.ms"]
            middle, before, after = grid[:, :, 1:-1], grid[:, :, :-2], grid[:, :, 2:]
            spikes = int(((middle > 2 * before) & (middle > 2 * after)).sum())
            rows.append(
                [
                    gpu,
                    dtype,
                    f"{spikes:,} of {int((~np.isnan(grid)).sum()):,}",
                    *(step_lifts or ["—"] * len(LIFT_TOKENS)),
                    f"{len(lifts):,}",
                    pct(share),
                    f"{pct(worst[0])} ({worst[1]})",
                ]
            )
    print(
        table(
            [
                "GPU",
                "dtype",
                "GEMM spikes",
                *(f"8B step lift at {t:,}" for t in LIFT_TOKENS),
                "counts (3 models × TPs)",
                "lifted > 5%",
                "max lift (at)",
            ],
            rows,
            "llrrrrrrrrrl",
        )
    )
    print()


def section_loo(gpus: Sequence[str] | None = None) -> None:
    """Leave-one-out on ``gpus``' tables (default: every GPU's)."""
    families = {key: Family(name) for key, name in FAMILIES.items()}
    which = ", ".join(gpus) if gpus else "all GPUs"
    gpus = list(gpus or known_gpus())
    for gpu in gpus:
        tables = gpu_tables(gpu)
        for dtype in ("bf16", "fp8"):
            if tables.has(f"gemm.{dtype}"):
                loo_gemm(
                    tables,
                    dtype,
                    *(families[f"gemm_{dtype}_{axis}"] for axis in ("n", "k", "n_big", "k_big")),
                )
        loo_attention(tables, families)
        loo_allreduce(tables, families["allreduce"])

    print("### 1. The tables' own points, leave-one-out\n")
    print(
        "Each point predicted without its grid line (GEMMs: the whole N or K line; attention: "
        "the row of that head count, or that length / batch column; all-reduce: that message "
        "size), by the rule the profile uses between measured points. Interior lines only "
        "(an end line would be extrapolation). Error = |predicted / measured − 1|; bias = "
        "median signed error; GEMM errors over every measured token count of the site; "
        "attention over both KV dtypes.\n"
    )
    rows = []
    for family in families.values():
        pooled = [e for errors in family.errors.values() for e in errors]
        if not pooled:
            continue
        median, p90, worst, bias = spread(pooled)
        rows.append(
            [
                family.name,
                f"{len(pooled):,}",
                pct(median),
                pct(p90),
                pct(worst),
                f"{100 * bias:+.1f}%",
                f"{100 * family.worst[0]:+.0f}% at {family.worst[1]}",
            ]
        )
    print(
        table(
            [f"family ({which})", "points", "median", "p90", "max", "bias", "worst point"],
            rows,
            "lrrrrrl",
        )
    )
    for family in families.values():
        if family.unpredicted:
            print(
                f"\nNot predicted, {family.name}: {family.unpredicted} measured points "
                f"({len(family.failures)} readings raised an error other than a refusal"
                + (": " + "; ".join(sorted(set(family.failures))[:6]) if family.failures else "")
                + ")"
            )
    print("\nBy GPU: median / p90 (points)\n")
    rows = []
    for family in families.values():
        cells = []
        for gpu in gpus:
            errors = family.errors.get(gpu)
            if not errors:
                cells.append("—")
                continue
            median, p90, _, _ = spread(errors)
            cells.append(f"{pct(median)} / {pct(p90)} ({len(errors):,})")
        rows.append([family.name, *cells])
    print(table(["family", *gpus], rows))
    print()
    section_lift()


# --- 2. the kernels profile against the roofline it replaces --------------------------------

ROOFLINE = {
    "overhead_ms": 0.5,
    "per_request_us": 5.0,
    "host_ms": 1.0,
    "host_request_us": 5.0,
    "weight_bytes": 16.06e9,
    "kv_bytes_per_token": 131072.0,
    "memory_bandwidth_gbps": 2680.0,
    "flops_per_token": 16.06e9,
    "attention_flops_per_pair": 524288.0,
    "effective_tflops": 494.5,
}
"""The shipped ``llama-3.1-8b-h100`` roofline estimate (datasheet H100 SXM, Llama-3.1-8B bf16),
as it was before the ``kernels`` profile replaced it."""


def roofline_seconds(shape: StepShape, r: dict[str, float] = ROOFLINE) -> float:
    """The roofline's step time: fixed and per-request overheads plus the larger of memory
    traffic (weights once, the KV read) and arithmetic (dense FLOPs per token, attention per
    query-key pair), plus the host's share."""
    tokens = shape.prefill_tokens + shape.decode_tokens
    kv_read = shape.decode_context_tokens + shape.prefill_context_tokens
    memory = (r["weight_bytes"] + r["kv_bytes_per_token"] * kv_read) / (
        r["memory_bandwidth_gbps"] * 1e9
    )
    compute = (
        r["flops_per_token"] * tokens
        + r["attention_flops_per_pair"] * shape.prefill_attention_pairs
    ) / (r["effective_tflops"] * 1e12)
    device = r["overhead_ms"] / 1e3 + r["per_request_us"] / 1e6 * shape.requests
    host = r["host_ms"] / 1e3 + r["host_request_us"] / 1e6 * shape.requests
    return device + max(memory, compute) + host


def step(decodes: Sequence[int] = (), chunks: Sequence[tuple[int, int]] = ()) -> StepShape:
    """A step of decodes at the given contexts (tokens computed before, the new one not
    counted) and prefill chunks ``(prior context, tokens)``."""
    items = [(context, 1, True) for context in decodes]
    items += [(prior, tokens, False) for prior, tokens in chunks]
    return shape_of(items, len(items))


def roofline_grid(pool: int) -> dict[str, list[tuple[str, StepShape]]]:
    """The step compositions compared, those whose KV (each request's context and new
    tokens) fits a pool of ``pool`` tokens."""
    k = 1024
    grid: dict[str, list[tuple[str, StepShape]]] = defaultdict(list)

    def add(kind: str, label: str, shape: StepShape) -> None:
        if shape.decode_context_tokens + shape.prefill_context_tokens <= pool:
            grid[kind].append((label, shape))

    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for c in (1, 2, 4, 8, 16, 32):
            add("decode only (batch 1–256 × context 1k–32k)", f"{b} × {c}k", step([c * k] * b))
    for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384):
        add("one prefill chunk alone (64–16,384 tokens)", f"{n}", step(chunks=[(0, n)]))
    for d in (1, 8, 32, 64, 128, 256):
        for c in (2, 8):
            for n in (128, 512, 2048, 4096):
                add(
                    "decodes + one chunk (1–256 at 2k/8k + 128–4,096)",
                    f"{d} × {c}k + {n}",
                    step([c * k] * d, [(0, n)]),
                )
    for n in (256, 512, 2048):
        for prior in (1, 4, 16, 32):
            add(
                "a chunk after prior context (256–2,048 after 1k–32k)",
                f"{n} after {prior}k",
                step(chunks=[(prior * k, n)]),
            )
    return grid


def section_roofline() -> None:
    profile = build_kernel_profile(
        load_model_shape("meta-llama/Llama-3.1-8B-Instruct"), "h100_sxm", 1, "bf16"
    )
    print("### 2. Llama-3.1-8B bf16 on one H100: the kernels profile against the roofline\n")
    pool = int(profile.engine_defaults["num_gpu_blocks"]) * 16
    print(
        "Step times include the host's share (1.0 ms + 5 µs a request in both; async "
        "scheduling hides it behind the previous step). Ratio = kernels / roofline. Only "
        f"the steps whose KV fits the profile's pool ({pool:,} tokens) are compared (a batch "
        "of 256 at 8k could not be scheduled).\n"
    )
    rows = []
    for kind, steps in roofline_grid(pool).items():
        ratios = [profile.step_seconds(s) / roofline_seconds(s) for _, s in steps]
        lo, hi = int(np.argmin(ratios)), int(np.argmax(ratios))
        rows.append(
            [
                kind,
                len(steps),
                f"{np.median(ratios):.2f}",
                f"{ratios[lo]:.2f} ({steps[lo][0]})",
                f"{ratios[hi]:.2f} ({steps[hi][0]})",
            ]
        )
    print(table(["step kind", "steps", "median ratio", "min (at)", "max (at)"], rows, "lrrrr"))
    named = [
        ("one decode at 1,024 tokens of context", step([1024])),
        ("a 2,048-token prefill chunk", step(chunks=[(0, 2048)])),
        ("an 8,192-token prefill chunk", step(chunks=[(0, 8192)])),
        ("64 decodes at 2,048 plus a 512-token chunk", step([2048] * 64, [(0, 512)])),
        ("256 decodes at 1,024", step([1024] * 256)),
        ("32 decodes at 8,192", step([8192] * 32)),
        ("a 512-token chunk after 32k of context", step(chunks=[(32 * 1024, 512)])),
    ]
    print()
    rows = [
        [
            name,
            ms(profile.step_seconds(s)),
            ms(roofline_seconds(s)),
            f"{profile.step_seconds(s) / roofline_seconds(s):.2f}",
        ]
        for name, s in named
    ]
    print(table(["step", "kernels ms", "roofline ms", "ratio"], rows))
    print()


# --- 3. tensor-parallel scaling --------------------------------------------------------------

TP_MODELS = ("meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen3-32B")
TP_TARGETS = (
    ("h100_sxm", "bf16"),
    ("h100_sxm", "fp8"),
    ("h200_sxm", "bf16"),
    ("h200_sxm", "fp8"),
    ("b200_sxm", "bf16"),
    ("b200_sxm", "fp8"),
    ("a100_sxm", "bf16"),
    ("l40s", "bf16"),
    ("l40s", "fp8"),
)


def section_tp() -> None:
    print("### 3. Tensor-parallel scaling\n")
    print(
        "Step times (host share included) of a 2,048-token chunk alone and of 64 decodes at "
        "4,096 tokens of context; the KV pool in tokens (vLLM's sizing at "
        "gpu_memory_utilization 0.92, max_model_len the model's); speed-up against the "
        "smallest TP that builds. Refusals below the table, numbered.\n"
    )
    chunk = step(chunks=[(0, 2048)])
    decode = step([4096] * 64)
    rows = []
    refusals: list[str] = []
    for model in TP_MODELS:
        shape = load_model_shape(model)
        for gpu, dtype in TP_TARGETS:
            base: tuple[float, float] | None = None
            for tp in (1, 2, 4, 8):
                label = [model.split("/")[-1], gpu, dtype, tp]
                try:
                    profile = build_kernel_profile(shape, gpu, tp, dtype)  # type: ignore[arg-type]
                except TunerError as exc:
                    refusals.append(f"{model.split('/')[-1]}, {gpu}, {dtype}, TP {tp}: {exc}")
                    rows.append([*label, f"refused ({len(refusals)})", "", "", "", ""])
                    continue
                t_chunk, t_decode = profile.step_seconds(chunk), profile.step_seconds(decode)
                if base is None:
                    base = (t_chunk, t_decode)
                kv_tokens = profile.engine_defaults["num_gpu_blocks"] * 16
                rows.append(
                    [
                        *label,
                        ms(t_chunk),
                        f"{base[0] / t_chunk:.2f}×",
                        ms(t_decode),
                        f"{base[1] / t_decode:.2f}×",
                        f"{int(kv_tokens):,}",
                    ]
                )
    print(
        table(
            [
                "model",
                "GPU",
                "dtype",
                "TP",
                "2,048 chunk ms",
                "speed-up",
                "64 × 4k decode ms",
                "speed-up",
                "KV pool tokens",
            ],
            rows,
            "lllrrrrrr",
        )
    )
    print("\nRefused:\n")
    for i, why in enumerate(refusals, 1):
        print(f"{i}. {why}")
    print()


# --- 4. Vidur ----------------------------------------------------------------------------

VIDUR_GPUS = {"h100": "h100_sxm", "a100": "a100_sxm"}
"""Vidur's compute-profile folders and our GPUs (Vidur's ``a40`` has no tables here)."""

VIDUR_MODELS: dict[str, dict[str, object]] = {
    # The shapes Vidur profiled (its vidur/config/model_config.py), as config.json fields.
    "meta-llama/Llama-2-7b-hf": dict(
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        hidden_size=4096,
        intermediate_size=11008,
        max_position_embeddings=4096,
        vocab_size=32768,
    ),
    "meta-llama/Llama-2-70b-hf": dict(
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        hidden_size=8192,
        intermediate_size=28672,
        max_position_embeddings=4096,
        vocab_size=32768,
    ),
    "meta-llama/Meta-Llama-3-8B": dict(
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        hidden_size=4096,
        intermediate_size=14336,
        max_position_embeddings=4096,
        vocab_size=128256,
    ),
    "meta-llama/Meta-Llama-3-70B": dict(
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        hidden_size=8192,
        intermediate_size=28672,
        max_position_embeddings=8192,
        vocab_size=128256,
    ),
    "codellama/CodeLlama-34b-Instruct-hf": dict(
        num_hidden_layers=48,
        num_attention_heads=64,
        num_key_value_heads=8,
        hidden_size=8192,
        intermediate_size=22016,
        max_position_embeddings=16384,
        vocab_size=32768,
    ),
    "internlm/internlm-20b": dict(
        num_hidden_layers=60,
        num_attention_heads=40,
        num_key_value_heads=40,
        hidden_size=5120,
        intermediate_size=13824,
        max_position_embeddings=4096,
        vocab_size=103168,
    ),
    "Qwen/Qwen-72B": dict(
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=64,
        hidden_size=8192,
        intermediate_size=24576,
        max_position_embeddings=32768,
        vocab_size=152064,
        attention_bias=True,
    ),
    "microsoft/phi-2": dict(
        model_type="phi",
        hidden_act="gelu_new",
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        hidden_size=2560,
        intermediate_size=10240,
        max_position_embeddings=2048,
        vocab_size=51200,
    ),
}

VIDUR_GEMMS = {
    "qkv": "attn_pre_proj",
    "o": "attn_post_proj",
    "gate_up": "mlp_up_proj",
    "down": "mlp_down_proj",
}
VIDUR_MEMORY = ("input_layernorm", "post_attention_layernorm", "add", "attn_rope", "mlp_act")
"""Vidur's timed memory-bound kernels of a layer (its first residual add is not timed)."""

TOKEN_BANDS = ((1, 63, "1–63"), (64, 511, "64–511"), (512, 4096, "512–4,096"))
TOKEN_BANDS += ((4097, 1 << 30, "4,097–32,768"),)


def vidur_shape(name: str, csv_row: dict[str, str]) -> ModelShape:
    """Vidur's model as a ModelShape (its config values; refused in one line as any config);
    checked against the shape its CSV records."""
    config = {"model_type": "llama", "hidden_act": "silu", **VIDUR_MODELS[name]}
    shape = shape_from_config(config, name)
    recorded = (
        int(csv_row["n_head"]),
        int(csv_row["n_kv_head"]),
        int(csv_row["n_embd"]),
        int(csv_row["n_expanded_embd"]),
    )
    ours = (shape.heads, shape.kv_heads, shape.hidden, shape.intermediate)
    if recorded != ours:
        raise TunerError(f"{name}: the CSV records heads/KV/hidden/MLP {recorded}, not {ours}")
    return shape


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def vidur_medians(rows: list[dict[str, str]], keys: Sequence[str]) -> dict[tuple, dict]:
    """Rows grouped by ``keys`` (Vidur repeats some points), each ``time_stats.*.median``
    averaged over the repeats."""
    groups: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in keys)].append(row)
    result = {}
    for key, members in groups.items():
        columns = [c for c in members[0] if c.startswith("time_stats.") and c.endswith(".median")]
        result[key] = {
            c.removeprefix("time_stats.").removesuffix(".median"): float(
                np.mean([float(m[c]) for m in members])
            )
            for c in columns
        }
    return result


def shard_gemms(tables: GpuTables, shape: ModelShape, tp: int) -> dict[str, np.ndarray]:
    """The layer's GEMM curves (ms per call over the tables' token counts) at the TP shard,
    read by the builder's ``_gemm`` as build_kernel_profile reads them (checked against a
    built profile where one builds; computed here too where vLLM would refuse to start, as
    70B at TP 1: the kernels do not depend on the memory)."""
    heads, kv_heads = shape.heads // tp, max(1, shape.kv_heads // tp)
    hd, mlp = shape.head_dim, shape.intermediate // tp
    dims = {
        "qkv": ((heads + 2 * kv_heads) * hd, shape.hidden),
        "o": (shape.hidden, heads * hd),
        "gate_up": (2 * mlp, shape.hidden),
        "down": (shape.hidden, mlp),
    }
    return {
        name: np.asarray(_gemm(tables, "bf16", name, n, k, _Notes()).ms)
        for name, (n, k) in dims.items()
    }


def at_tokens(m_axis: np.ndarray, curve: np.ndarray, tokens: float) -> float:
    """A GEMM curve at ``tokens`` as a step reads it: linear between measured token counts,
    beyond the last in proportion (``KernelProfile``'s token curve)."""
    if tokens > m_axis[-1]:
        return float(curve[-1] * tokens / m_axis[-1])
    return float(np.interp(tokens, m_axis, curve))


def memory_per_layer(profile: KernelProfile, tokens: float) -> float:
    """The profile's estimate (ms) of one layer's memory-bound kernels at ``tokens``: each
    per-token op's per-layer launches (embedding: none), bytes over the achieved bandwidth
    plus the launch cost."""
    bandwidth = profile.memory_bandwidth_gbps * 1e9
    total = 0.0
    for op in profile.memory_ops:
        if op.per != "token" or op.launches < profile.layers:
            continue
        per_layer = op.launches // profile.layers
        bytes_per_launch = op.bytes_per_unit / op.launches
        total += per_layer * (bytes_per_launch * tokens / bandwidth + profile.memory_op_us / 1e6)
    return 1000.0 * total


def vidur_attention(path: Path, profile: KernelProfile, tp: int) -> tuple[list[float], list[float]]:
    """Ours / Vidur for Vidur's attention rows at this TP (its ``attention.csv``): prefill
    (a chunk after ``kv_cache_size`` tokens; ``batch_size`` such chunks) and decode
    (``batch_size`` requests reading ``kv_cache_size`` tokens and the new one). Vidur's
    kernel time includes its KV-cache write (``attn_kv_cache_save``), as ours does."""
    rows = [r for r in read_csv(path) if int(r["num_tensor_parallel_workers"]) == tp]
    derived = profile._get()  # private: the profile's own per-step readers (seconds, all layers)
    layers = profile.layers
    prefill, decode = [], []
    keys = ("is_prefill", "batch_size", "prefill_chunk_size", "kv_cache_size")
    for (is_prefill, b, chunk, kv), t in sorted(vidur_medians(rows, keys).items()):
        theirs = t.get("attn_prefill" if is_prefill == "True" else "attn_decode", 0.0)
        theirs += t.get("attn_kv_cache_save", 0.0)
        if theirs <= 0:
            continue
        if is_prefill == "True":
            ours = int(b) * derived.prefill([(int(kv), int(chunk))])
            prefill.append(1000.0 * ours / layers / theirs)
        else:
            ours = derived.decode(int(b), float(int(kv) + 1))
            decode.append(1000.0 * ours / layers / theirs)
    return prefill, decode


def section_vidur(root: Path | None) -> None:
    print("### 4. Against Vidur's measured per-operator profiles\n")
    if root is None:
        print("Not run: pass --vidur DIR (Vidur's data/profiling/compute folder, or a copy).\n")
        return
    if not root.is_dir():
        raise SystemExit(f"--vidur {root}: not a folder")
    rows_out = []
    pooled: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    attention_rows = []
    not_compared = []
    refused: dict[str, list[str]] = defaultdict(list)
    for gpu_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        gpu = VIDUR_GPUS.get(gpu_dir.name)
        for mlp_path in sorted(gpu_dir.glob("*/*/mlp.csv")):
            name = f"{mlp_path.parent.parent.name}/{mlp_path.parent.name}"
            where = f"{gpu_dir.name} {name}"
            if gpu is None:
                not_compared.append(f"{where}: no measured tables here for Vidur's {gpu_dir.name}")
                continue
            if name not in VIDUR_MODELS:
                not_compared.append(f"{where}: no config for this model in the benchmark")
                continue
            rows = read_csv(mlp_path)
            try:
                shape = vidur_shape(name, rows[0])
            except TunerError as exc:
                not_compared.append(f"{where}: {exc}")
                continue
            tables = gpu_tables(gpu)
            m_axis = tables["gemm.bf16.m"].astype(np.float64)
            measured = vidur_medians(rows, ("num_tensor_parallel_workers", "num_tokens"))
            for tp in sorted({int(k[0]) for k in measured}):
                points = sorted((int(k[1]), v) for k, v in measured.items() if int(k[0]) == tp)
                try:
                    curves = shard_gemms(tables, shape, tp)
                except TunerError as exc:
                    not_compared.append(f"{where} TP {tp}: {exc}")
                    continue
                try:
                    profile: KernelProfile | None = build_kernel_profile(shape, gpu, tp, "bf16")
                except TunerError as exc:
                    profile = None
                    refused[where].append(f"TP {tp}: {exc}")
                if profile is not None:  # our shard arithmetic is the builder's
                    for op, curve in curves.items():
                        assert np.array_equal(curve, np.asarray(profile.gemms[op].ms)), op
                ratios: dict[str, list[float]] = defaultdict(list)
                for tokens, theirs in points:
                    ours_sum = theirs_sum = 0.0
                    for op, column in VIDUR_GEMMS.items():
                        ours = at_tokens(m_axis, curves[op], tokens)
                        ratios[op].append(ours / theirs[column])
                        ours_sum += ours
                        theirs_sum += theirs[column]
                        band = next(b[2] for b in TOKEN_BANDS if b[0] <= tokens <= b[1])
                        pooled[(gpu, op, band)].append(ours / theirs[column])
                    ratios["sum"].append(ours_sum / theirs_sum)
                    pooled[(gpu, "sum", band)].append(ours_sum / theirs_sum)
                    if profile is not None:
                        theirs_memory = sum(theirs[c] for c in VIDUR_MEMORY)
                        ratio = memory_per_layer(profile, tokens) / theirs_memory
                        ratios["memory"].append(ratio)
                        pooled[(gpu, "memory", band)].append(ratio)
                rows_out.append(
                    [
                        gpu_dir.name,
                        name.split("/")[-1],
                        tp,
                        f"{points[0][0]:,}–{points[-1][0]:,} ({len(points)})",
                        *(ratio_summary(ratios[op]) for op in (*VIDUR_GEMMS, "sum")),
                        ratio_summary(ratios["memory"]) if ratios["memory"] else "— (refused)",
                    ]
                )
                attention_path = mlp_path.parent / "attention.csv"
                if attention_path.is_file() and profile is not None:
                    prefill, decode = vidur_attention(attention_path, profile, tp)
                    attention_rows.append(
                        [
                            gpu_dir.name,
                            name.split("/")[-1],
                            tp,
                            ratio_summary(prefill) if prefill else "—",
                            ratio_summary(decode) if decode else "—",
                        ]
                    )
                elif not attention_path.is_file() and tp == 1:
                    not_compared.append(f"{where}: attention.csv not in the folder")
    print(
        "Ours / Vidur, per layer, at every token count Vidur measured (Vidur's `time_stats.*."
        "median`, averaged where a point repeats): median (min–max). GEMMs: ours read from the "
        "bf16 tables at the TP shard of Vidur's model shape (Vidur: fp16, eager, kernel time "
        "by record_function); sum = qkv + o + gate_up + down; memory = our estimate of the "
        "layer's memory-bound kernels (2 × residual add + RMSNorm, rotary, SiLU·mul: bytes "
        "over 80% of the datasheet bandwidth + 3 µs a launch) against Vidur's measured two "
        "RMSNorms, one add, rotary and SiLU·mul (where our profile builds).\n"
    )
    header = ["GPU", "model", "TP", "tokens (points)", "qkv", "o", "gate_up", "down", "sum"]
    print(table([*header, "memory-bound"], rows_out, "llrrrrrrrr"))
    print("\nPooled over models and TP, by token count: median (min–max)\n")
    gpus = sorted({k[0] for k in pooled})
    ops = (*VIDUR_GEMMS, "sum", "memory")
    rows = []
    for gpu in gpus:
        for band in (b[2] for b in TOKEN_BANDS):
            if not any((gpu, op, band) in pooled for op in ops):
                continue
            cells = [
                ratio_summary(pooled[(gpu, op, band)]) if (gpu, op, band) in pooled else "—"
                for op in ops
            ]
            rows.append([gpu, band, *cells])
    print(table(["GPU", "tokens", *ops[:-1], "memory-bound"], rows, "llrrrrrr"))
    if attention_rows:
        print("\nAttention (ours / Vidur, KV-cache write included in both): median (min–max)\n")
        print(table(["GPU", "model", "TP", "prefill", "decode"], attention_rows, "llrrr"))
    if not_compared:
        print("\nNot compared:\n")
        for line in not_compared:
            print(f"- {line}")
    if refused:
        print(
            "\nOur profile refused (so its memory-bound estimate and attention are not "
            "compared there; the GEMMs are):\n"
        )
        for where, lines in refused.items():
            print(f"- {where}: " + "; ".join(lines))
    print()


SMOKE_GPUS = ("h100_sxm",)
"""``--smoke``'s leave-one-out tables (bf16 and fp8 GEMMs, both KV dtypes, all-reduce)."""

SMOKE_VIDUR_TOKENS = (1, 512, 4096)


def write_smoke_vidur(root: Path) -> Path:
    """A made-up stand-in for Vidur's ``compute`` folder, in its layout and columns: one model
    on the H100 at TP 1, every timing 0.1 ms (``--smoke`` without ``--vidur``)."""
    name = "meta-llama/Meta-Llama-3-8B"
    model = VIDUR_MODELS[name]
    folder = root / "h100" / name
    folder.mkdir(parents=True)
    shape = {
        "n_head": model["num_attention_heads"],
        "n_kv_head": model["num_key_value_heads"],
        "n_embd": model["hidden_size"],
        "n_expanded_embd": model["intermediate_size"],
        "num_tensor_parallel_workers": 1,
    }
    ops = [*VIDUR_GEMMS.values(), *VIDUR_MEMORY]
    mlp = [
        {**shape, "num_tokens": tokens, **{f"time_stats.{op}.median": 0.1 for op in ops}}
        for tokens in SMOKE_VIDUR_TOKENS
    ]
    attention = [
        {
            "num_tensor_parallel_workers": 1,
            "is_prefill": is_prefill,
            "batch_size": batch,
            "prefill_chunk_size": chunk,
            "kv_cache_size": kv,
            "time_stats.attn_prefill.median": 0.1 if is_prefill else 0.0,
            "time_stats.attn_decode.median": 0.0 if is_prefill else 0.1,
            "time_stats.attn_kv_cache_save.median": 0.1,
        }
        for is_prefill, batch, chunk, kv in ((True, 1, 512, 1024), (False, 8, 0, 2048))
    ]
    for file, rows in (("mlp.csv", mlp), ("attention.csv", attention)):
        with (folder / file).open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return root


def smoke_vidur() -> None:
    """``vidur`` on the made-up stand-in (``--smoke`` without ``--vidur``)."""
    with tempfile.TemporaryDirectory(prefix="vidur-smoke-") as folder:
        print("(--smoke: a made-up stand-in for Vidur's folder; its ratios mean nothing)\n")
        section_vidur(write_smoke_vidur(Path(folder)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vidur",
        type=Path,
        help="Vidur's data/profiling/compute folder (or a copy): <gpu>/<org>/<model>/mlp.csv",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only this section (repeatable; default: all)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="leave-one-out on the H100 only; without --vidur, Vidur's folder made up",
    )
    args = parser.parse_args(argv)
    only = set(args.only or SECTIONS)
    source = index()["source"]
    print(
        f"Tables: {source['repository']}@{source['commit'][:12]} (shipped in "
        "tuner/engines/sim/kernels/data)\n"
    )
    runners: dict[str, Callable[[], None]] = {
        "loo": lambda: section_loo(SMOKE_GPUS if args.smoke else None),
        "roofline": section_roofline,
        "tp": section_tp,
        "vidur": smoke_vidur
        if args.smoke and args.vidur is None
        else lambda: section_vidur(args.vidur),
    }
    for name in SECTIONS:
        if name in only:
            runners[name]()


if __name__ == "__main__":
    main()
