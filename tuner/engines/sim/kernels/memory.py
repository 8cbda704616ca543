"""What a kernel profile's step and memory rules need beside the measured tables: one GPU's
shard of the model, the memory-bound kernels no table times, and the KV pool as vLLM sizes it
(:func:`~prefill_tuner.engines.sim.kernels.build.build_kernel_profile` assembles them)."""

from __future__ import annotations

from dataclasses import dataclass

from prefill_tuner.engines.sim.kernels.experts import (
    BYTES_PER_WEIGHT,
    expert_dtype,
    expert_layout,
    expert_weight_elements,
)
from prefill_tuner.engines.sim.kernels.models import ModelShape
from prefill_tuner.engines.sim.kernels.profile import MemoryOp, MemoryPlan
from prefill_tuner.engines.sim.kernels.tables import GpuTables
from prefill_tuner.errors import TunerError

GIB = 1 << 30
BLOCK_SIZE = 16
"""vLLM's KV block size on CUDA GPUs."""
ACTIVATION_BYTES = 2
"""Activations, embeddings, norms and the LM head stay bf16 at either weight dtype."""
CUDA_GRAPH_BYTES = GIB // 2
"""vLLM's estimate of its CUDA graphs' memory, subtracted since vLLM 0.21 (an estimate)."""
NON_TORCH_BYTES = GIB // 4
"""Memory vLLM's profiler sees besides PyTorch's (cuBLAS workspaces and the like; an
estimate); NCCL's buffers come on top, from the GPU's system description."""
SAMPLER_COPIES = 3
"""The dummy sampler run holds the logits about three times in fp32 (logits, probabilities,
a sort buffer)."""
SAMPLER_PASSES = 5
"""Passes a sampling step makes over a request's fp32 logits (cast, temperature, softmax,
sampling, argmax): an estimate."""
SAMPLER_LAUNCHES = 4


LARGE_GPU_BYTES = 160 * GIB
"""From this much memory a GPU (B200, B300) has ``vllm serve``'s largest batch defaults (since
vLLM 0.28; before, the H100 tier's: ``config.release_defaults``)."""
LARGE_GPU_DEFAULTS = (16384, 1024)
H100_TIER_DEFAULTS = (8192, 1024)
"""The budget and sequences of GPUs of 70 GiB or more (not an A100)."""


