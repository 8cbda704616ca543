"""A decoder's shape, as the kernel profile needs it, from a HuggingFace ``config.json``.

Only what decides the kernels vLLM runs and the memory they need: layers, hidden size, query
and KV heads, head size, MLP width, vocabulary, tied embeddings, the context length, the
parameter count and, for a mixture-of-experts model, its experts (how many, how many a token
is routed to, their width, a shared expert's) and the checkpoint's fp8 quantization. Dense
Llama, Mistral, Qwen2 and Qwen3 and the mixture-of-experts Qwen3-MoE, Qwen2-MoE, Mixtral and
MiniMax-M2 (GQA or MHA, gated SiLU MLPs or experts, RMSNorm) are modelled; multi-head latent
attention models, sliding-window attention and multimodal configs are refused with one line
(:class:`~prefill_tuner.errors.TunerError`).

A handful of popular models' configs are bundled by name (``models/``:
:func:`bundled_models`), written from the shape fields of their published ``config.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prefill_tuner.errors import TunerError
from prefill_tuner.files import read_input, why_unreadable

MODELS_DIR = Path(__file__).parent / "models"

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""The dense ``model_type`` values modelled: decoders with the same layer (fused QKV, output
projection, gated SiLU MLP, two RMSNorms); Qwen3 adds a norm on queries and keys, Qwen2 a bias
on them."""

MOE_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral", "minimax_m2", "gpt_oss")
"""The mixture-of-experts ``model_type`` values modelled: the same attention, and in every
layer a router (a GEMM to one logit per expert) and fused experts, each a gated SiLU MLP, a
token's output the weighted sum of its top-k experts'; Qwen2-MoE adds a shared expert every
token runs. Qwen3-MoE and MiniMax-M2 norm queries and keys; gpt-oss alternates sliding-window
(128-token) and full attention layers, with attention sinks and MXFP4 experts."""

_MOE_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
    "num_experts_per_tok",
    "moe_num_experts",
)
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank")
_MAX_CONFIG_BYTES = 1_000_000


class ModelShape(BaseModel):
    """A dense decoder-only transformer's shape (per model, not per GPU)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """The model's name (a HuggingFace id, or the folder or file it was read from)."""
    model_type: str
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    """Query heads."""
    kv_heads: int = Field(gt=0)
    """Key/value heads (equal to ``heads`` for multi-head attention)."""
    head_dim: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    """The MLP's inner width (gate and up projections each, down projection's input)."""
    vocab: int = Field(gt=0)
    tied_embeddings: bool = False
    """The LM head shares the embedding's weights (one copy in memory)."""
    max_position_embeddings: int = Field(gt=0)
    """The context length vLLM takes as ``max_model_len`` when none is given."""
    qk_norm: bool = False
    """RMSNorm on each head's queries and keys (Qwen3)."""
    attention_bias: bool = False
    """Biases on the query, key and value projections (Qwen2)."""
    parameters: int = Field(gt=0)
    """Parameter count (embedding, LM head unless tied, every layer's weights and norms)."""
    experts: int = Field(default=0, ge=0)
    """Routed experts per layer (0: a dense model, whose MLP is ``intermediate`` wide)."""
    experts_per_token: int = Field(default=0, ge=0)
    """Experts each token is routed to (top-k)."""
    expert_intermediate: int = Field(default=0, ge=0)
    """Each expert's inner width."""
    shared_intermediate: int = Field(default=0, ge=0)
    """A shared expert's inner width (0: none), run by every token beside the routed ones."""
    checkpoint_dtype: Literal["bf16", "fp8", "fp8_block", "mxfp4"] = "bf16"
    """The checkpoint's weights (its ``quantization_config``): fp8 with per-tensor scales, or
    with 128 × 128 block scales (``weight_block_size``); MXFP4 experts with the rest bf16
    (gpt-oss)."""
    window: int = Field(default=0, ge=0)
    """The sliding window of the layers that have one (0: none)."""
    window_layers: int = Field(default=0, ge=0)
    """How many layers attend only within ``window`` (the rest attend to the whole context)."""

    @property
    def default_dtype(self) -> Literal["bf16", "fp8"]:
        """The weights' dtype vLLM runs the checkpoint in, beside its experts: fp8 for an fp8
        checkpoint, bf16 otherwise (gpt-oss keeps all but its MXFP4 experts in bf16)."""
        return "fp8" if self.checkpoint_dtype in ("fp8", "fp8_block") else "bf16"

    @property
    def moe(self) -> bool:
        """Whether the model routes tokens to experts."""
        return self.experts > 0

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


