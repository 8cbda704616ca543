"""A mixture-of-experts layer's fused experts, read from the measured tables.

vLLM runs a layer's routed experts as one fused kernel (``FusedMoE``): every token of the step
goes to its top-k experts, each a gated SiLU MLP. AIConfigurator's tables time that kernel
(``moe.<dtype>`` in the shipped tables: ``scripts/build-kernel-tables``) per shape — hidden
size, expert width, top-k, experts — at each expert-parallel layout: ``--tensor-parallel-size
N`` alone splits every expert's width over the N GPUs (``moe_tp`` N, ``moe_ep`` 1);
``--enable-expert-parallel`` gives each GPU N-th of the experts whole (``moe_tp`` 1, ``moe_ep``
N). Routing is taken as balanced, as the tables measure it: tokens spread uniformly over the
experts. So a decode step of a few tokens reads only the experts they are routed to, and a
large step reads them all, as the measured curve shows. Between measured token counts the time
is linear in tokens; beyond the last, in proportion.

With one data-parallel rank (what the profiles model), expert parallelism moves no tokens
between GPUs: every GPU holds the step's tokens after attention's all-reduce, runs those
routed to its own experts, and the layer's output is all-reduced as under tensor parallelism.
Data-parallel attention (the all-to-all ``moe_a2a`` tables) is not modelled.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from prefill_tuner.engines.sim.kernels.models import ModelShape
from prefill_tuner.engines.sim.kernels.profile import Curve
from prefill_tuner.engines.sim.kernels.tables import GpuTables
from prefill_tuner.errors import TunerError

ExpertDtype = Literal["bf16", "fp8", "fp8_block", "mxfp4"]

_READ_FROM: dict[str, tuple[str, ...]] = {
    "bf16": ("bf16",),
    # vLLM runs fp8 experts quantized at load (--quantization fp8) with its Triton fused MoE
    # on Hopper and Ada, the kernel the block-scaled tables time there; the per-tensor tables
    # measure ModelOpt checkpoints' FlashInfer CUTLASS kernel, 3-6 times slower on Hopper at
    # decode sizes. So the block-scaled tables first, the per-tensor ones where they lack a
    # shape.
    "fp8": ("fp8_block", "fp8"),
    "fp8_block": ("fp8_block",),
    "mxfp4": ("mxfp4",),
}

BYTES_PER_WEIGHT = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "mxfp4": 17 / 32}
"""An expert weight's bytes: MXFP4 is 4 bits and a shared 8-bit scale per 32."""


def expert_dtype(model: ModelShape, dtype: str) -> ExpertDtype:
    """The experts' weights: the checkpoint's block-scaled fp8 or MXFP4 as it is, otherwise
    ``dtype`` (fp8: quantized per tensor when loaded)."""
    if model.checkpoint_dtype in ("fp8_block", "mxfp4"):
        return model.checkpoint_dtype
    return "fp8" if dtype == "fp8" else "bf16"


def expert_layout(model: ModelShape, tp: int, expert_parallel: bool) -> tuple[int, int]:
    """``(moe_tp, moe_ep)``: how the experts are split over ``tp`` GPUs; a one-line
    :class:`TunerError` where vLLM would refuse the split."""
    if expert_parallel:
        if model.experts % tp:
            raise TunerError(
                f"`expert_parallel` at `tp` {tp}: {model.name}'s {model.experts} experts do "
                "not divide among the GPUs"
            )
        return 1, tp
    if model.expert_intermediate % tp:
        raise TunerError(
            f"`tp` {tp}: {model.name}'s expert width {model.expert_intermediate} is not "
            "divisible by it (`expert_parallel` splits whole experts instead)"
        )
    return tp, 1


def experts_curve(
    tables: GpuTables, model: ModelShape, dtype: ExpertDtype, moe_tp: int, moe_ep: int
) -> tuple[Curve, str]:
    """One layer's fused experts over the step's tokens (milliseconds), and what it was read
    from; a one-line :class:`TunerError` where the tables have no such shape."""
    gpu = tables.gpu
    families = [f"moe.{name}" for name in _READ_FROM[dtype] if tables.has(f"moe.{name}")]
    if not families:
        raise TunerError(
            f"`gpu` {gpu}: its tables time no {dtype} experts (the fused-MoE tables measure "
            "balanced routing only where the GPU has them: `tune profile --list`)"
        )
    shape = (model.hidden, model.expert_intermediate, model.experts_per_token, model.experts)
    wanted = np.array([*shape, moe_tp, moe_ep])
    described = f"hidden {shape[0]}, expert width {shape[1]}, top-{shape[2]} of {shape[3]} experts"
    found = [
        (prefix, rows)
        for prefix in families
        if (rows := np.flatnonzero((tables[f"{prefix}.keys"] == wanted).all(axis=1))).size
    ]
    if not found:
        keys = np.concatenate([tables[f"{prefix}.keys"] for prefix in families])
        same = keys[(keys[:, :4] == np.array(shape)).all(axis=1)]
        layouts = ", ".join(
            f"TP {tp}" if ep == 1 else f"EP {ep}"
            for tp, ep in sorted({(int(r[4]), int(r[5])) for r in same})
        )
        if not layouts:
            raise TunerError(
                f"{model.name}: the {gpu} tables time no {dtype} experts of its shape ({described})"
            )
        asked = f"TP {moe_tp}" if moe_ep == 1 else f"EP {moe_ep}"
        raise TunerError(
            f"{model.name}: the {gpu} tables time its {dtype} experts at {layouts}, not "
            f"{asked} (`tp`, `expert_parallel`)"
        )
    prefix, rows = found[0]
    ms = tables[f"{prefix}.ms"][rows[0]]
    tokens = tables[f"{prefix}.tokens"].astype(np.float64)
    measured = ~np.isnan(ms)
    if measured.sum() < 2:
        raise TunerError(f"{model.name}: the {gpu} tables time its experts at too few sizes")
    x, y = tokens[measured], np.maximum.accumulate(ms[measured])
    split = f"TP {moe_tp}" if moe_ep == 1 else f"EP {moe_ep}"
    return (
        Curve(x=tuple(float(v) for v in x), ms=tuple(float(v) for v in y)),
        f"fused experts ({described}, {dtype}, {split}): the {prefix.split('.')[1]} table's "
        f"{int(x.size)} token counts from {int(x[0])} to {int(x[-1])}, balanced routing",
    )


def expert_weight_elements(model: ModelShape, tp: int) -> tuple[int, int]:
    """One GPU's share of the expert weights (routed and shared, either split of the
    experts holds a ``tp``-th of them) and the router's (bf16, on every GPU), in elements."""
    routed = model.layers * model.experts * 3 * model.hidden * model.expert_intermediate
    shared = model.layers * 3 * model.hidden * model.shared_intermediate
    return (routed + shared) // tp, model.layers * model.hidden * model.experts
