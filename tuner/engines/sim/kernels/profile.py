"""The ``kernels`` step-time profile: a step takes the sum of the kernels vLLM runs for it.

A :class:`KernelProfile` is self-contained: it holds, for one model on one GPU at one
tensor-parallel size and dtype, the latency curves already read from the measured tables at the
shard's shapes (``build_kernel_profile`` makes it; ``docs/kernel-profiles.md`` says where every
number comes from), so that its YAML can be stored with a study and read back anywhere.

For a step of ``T`` tokens (prefill and decode) from ``R`` requests::

    step = layers × (qkv(T) + o(T) + gate_up(T) + down(T))          measured GEMMs, per call
         (a mixture-of-experts model: router(T) + experts(T) [+ a shared expert's GEMMs])
         + (2 × layers + 1) × all_reduce(T × hidden)                 measured, tensor parallel
         + Σ memory ops (norms, rotary, SiLU·mul, embedding)         bytes / bandwidth + launch
         + lm_head(R) + logits_gather(R × vocab) + sampling(R)       logits of every request
         + Σ chunks max(context(s) × pairs / (s(s+1)/2), decode(1, s))   s = prior + chunk
         + decode_attention(D, KV tokens read / D)                   D decoding requests
         + overhead + per_request × R                                 device, outside kernels
         + host + host_request × R                                    host (hidden when async)

every per-layer term multiplied by ``layers``. Everything that depends on ``T`` alone, and
everything that depends on ``R`` alone, is summed once into one piecewise-linear curve each
(raised to its running maximum, so that more tokens are never faster where measurements are
noisy); a step costs two interpolations, one per prefill chunk and one bilinear decode read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from prefill_tuner.defaults import GPU_MEMORY_UTILIZATION
from prefill_tuner.engines.sim.kernels.derived import Derived
from prefill_tuner.engines.sim.profile_base import (
    MAX_BANDWIDTH_GBPS,
    MAX_BYTES,
    MAX_KV_BYTES_PER_TOKEN,
    MAX_PART_MS,
    Provenance,
    RequestPath,
    StepShape,
)


class GemmCurve(BaseModel):
    """One GEMM call's latency at the profile's ``gemm_tokens``: ``M`` tokens (or requests),
    ``n`` outputs, ``k`` inputs, at the tensor-parallel shard."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    n: int = Field(gt=0)
    k: int = Field(gt=0)
    ms: tuple[float, ...]
    """Milliseconds per call at each of ``gemm_tokens``."""


class Curve(BaseModel):
    """A latency curve over one axis (a sequence length, a message size)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    x: tuple[float, ...]
    ms: tuple[float, ...]

    @model_validator(mode="after")
    def _check(self) -> Curve:
        if len(self.x) != len(self.ms) or len(self.x) < 2:
            raise ValueError("a curve needs as many x as ms values, at least two")
        if any(b <= a for a, b in pairwise(self.x)):
            raise ValueError("a curve's x must increase")
        if any(not math.isfinite(v) or v < 0 for v in self.ms):
            raise ValueError("a curve's ms must be finite and non-negative")
        if max(self.ms) > MAX_PART_MS or not all(math.isfinite(v) for v in self.x):
            raise ValueError(f"a curve's x must be finite and its ms at most {MAX_PART_MS:g}")
        return self


class DecodeGrid(BaseModel):
    """Decode attention of one layer: ``batch`` requests each reading ``kv_tokens`` KV tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    batch: tuple[int, ...]
    kv_tokens: tuple[int, ...]
    ms: tuple[tuple[float, ...], ...]
    """``ms[i][j]``: milliseconds at ``batch[i]``, ``kv_tokens[j]``."""

    @model_validator(mode="after")
    def _check(self) -> DecodeGrid:
        if len(self.batch) < 2 or len(self.kv_tokens) < 2 or len(self.ms) != len(self.batch):
            raise ValueError("a decode grid needs a row per batch size, at least two of each")
        if any(len(row) != len(self.kv_tokens) for row in self.ms):
            raise ValueError("a decode grid needs a value per KV length in every row")
        for axis in (self.batch, self.kv_tokens):
            if any(b <= a for a, b in pairwise(axis)) or axis[0] < 1:
                raise ValueError("a decode grid's axes must be positive and increase")
        if any(not math.isfinite(v) or v < 0 for row in self.ms for v in row):
            raise ValueError("a decode grid's ms must be finite and non-negative")
        return self