def _parameters(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int,
    tied: bool,
    qk_norm: bool,
    attention_bias: bool,
    experts: int = 0,
    expert_intermediate: int = 0,
    shared_intermediate: int = 0,
) -> int:
    qkv = hidden * (heads + 2 * kv_heads) * head_dim
    if attention_bias:
        qkv += (heads + 2 * kv_heads) * head_dim
    per_layer = (
        qkv
        + heads * head_dim * hidden  # output projection
        + (
            experts * (3 * hidden * expert_intermediate + hidden)  # experts and the router
            + 3 * hidden * shared_intermediate  # a shared expert
            if experts
            else 3 * hidden * intermediate  # gate, up, down
        )
        + 2 * hidden  # the two RMSNorms
        + (2 * head_dim if qk_norm else 0)
    )
    embeddings = vocab * hidden * (1 if tied else 2)
    return layers * per_layer + embeddings + hidden  # and the final norm


def _active(value: Any) -> bool:
    return value is not None and value is not False and value != 0 and value != []


def shape_from_config(config: dict[str, Any], name: str) -> ModelShape:
    """The shape of the model ``config`` (a parsed ``config.json``) describes; a one-line
    :class:`TunerError` naming ``name`` for what it is not or cannot tell."""
    _refuse_unmodelled(config, name)
    model_type = config["model_type"]

    def whole(key: str, default: Any = None) -> int:
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            shown = "missing" if value is None else repr(value)
            raise TunerError(f"{name}: config.json field {key!r} is {shown}, not a positive whole")
        return value

    hidden = whole("hidden_size")
    heads = whole("num_attention_heads")
    kv_heads = whole("num_key_value_heads", heads)
    head_dim = config.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise TunerError(
                f"{name}: no head_dim, and hidden_size {hidden} is not a multiple of "
                f"num_attention_heads {heads}"
            )
        head_dim = hidden // heads
    else:
        head_dim = whole("head_dim")
    if heads % kv_heads:
        raise TunerError(
            f"{name}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
            f"{kv_heads}"
        )
    layers = whole("num_hidden_layers")
    intermediate = whole("intermediate_size")
    vocab = whole("vocab_size")
    length = whole("max_position_embeddings")
    tied = bool(config.get("tie_word_embeddings", False))
    qk_norm = model_type in ("qwen3", "qwen3_moe") or bool(config.get("use_qk_norm", False))
    bias = model_type in ("qwen2", "qwen2_moe") or bool(config.get("attention_bias", False))
    experts = expert_width = shared = 0
    if model_type in MOE_TYPES:
        experts = whole("num_local_experts" if "num_local_experts" in config else "num_experts")
        top_k = whole("num_experts_per_tok")
        if top_k > experts:
            raise TunerError(
                f"{name}: num_experts_per_tok {top_k} is more than its {experts} experts"
            )
        expert_width = whole(
            "moe_intermediate_size" if "moe_intermediate_size" in config else "intermediate_size"
        )
        shared_key = next(
            (
                key
                for key in ("shared_expert_intermediate_size", "shared_intermediate_size")
                if config.get(key)
            ),
            None,
        )
        shared = whole(shared_key) if shared_key else 0
        sparse = [
            key
            for key, dense in (("decoder_sparse_step", 1), ("mlp_only_layers", []))
            if config.get(key, dense) not in (dense, None)
        ]
        if sparse:
            raise TunerError(
                f"{name}: dense layers among the expert layers ({', '.join(sparse)}) are not "
                "modelled"
            )
    window, window_layers = _windows(config, name, layers)
    return ModelShape(
        name=name,
        model_type=model_type,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tied_embeddings=tied,
        max_position_embeddings=length,
        qk_norm=qk_norm,
        attention_bias=bias,
        experts=experts,
        experts_per_token=config["num_experts_per_tok"] if experts else 0,
        expert_intermediate=expert_width,
        shared_intermediate=shared,
        checkpoint_dtype=_checkpoint_dtype(config, name),
        window=window,
        window_layers=window_layers,
        parameters=_parameters(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=intermediate,
            vocab=vocab,
            tied=tied,
            qk_norm=qk_norm,
            attention_bias=bias,
            experts=experts,
            expert_intermediate=expert_width,
            shared_intermediate=shared,
        ),
    )


def _windows(config: dict[str, Any], name: str, layers: int) -> tuple[int, int]:
    """gpt-oss's sliding window and how many layers have it (its ``layer_types``; every
    other layer when it gives none); ``(0, 0)`` for every other model."""
    if config.get("model_type") != "gpt_oss":
        return 0, 0
    window = config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise TunerError(
            f"{name}: config.json field 'sliding_window' is {window!r}, not a positive whole"
        )
    kinds = config.get("layer_types") or [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
    ]
    if len(kinds) != layers or set(kinds) - {"sliding_attention", "full_attention"}:
        raise TunerError(
            f"{name}: config.json field 'layer_types' does not name each layer's attention"
        )
    return window, kinds.count("sliding_attention")