def batch_defaults(tables: GpuTables) -> tuple[int, int]:
    """vLLM's ``max_num_batched_tokens`` and ``max_num_seqs`` for ``vllm serve`` by the GPU's
    memory (``EngineArgs.get_batch_defaults``): 16384 and 1024 at 160 GiB or more; 8192 and
    1024 at 70 GiB or more unless an A100; 2048 and 256 below."""
    memory = tables.system["mem_capacity"]
    names = " ".join([tables.gpu, *tables.system["device"]]).lower()
    if memory >= LARGE_GPU_BYTES:
        return LARGE_GPU_DEFAULTS
    if memory >= 70 * GIB and "a100" not in names:
        return H100_TIER_DEFAULTS
    return 2048, 256


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def shard(model: ModelShape, tp: int) -> tuple[int, int, int, int, int, int]:
    """One GPU's shard of ``model`` at tensor parallelism ``tp``: attention heads, KV heads,
    head size, MLP width (0 for a mixture-of-experts model: its experts are split by
    :func:`~prefill_tuner.engines.sim.kernels.experts.expert_layout`), the padded vocabulary
    and its shard (vLLM's tensor-parallel layers); a one-line :class:`TunerError` where vLLM
    would refuse ``tp``."""
    if model.heads % tp:
        raise TunerError(
            f"`tp` {tp}: {model.name}'s {model.heads} attention heads are not divisible by it "
            "(vLLM requires it)"
        )
    if (model.kv_heads % tp) if model.kv_heads >= tp else (tp % model.kv_heads):
        raise TunerError(
            f"`tp` {tp}: {model.name}'s {model.kv_heads} KV heads neither divide among nor "
            "replicate over it (vLLM requires one or the other)"
        )
    if not model.moe and model.intermediate % tp:
        raise TunerError(
            f"`tp` {tp}: {model.name}'s MLP width {model.intermediate} is not divisible by it"
        )
    heads = model.heads // tp
    kv_heads = max(1, model.kv_heads // tp)
    hd = model.head_dim
    mlp = 0 if model.moe else model.intermediate // tp
    vocab = -(-model.vocab // 64) * 64  # vLLM pads the vocabulary to a multiple of 64
    vocab_shard = -(-vocab // tp)

    return heads, kv_heads, hd, mlp, vocab, vocab_shard


def memory_bound_ops(
    model: ModelShape, heads: int, kv_heads: int, hd: int, mlp: int, vocab: int
) -> list[MemoryOp]:
    """The memory-bound kernels of a step that no table measures, per token or request."""
    # Memory-bound kernels no table measures: bytes moved at 80% of the datasheet bandwidth,
    # plus 3 µs a launch (AIConfigurator's memory-op rule); bf16 activations.
    a = ACTIVATION_BYTES
    layers = model.layers
    q_shard, k_shard = heads * hd, kv_heads * hd
    memory_ops = [
        MemoryOp(name="embedding", per="token", launches=1, bytes_per_unit=a * model.hidden),
        MemoryOp(
            name="residual add + RMSNorm (twice a layer, and the final norm)",
            per="token",
            launches=2 * layers + 1,
            bytes_per_unit=(2 * layers + 1) * 4 * a * model.hidden,
        ),
        MemoryOp(
            name="rotary embedding of queries and keys",
            per="token",
            launches=layers,
            bytes_per_unit=layers * 2 * a * (q_shard + k_shard),
        ),
    ]
    if model.moe:
        memory_ops.append(
            MemoryOp(
                name="router top-k (softmax over the experts' fp32 logits, pick k)",
                per="token",
                launches=layers,
                bytes_per_unit=layers * (4 * model.experts + 8 * model.experts_per_token),
            )
        )
    else:
        memory_ops.append(
            MemoryOp(
                name="SiLU and multiply",
                per="token",
                launches=layers,
                bytes_per_unit=layers * 3 * a * mlp,
            )
        )
    if model.qk_norm:
        memory_ops.append(
            MemoryOp(
                name="RMSNorm of queries and keys",
                per="token",
                launches=layers,
                bytes_per_unit=layers * 2 * a * (q_shard + k_shard),
            )
        )
    memory_ops.append(
        MemoryOp(
            name="sampling (fp32 logits: cast, temperature, softmax, sample, argmax)",
            per="request",
            launches=SAMPLER_LAUNCHES,
            bytes_per_unit=SAMPLER_PASSES * 4 * vocab,
        )
    )
    return memory_ops


@dataclass(frozen=True)
class KvPool:
    """The KV pool as vLLM sizes it, and what went into it."""

    plan: MemoryPlan
    batched: int
    """vLLM's default step budget on the GPU (the profiling run's size)."""
    seqs: int
    kv_bytes: int
    """KV cache bytes per token on one GPU."""
    context_length: int
    blocks: int


def kv_pool(
    model: ModelShape,
    tables: GpuTables,
    gpu: str,
    tp: int,
    dtype: str,
    kv: str,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    expert_parallel: bool = False,
) -> KvPool:
    """The KV pool, as vLLM sizes it: ``gpu_memory_utilization`` of the GPU's memory, less the
    weights, the profiling run's activation peak (a max_num_batched_tokens forward pass, or
    the dummy sampler run over max_num_seqs requests), CUDA graphs and non-torch memory; a
    one-line :class:`TunerError` where vLLM would refuse to start. Every expert's weights
    count (a ``tp``-th of them on each GPU, however they are split)."""
    system = tables.system
    a = ACTIVATION_BYTES
    layers = model.layers
    heads, kv_heads, hd, mlp, vocab, vocab_shard = shard(model, tp)
    batched, seqs = batch_defaults(tables)
    w = 1 if dtype == "fp8" else 2
    linear = layers * (
        model.hidden * (heads + 2 * kv_heads) * hd
        + heads * hd * model.hidden
        + 3 * model.hidden * mlp
    )
    small = layers * (2 * model.hidden + (2 * hd if model.qk_norm else 0)) + model.hidden
    if model.attention_bias:
        small += layers * (heads + 2 * kv_heads) * hd
    embeddings = vocab_shard * model.hidden * (1 if model.tied_embeddings else 2)
    weight_bytes: float = linear * w + (small + embeddings) * a
    forward = 2 * model.hidden + 3 * mlp + (heads + 2 * kv_heads) * hd
    if model.moe:
        experts, router = expert_weight_elements(model, tp)
        weight_bytes += experts * BYTES_PER_WEIGHT[expert_dtype(model, dtype)] + router * a
        moe_tp, _ = expert_layout(model, tp, expert_parallel)
        # The fused kernel's workspaces: each token's k gate-up, activation and down outputs.
        width = model.expert_intermediate // moe_tp
        forward += model.experts_per_token * (3 * width + model.hidden)
    forward_peak = batched * a * forward
    sampler_peak = seqs * vocab * 4 * SAMPLER_COPIES
    nccl = int(system["nccl_mem"].get(str(tp), max(system["nccl_mem"].values())))
    reserve = max(forward_peak, sampler_peak) + CUDA_GRAPH_BYTES + NON_TORCH_BYTES + nccl
    capacity = int(system["mem_capacity"])
    budget = capacity * gpu_memory_utilization
    kv_cache_bytes = int(budget - weight_bytes - reserve)
    # vLLM's hybrid KV manager keeps a sliding-window layer's last window only: a per-token
    # cost is the full-attention layers' (the window layers' few blocks a request are left out).
    kv_bytes = 2 * (layers - model.window_layers) * kv_heads * hd * (1 if kv == "fp8" else 2)
    context_length = model.max_position_embeddings if max_model_len is None else max_model_len
    if (
        isinstance(context_length, bool)
        or not isinstance(context_length, int)
        or context_length < 2
    ):
        raise TunerError(f"`max_model_len` {max_model_len!r}: a whole number of tokens from 2")
    if context_length > model.max_position_embeddings:
        raise TunerError(
            f"`max_model_len` {context_length}: beyond {model.name}'s max_position_embeddings "
            f"{model.max_position_embeddings} (vLLM refuses it)"
        )
    blocks = max(kv_cache_bytes, 0) // (BLOCK_SIZE * kv_bytes)
    needed = -(-context_length // BLOCK_SIZE)
    if blocks - 1 < needed:
        raise TunerError(
            f"{model.name} on {tp} × {gpu} ({dtype}): {gib(capacity)} × {gpu_memory_utilization}"
            f" = {gib(budget)} less {gib(weight_bytes)} of weights and {gib(reserve)} of "
            f"activations leaves {gib(max(kv_cache_bytes, 0))} for the KV cache, and one "
            f"max_model_len ({context_length:,}-token) request needs "
            f"{gib(needed * BLOCK_SIZE * kv_bytes)}: vLLM refuses to start"
            + (
                f" (`max_model_len` {(blocks - 1) * BLOCK_SIZE} would fit)"
                if blocks > 1
                else " (a larger `tp` or fp8 weights leave room)"
            )
        )

    plan = MemoryPlan(
        capacity_bytes=capacity,
        gpu_memory_utilization=gpu_memory_utilization,
        weight_bytes=int(weight_bytes),
        activation_reserve_bytes=int(reserve),
        kv_cache_bytes=kv_cache_bytes,
    )
    return KvPool(plan, batched, seqs, kv_bytes, context_length, int(blocks))