class MemoryOp(BaseModel):
    """Kernels bound by memory bandwidth (no table measures them): each costs
    ``bytes_per_unit × units / bandwidth`` plus ``launches × memory_op_us``, where a unit is a
    token of the step (``per: token``) or one of its requests (``per: request``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    per: Literal["token", "request"]
    launches: int = Field(ge=0)
    """Kernel launches per step (per layer ones counted ``layers`` times)."""
    bytes_per_unit: float = Field(ge=0, le=MAX_BYTES)
    """Bytes read and written per token (or request), all launches together."""


class MemoryPlan(BaseModel):
    """How the KV pool was sized (vLLM: ``gpu_memory_utilization`` of the GPU's memory, less
    the weights, the profiling run's activation peak and what else it measures)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    capacity_bytes: int = Field(gt=0, le=MAX_BYTES)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    weight_bytes: int = Field(ge=0, le=MAX_BYTES)
    """Weights on one GPU (its shard; embeddings and norms in bf16)."""
    activation_reserve_bytes: int = Field(ge=0, le=MAX_BYTES)
    """Activations of the profiling run, sampler, CUDA graphs and non-torch memory (an
    estimate: ``docs/kernel-profiles.md``)."""
    kv_cache_bytes: int = Field(ge=0, le=MAX_BYTES)
    """What is left for the KV cache."""


class KernelProfile(RequestPath):
    """Step time as the sum of vLLM's measured kernels (module docs)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )

    left_out_at_default = ("checkpoint_dtype", "expert_dtype", "expert_parallel", "experts")
    """A dense model's record is what it was before mixture-of-experts models."""

    kind: Literal["kernels"] = "kernels"
    name: str
    description: str = ""
    model: str
    """The model (a HuggingFace id or the config it was read from)."""
    gpu: str
    """The GPU, as the tables name it (``h100_sxm``)."""
    tp: int = Field(ge=1)
    """Tensor-parallel size: every curve is at one GPU's shard."""
    dtype: Literal["bf16", "fp8"]
    """Weights and GEMMs (the LM head stays bf16, as vLLM keeps it)."""
    checkpoint_dtype: Literal["bf16", "fp8", "fp8_block", "mxfp4"] = "bf16"
    """The checkpoint's weights: an fp8 checkpoint needs no ``--quantization`` flag."""
    expert_dtype: Literal["bf16", "fp8", "fp8_block", "mxfp4"] | None = None
    """A mixture-of-experts model's expert weights (``None``: a dense model)."""
    expert_parallel: bool = False
    """The experts spread whole over the ``tp`` GPUs (``--enable-expert-parallel``) rather
    than each split over them."""
    kv_cache_dtype: Literal["bf16", "fp8"]
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    """Hidden size: an all-reduce moves ``tokens × hidden`` values."""
    logits_per_request: int = Field(gt=0)
    """Logits a request's last token produces (the vocabulary, padded as vLLM pads it)."""
    gemm_tokens: tuple[int, ...]
    """The token counts (``M``) the GEMM curves are given at: the tables' own."""
    gemms: dict[str, GemmCurve]
    """Each layer's GEMMs (``qkv``, ``o``, ``gate_up``, ``down``; a mixture-of-experts
    model's ``router`` and a shared expert's ``shared_gate_up``, ``shared_down`` instead of
    the MLP's), one call each, over ``M`` = the step's tokens."""
    experts: Curve | None = None
    """A mixture-of-experts layer's fused routed experts over ``x`` = the step's tokens
    (``kernels/experts.py``); ``None`` for a dense model."""
    lm_head: GemmCurve
    """The LM head, over ``M`` = the step's requests (vLLM computes logits for every scheduled
    request's last token)."""
    context_attention: Curve
    """One layer's prefill attention of one sequence of ``x`` tokens, causal, no prior
    context (KV-cache write included)."""
    decode_attention: DecodeGrid
    allreduce: Curve | None = None
    """One all-reduce of ``x`` bf16 values across the ``tp`` GPUs (none at ``tp`` 1)."""
    allreduces_per_step: int = Field(default=0, ge=0)
    """Two per layer (after attention and after the MLP) and one after the embedding."""
    logits_gather: Curve | None = None
    """Gathering ``x`` logits from the ``tp`` GPUs (none at ``tp`` 1)."""
    memory_ops: tuple[MemoryOp, ...] = ()
    memory_bandwidth_gbps: float = Field(gt=0, le=MAX_BANDWIDTH_GBPS)
    """Achieved bandwidth of the memory-bound kernels (the datasheet's × 0.8)."""
    memory_op_us: float = Field(default=3.0, ge=0, le=MAX_PART_MS * 1000)
    """Fixed cost of each memory-bound kernel launch."""
    overhead_ms: float = Field(default=0.5, ge=0, le=MAX_PART_MS)
    """Device time of a step outside the kernels above (input copies, launch gaps)."""
    per_request_us: float = Field(default=5.0, ge=0, le=MAX_PART_MS * 1000)
    """Device time per scheduled request outside the kernels above."""
    host_ms: float = Field(default=1.0, ge=0, le=MAX_PART_MS)
    """Host time of a step: scheduling, input preparation, output processing (a synchronous
    engine adds it; async scheduling runs it while the previous step computes)."""
    host_request_us: float = Field(default=5.0, ge=0, le=MAX_PART_MS * 1000)
    """Host time per scheduled request."""
    kv_bytes_per_token: float = Field(gt=0, le=MAX_KV_BYTES_PER_TOKEN)
    """KV cache bytes per token on one GPU: 2 × layers × max(1, KV heads / tp) × head_dim ×
    the KV dtype's bytes."""
    memory: MemoryPlan
    engine_defaults: dict[str, int | float | bool] = Field(default_factory=dict)
    """What vLLM resolves on this GPU: ``max_num_batched_tokens``, ``max_num_seqs``,
    ``block_size``, ``max_model_len``, ``num_gpu_blocks``, ``async_scheduling``."""
    provenance: Provenance = Field(default_factory=Provenance)

    _derived: Derived | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check_shapes(self) -> KernelProfile:
        tokens = self.gemm_tokens
        if len(tokens) < 2 or tokens[0] < 1 or any(b <= a for a, b in pairwise(tokens)):
            raise ValueError("gemm_tokens must be at least two increasing counts from 1 up")
        for name, curve in [*self.gemms.items(), ("lm_head", self.lm_head)]:
            if len(curve.ms) != len(tokens):
                raise ValueError(f"GEMM {name}: one ms value per gemm_tokens entry is needed")
            if any(not math.isfinite(v) or v < 0 for v in curve.ms):
                raise ValueError(f"GEMM {name}: ms must be finite and non-negative")
        if (self.tp > 1) != (self.allreduce is not None):
            raise ValueError("an all-reduce curve is needed exactly when tp > 1")
        if (self.experts is None) != (self.expert_dtype is None):
            raise ValueError("an experts curve and an expert dtype go together")
        if self.expert_parallel and self.experts is None:
            raise ValueError("expert_parallel needs experts")
        return self

    # --- the simulator's interface ------------------------------------------------------

    @property
    def serve_args(self) -> tuple[str, ...]:
        """The ``vllm serve`` flags of the machine this profile stands for, beside the
        scheduler's: the tensor-parallel size, expert parallelism, fp8 weights (quantized at
        load from a bf16 checkpoint; an fp8 checkpoint needs no flag), an fp8 KV cache, and a
        memory share other than vLLM's default."""
        args: list[str] = []
        if self.tp > 1:
            args += ["--tensor-parallel-size", str(self.tp)]
        if self.expert_parallel:
            args += ["--enable-expert-parallel"]
        if self.dtype == "fp8" and self.checkpoint_dtype == "bf16":
            args += ["--quantization", "fp8"]
        if self.kv_cache_dtype == "fp8":
            args += ["--kv-cache-dtype", "fp8"]
        if self.memory.gpu_memory_utilization != GPU_MEMORY_UTILIZATION:
            args += ["--gpu-memory-utilization", f"{self.memory.gpu_memory_utilization:g}"]
        return tuple(args)

    def host_seconds(self, requests: int) -> float:
        """The host's share of a step of ``requests`` requests (``host_ms``,
        ``host_request_us``)."""
        return self.host_ms / 1000.0 + self.host_request_us / 1e6 * requests

    def step_seconds(self, shape: StepShape) -> float:
        derived = self._get()
        tokens = shape.prefill_tokens + shape.decode_tokens
        total = derived.tokens(tokens) + derived.requests(shape.requests)
        decodes = shape.decode_tokens
        if decodes:
            total += derived.decode(decodes, shape.decode_context_tokens / decodes)
        if shape.prefill_tokens:
            chunks = shape.prefill_chunks or (
                (shape.prefill_context_tokens - shape.prefill_tokens, shape.prefill_tokens),
            )
            total += derived.prefill(chunks)
        return total + (derived.host_fixed + derived.host_per_request * shape.requests)

    def decode_run_seconds(self, requests: int, first_context: int, steps: int) -> np.ndarray:
        """Durations of ``steps`` consecutive plain decode steps of ``requests`` requests whose
        contexts sum to ``first_context`` in the first step and grow by one token each step:
        element by element the floats :meth:`step_seconds` gives (the same operations, in the
        same order, on arrays)."""
        derived = self._get()
        base = derived.tokens(requests) + derived.requests(requests)
        context = first_context + requests * np.arange(steps, dtype=np.float64)
        attention = derived.decode_many(requests, context / requests)
        return (base + attention) + (derived.host_fixed + derived.host_per_request * requests)

    def chunk_run_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> np.ndarray:
        """Durations of ``steps`` consecutive steps of ``decodes`` decodes, whose contexts sum
        to ``decode_context`` in the first step and grow by one token each per step, and the
        prefill ``chunks`` ``(tokens computed before, tokens)``, each after one more chunk per
        step, ``requests`` scheduled in all: element by element the floats
        :meth:`step_seconds` gives for such steps' shapes (the same operations, in the same
        order, on arrays; every integer far below 2**53, so exact as a float)."""
        derived = self._get()
        step = np.arange(steps, dtype=np.int64)
        tokens = decodes + sum(count for _, count in chunks)
        total = np.full(steps, derived.tokens(tokens) + derived.requests(requests))
        if decodes:
            context = decode_context + decodes * step
            total = total + derived.decode_many(decodes, context / decodes)
        if chunks:
            total = total + derived.prefill_many(
                [(before + count * step, count) for before, count in chunks]
            )
        return total + (derived.host_fixed + derived.host_per_request * requests)

    def decode_steps_seconds(self, requests: int, first_context: int, steps: int) -> list[float]:
        """:meth:`decode_run_seconds` without numpy (cheaper for a few steps): each step's
        float as :meth:`step_seconds` computes it, the parts that do not change hoisted."""
        derived = self._get()
        base = derived.tokens(requests) + derived.requests(requests)
        host = derived.host_fixed + derived.host_per_request * requests
        decode = derived.decode_curve(requests)
        return [
            (base + decode((first_context + requests * step) / requests)) + host
            for step in range(steps)
        ]

    def chunk_steps_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> list[float]:
        """:meth:`chunk_run_seconds` without numpy (cheaper for a few steps): each step's
        float as :meth:`step_seconds` computes it, the parts that do not change hoisted."""
        derived = self._get()
        tokens = decodes + sum(count for _, count in chunks)
        base = derived.tokens(tokens) + derived.requests(requests)
        host = derived.host_fixed + derived.host_per_request * requests
        decode = derived.decode_curve(decodes) if decodes else None
        chunk_seconds = derived.chunk
        times: list[float] = []
        for step in range(steps):
            total = base
            if decode is not None:
                total += decode((decode_context + decodes * step) / decodes)
            if chunks:
                prefill = 0.0  # (derived.prefill's sum, chunk by chunk in order)
                for before, count in chunks:
                    prefill += chunk_seconds(before + count * step, count)
                total += prefill
            times.append(total + host)
        return times

    def prefill_work_seconds(self, tokens: int, pairs: int) -> float:
        """A lower bound of the device time any schedule spends prefilling ``tokens`` tokens
        with ``pairs`` query-key pairs, additive over requests and chunks: the least the
        token-dependent kernels cost per token (at any step size) and the least context
        attention costs per pair (at any length)."""
        derived = self._get()
        return derived.token_floor * tokens + derived.pair_floor * pairs

    # --- reading single terms (for reports and tests) ----------------------------------

    def gemm_ms(self, name: str, tokens: float) -> float:
        """One call of GEMM ``name`` (``qkv``, ``o``, ``gate_up``, ``down``, ``lm_head``) at
        ``tokens`` rows, from its curve (exact at the measured token counts)."""
        curve = self.lm_head if name == "lm_head" else self.gemms[name]
        return float(np.interp(tokens, self.gemm_tokens, curve.ms))

    def yaml_text(self) -> str:
        """The profile as a YAML document :func:`~prefill_tuner.engines.sim.cost_model.
        load_profile` reads back to an equal profile, with a header saying what it is."""

        class _Dumper(yaml.SafeDumper):
            def ignore_aliases(self, data: Any) -> bool:
                return True

        header = (
            f"# {self.description or self.name}\n"
            "# kind: kernels: each step is the sum of the kernels vLLM runs for it, from\n"
            "# measured timings (docs/kernel-profiles.md). Provenance below.\n"
        )
        body = yaml.dump(
            self.model_dump(mode="json"),
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=None,
            width=100,
        )
        return header + body

    # --- derived curves --------------------------------------------------------------------

    def _get(self) -> Derived:
        # The private dict directly: pydantic's attribute lookup of a private attribute
        # costs more than the step time itself.
        private = self.__pydantic_private__
        derived = private.get("_derived") if private is not None else None
        if derived is None or derived.owner is not self.__dict__:
            derived = derive(self)
            self._derived = derived
        return derived


def derive(profile: KernelProfile) -> Derived:
    """The evaluation tables of ``profile`` (:class:`Derived`): its token and request curves,
    decode grid and context curve, each summed over the layers and raised to its running
    maximum, and the lower bounds the fast path uses."""
    layers = profile.layers
    token_x, token_seconds, token_tail = _token_curve(profile)
    request_x, request_seconds, request_tail = _request_curve(profile)

    # Decode attention: every layer, in seconds, raised to its running maximum along
    # both axes (a larger batch or a longer context is never faster).
    grid = np.asarray(profile.decode_attention.ms, dtype=np.float64) * layers / 1000.0
    grid = np.maximum.accumulate(np.maximum.accumulate(grid, axis=0), axis=1)
    kv = np.asarray(profile.decode_attention.kv_tokens, dtype=np.float64)
    grid_slope = np.diff(grid, axis=1) / np.diff(kv)

    # Context attention: every layer, in seconds, its running maximum, interpolated
    # linearly in √time between measured lengths (AIConfigurator's rule: time grows
    # about as the square of the length).
    ctx_x = np.asarray(profile.context_attention.x, dtype=np.float64)
    ctx = np.maximum.accumulate(
        np.asarray(profile.context_attention.ms, dtype=np.float64) * layers / 1000.0
    )
    root = np.sqrt(ctx)
    root_slope = np.diff(root) / np.diff(ctx_x)

    token_floor = min(float(np.min(token_seconds / token_x)), token_tail) * _SAFETY
    pair_floor = _least_per_pair(ctx_x, root, root_slope) * _SAFETY
    return Derived(
        owner=profile.__dict__,
        token_x=token_x.tolist(),
        token_y=token_seconds.tolist(),
        token_slope=(np.diff(token_seconds) / np.diff(token_x)).tolist(),
        token_tail=token_tail,
        request_x=request_x.tolist(),
        request_y=request_seconds.tolist(),
        request_slope=(np.diff(request_seconds) / np.diff(request_x)).tolist(),
        request_tail=request_tail,
        batch=[float(b) for b in profile.decode_attention.batch],
        kv=kv.tolist(),
        grid=grid.tolist(),
        grid_slope=grid_slope.tolist(),
        grid_np=grid,
        grid_slope_np=grid_slope,
        kv_np=kv,
        ctx_x=ctx_x.tolist(),
        ctx_root=root.tolist(),
        ctx_root_slope=root_slope.tolist(),
        ctx_x_np=ctx_x,
        ctx_root_np=root,
        ctx_root_slope_np=root_slope,
        ctx_last=float(ctx[-1]),
        token_floor=token_floor,
        pair_floor=pair_floor,
        host_fixed=profile.host_ms / 1000.0,
        host_per_request=profile.host_request_us / 1e6,
    )


def _memory(profile: KernelProfile, per: Literal["token", "request"]) -> tuple[float, float]:
    """The memory-bound kernels' fixed seconds (launches) and seconds per token or request."""
    launch = profile.memory_op_us / 1e6
    bandwidth = profile.memory_bandwidth_gbps * 1e9
    fixed = sum(op.launches for op in profile.memory_ops if op.per == per) * launch
    slope = sum(op.bytes_per_unit for op in profile.memory_ops if op.per == per)
    return fixed, slope / bandwidth


def _token_curve(profile: KernelProfile) -> tuple[np.ndarray, np.ndarray, float]:
    """What depends on a step's tokens alone: the layers' GEMMs and experts, the all-reduces,
    the memory-bound kernels; its points (tokens), seconds and seconds per token past the last."""
    m_axis = np.asarray(profile.gemm_tokens, dtype=np.float64)
    m_max = float(m_axis[-1])
    x = set(m_axis.tolist())
    if profile.allreduce is not None:
        x.update(
            e / profile.hidden for e in profile.allreduce.x if 1.0 <= e / profile.hidden <= m_max
        )
    if profile.experts is not None:
        x.update(v for v in profile.experts.x if v <= m_max)
    token_x = np.array(sorted(x), dtype=np.float64)
    gemm_ms = sum(
        (_interp(profile.gemm_tokens, g.ms, token_x) for g in profile.gemms.values()),
        np.zeros_like(token_x),
    )
    gemm_tail = sum(g.ms[-1] for g in profile.gemms.values()) / m_max
    if profile.experts is not None:
        experts = profile.experts
        inside = _interp(experts.x, experts.ms, token_x)
        per_token = experts.ms[-1] / experts.x[-1]  # beyond the last measured: in proportion
        gemm_ms = gemm_ms + np.where(token_x > experts.x[-1], token_x * per_token, inside)
        gemm_tail += per_token
    raw = profile.layers * gemm_ms
    tail = profile.layers * gemm_tail
    if profile.allreduce is not None:
        reduce_ms = _interp(profile.allreduce.x, profile.allreduce.ms, token_x * profile.hidden)
        raw = raw + profile.allreduces_per_step * reduce_ms
        tail += profile.allreduces_per_step * float(reduce_ms[-1]) / m_max
    fixed, per_token = _memory(profile, "token")
    token_seconds = np.maximum.accumulate(raw / 1000.0 + fixed + per_token * token_x)
    return token_x, token_seconds, tail / 1000.0 + per_token


def _request_curve(profile: KernelProfile) -> tuple[np.ndarray, np.ndarray, float]:
    """What depends on a step's requests alone: the LM head, the logits gather, sampling,
    per-request overhead; its points (requests), seconds and seconds per request past the
    last."""
    m_axis = np.asarray(profile.gemm_tokens, dtype=np.float64)
    m_max = float(m_axis[-1])
    x = set(m_axis.tolist())
    if profile.logits_gather is not None:
        x.update(
            e / profile.logits_per_request
            for e in profile.logits_gather.x
            if 1.0 <= e / profile.logits_per_request <= m_max
        )
    request_x = np.array(sorted(x), dtype=np.float64)
    raw = _interp(profile.gemm_tokens, profile.lm_head.ms, request_x)
    tail = profile.lm_head.ms[-1] / m_max
    if profile.logits_gather is not None:
        gather_ms = _interp(
            profile.logits_gather.x,
            profile.logits_gather.ms,
            request_x * profile.logits_per_request,
        )
        raw = raw + gather_ms
        tail += float(gather_ms[-1]) / m_max
    fixed, per_request = _memory(profile, "request")
    per_request += profile.per_request_us / 1e6
    request_seconds = np.maximum.accumulate(
        raw / 1000.0 + fixed + profile.overhead_ms / 1000.0 + per_request * request_x
    )
    return request_x, request_seconds, tail / 1000.0 + per_request


_SAFETY = 1.0 - 1e-9
"""The lower bounds are shaved by this factor, so that rounding never lifts them above a sum
of step times."""


def _interp(x: Sequence[float], y: Sequence[float], at: np.ndarray) -> np.ndarray:
    return np.interp(at, np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))


def _least_per_pair(x: np.ndarray, root: np.ndarray, slope: np.ndarray) -> float:
    """The least context-attention time per causal pair, ``context(s) / (s(s+1)/2)``, over
    every length ``s ≥ 1``: exact on each segment (√time linear in ``s``: the minimum is at an
    end or where the derivative vanishes), and held beyond the last point."""
    best = float("inf")
    for j in range(x.size - 1):
        x0, x1 = float(x[j]), float(x[j + 1])
        a = float(root[j]) - x0 * float(slope[j])
        b = float(slope[j])
        candidates = [x0, x1]
        if b != 2 * a:
            turning = a / (b - 2 * a)
            if x0 < turning < x1:
                candidates.append(turning)
        for s in candidates:
            best = min(best, 2 * (a + b * s) ** 2 / (s * (s + 1)))
    last = float(x[-1])
    best = min(best, 2 * float(root[-1]) ** 2 / (last * (last + 1)))
    # Below the first point its time is held: the least per pair there is at that point.
    return max(best, 0.0)