def _checkpoint_dtype(
    config: dict[str, Any], name: str
) -> Literal["bf16", "fp8", "fp8_block", "mxfp4"]:
    """The checkpoint's weights, from its ``quantization_config`` (none: bf16); a one-line
    error for a quantization the tables do not time."""
    quantization = config.get("quantization_config")
    if not quantization:
        return "bf16"
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if method == "mxfp4" and config.get("model_type") == "gpt_oss":
        return "mxfp4"
    if method != "fp8":
        raise TunerError(
            f"{name}: quantization_config quant_method {method!r} is not modelled (fp8 is, "
            "per tensor or in blocks, and gpt-oss's mxfp4)"
        )
    return "fp8_block" if quantization.get("weight_block_size") else "fp8"


def _refuse_unmodelled(config: Any, name: str) -> None:
    """A one-line error naming ``name`` for a config that describes what the kernel profiles
    do not model: not a JSON object, multimodal, latent attention, experts, another model
    type, sliding windows, another activation."""
    if not isinstance(config, dict):
        raise TunerError(f"{name}: config.json does not hold a JSON object")
    if "text_config" in config or "vision_config" in config:
        raise TunerError(
            f"{name}: a multimodal config (text_config/vision_config); only dense text decoders "
            "are modelled"
        )
    mla = [key for key in _MLA_KEYS if _active(config.get(key))]
    if mla:
        raise TunerError(
            f"{name}: multi-head latent attention ({', '.join(mla)}) is not modelled; only "
            "dense decoders with grouped-query or multi-head attention are"
        )
    moe = [key for key in _MOE_KEYS if _active(config.get(key))]
    if moe and config.get("model_type") not in MOE_TYPES:
        raise TunerError(
            f"{name}: a mixture-of-experts model ({', '.join(moe)}) of model_type "
            f"{config.get('model_type')!r} is not modelled (those of type "
            f"{', '.join(MOE_TYPES)} are)"
        )
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES + MOE_TYPES:
        raise TunerError(
            f"{name}: model_type {model_type!r} is not modelled (decoders of type "
            f"{', '.join(MODEL_TYPES + MOE_TYPES)} are)"
        )
    window = config.get("sliding_window")
    context = config.get("max_position_embeddings")
    if (
        model_type != "gpt_oss"
        and isinstance(window, int)
        and window > 0
        and config.get("use_sliding_window", True)
        and config.get("max_window_layers", 1)
        and not (isinstance(context, int) and window >= context)
    ):
        raise TunerError(
            f"{name}: sliding-window attention (sliding_window {window}) is not modelled"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise TunerError(
            f"{name}: hidden_act {config.get('hidden_act')!r}: only the gated SiLU MLP is modelled"
        )


def _bundled_file(name: str) -> Path:
    return MODELS_DIR / (name.replace("/", "--") + ".json")


def bundled_models() -> list[str]:
    """The models whose shape is bundled, by HuggingFace id
    (``meta-llama/Llama-3.1-8B-Instruct``)."""
    return sorted(path.stem.replace("--", "/") for path in MODELS_DIR.glob("*.json"))


def config_files(model_config: str | os.PathLike[str]) -> list[Path]:
    """The files ``--model-config`` names: the folder (or file) given and the ``config.json``
    read from it, so that no output replaces them."""
    path = Path(model_config)
    return [path, path / "config.json"] if os.path.isdir(path) else [path]


def load_model_shape(name_or_path: str | os.PathLike[str]) -> ModelShape:
    """A model's shape: a ``config.json`` file, a folder holding one, or a bundled model's
    HuggingFace id; a one-line :class:`TunerError` otherwise."""
    text = os.fspath(name_or_path)
    path = Path(text)
    if os.path.isdir(path):
        path = path / "config.json"
        if not path.is_file():
            raise TunerError(f"{text}: a folder without a config.json")
        name = text
    elif os.path.isfile(path):
        name = text
    else:
        bundled = _bundled_file(text)
        if text.count("/") != 1 or not bundled.is_file():
            raise TunerError(
                f"no config.json at {text!r}, and no bundled model of that name (bundled: "
                f"{', '.join(bundled_models())})"
            )
        path, name = bundled, text
    try:
        config = json.loads(read_input(path, _MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TunerError(f"{path}: cannot read the model config: {why_unreadable(exc)}") from None
    return shape_from_config(config, name)
