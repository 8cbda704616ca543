"""Mixture-of-experts kernel profiles (issue 44): the bundled MoE models have their published
shapes; a profile reads the fused-experts tables at the model's shape and split (experts split
over the GPUs, or spread whole with expert parallelism), counts every expert's weights, says
where its experts' time comes from, and refuses in one line what the tables or vLLM do not
cover; the CLI builds one and prints the flag that made it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prefill_tuner.engines.sim import SimConfig
from prefill_tuner.engines.sim.cost_model import StepShape, load_profile
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.engines.sim.kernels import KernelProfile, build_kernel_profile, load_model_shape
from prefill_tuner.engines.sim.kernels.tables import gpu_tables
from prefill_tuner.errors import TunerError

QWEN3_30B = "Qwen/Qwen3-30B-A3B"
QWEN3_235B = "Qwen/Qwen3-235B-A22B"
MIXTRAL_8X7B = "mistralai/Mixtral-8x7B-v0.1"
MIXTRAL_8X22B = "mistralai/Mixtral-8x22B-v0.1"
MINIMAX = "MiniMaxAI/MiniMax-M2.5"


def build(model: str, gpu: str, tp: int = 1, dtype: str = "bf16", **kw) -> KernelProfile:
    return build_kernel_profile(load_model_shape(model), gpu, tp, dtype, **kw)  # type: ignore[arg-type]


def prefill(tokens: int) -> StepShape:
    return StepShape(prefill_tokens=tokens, requests=1, prefill_context_tokens=tokens)


def decode(requests: int, context: int = 2048) -> StepShape:
    return StepShape(
        decode_tokens=requests, requests=requests, decode_context_tokens=requests * context
    )


def test_the_bundled_moe_models_have_their_published_shapes() -> None:
    published = {  # parameters of the published checkpoints (their model cards)
        QWEN3_30B: 30_532_122_624,
        QWEN3_235B: 235_093_634_560,
        MIXTRAL_8X7B: 46_702_792_704,
        MIXTRAL_8X22B: 140_620_634_112,
    }
    for name, parameters in published.items():
        assert load_model_shape(name).parameters == parameters, name
    qwen = load_model_shape(QWEN3_30B)
    assert (qwen.experts, qwen.experts_per_token, qwen.expert_intermediate) == (128, 8, 768)
    assert qwen.moe and qwen.qk_norm and qwen.checkpoint_dtype == "bf16"
    minimax = load_model_shape(MINIMAX)
    assert (minimax.experts, minimax.experts_per_token, minimax.expert_intermediate) == (
        256,
        8,
        1536,
    )
    assert minimax.checkpoint_dtype == "fp8_block" and minimax.qk_norm
    assert 228e9 < minimax.parameters < 230e9  # "229B" on its model card
    assert not load_model_shape("Qwen/Qwen3-32B").moe


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "dtype", "expert_parallel"),
    [
        (QWEN3_30B, "h100_sxm", 1, "bf16", False),
        (QWEN3_30B, "h200_sxm", 2, "bf16", True),
        (QWEN3_235B, "h200_sxm", 4, "bf16", False),
        (MIXTRAL_8X7B, "h100_sxm", 2, "bf16", False),
        (MIXTRAL_8X22B, "h200_sxm", 4, "fp8", False),
        (MINIMAX, "b200_sxm", 2, "fp8", False),
        (MINIMAX, "b200_sxm", 4, "fp8", True),
    ],
)
def test_moe_models_build_and_read_the_experts_tables_at_their_split(
    model: str, gpu: str, tp: int, dtype: str, expert_parallel: bool
) -> None:
    p = build(model, gpu, tp, dtype, expert_parallel=expert_parallel)
    shape = load_model_shape(model)
    assert p.experts is not None and p.expert_parallel == expert_parallel
    assert set(p.gemms) == {"qkv", "o", "router"}  # no dense MLP; the router's GEMM
    assert p.gemms["router"].n == shape.experts
    # The experts curve is the table's own points at the model's shape and split.
    tables = gpu_tables(gpu)
    read = next(line for line in p.provenance.interpolated if "fused experts" in line)
    family = read.split("the ")[1].split(" table's")[0]  # fp8 experts: block-scaled first
    assert family == p.expert_dtype or (p.expert_dtype, family) == ("fp8", "fp8_block")
    prefix = f"moe.{family}"
    split = (1, tp) if expert_parallel else (tp, 1)
    key = (shape.hidden, shape.expert_intermediate, shape.experts_per_token, shape.experts, *split)
    row = int(np.flatnonzero((tables[f"{prefix}.keys"] == key).all(axis=1))[0])
    measured = tables[f"{prefix}.ms"][row]
    tokens = tables[f"{prefix}.tokens"][~np.isnan(measured)]
    assert p.experts.x == tuple(float(t) for t in tokens)
    assert p.experts.ms[-1] == pytest.approx(float(np.nanmax(measured)))
    # More tokens are never faster; a decode of a few tokens costs far less than a prefill.
    times = [p.step_seconds(prefill(n)) for n in (1, 16, 256, 2048, 8192, 16384, 40000)]
    assert times == sorted(times)
    assert p.step_seconds(decode(1)) < p.step_seconds(prefill(4096)) / 5
    # vLLM would accept what it resolves; the provenance names the experts' kernels.
    config = SimConfig.model_validate(p.engine_defaults)
    assert config.usable_blocks * config.block_size >= config.max_model_len
    assert "experts" in p.provenance.kernel_sources
    assert any("fused experts" in line for line in p.provenance.interpolated)
    assert ("--enable-expert-parallel" in p.serve_args) == expert_parallel


def test_the_experts_add_their_measured_time_to_every_layer() -> None:
    """A step's token-dependent time is the dense parts plus layers × the experts' measured
    time at the step's tokens: remove the experts and exactly that goes."""
    p = build(QWEN3_30B, "h100_sxm")
    assert p.experts is not None
    without = p.model_copy(update={"experts": None, "expert_dtype": None})
    for tokens in (1, 64, 1024, 8192):
        at = p.experts.x.index(float(tokens))
        added = p.step_seconds(prefill(tokens)) - without.step_seconds(prefill(tokens))
        assert added == pytest.approx(p.layers * p.experts.ms[at] / 1000, rel=1e-9), tokens


def test_every_expert_counts_against_memory() -> None:
    """Weights on one GPU: a tp-th of every expert (fp8 experts one byte each), whether the
    experts are split or spread whole; the KV pool is what is left."""
    shape = load_model_shape(MINIMAX)
    split = build(MINIMAX, "b200_sxm", 2, "fp8")
    spread = build(MINIMAX, "b200_sxm", 2, "fp8", expert_parallel=True)
    assert split.memory.weight_bytes == spread.memory.weight_bytes
    assert split.memory.weight_bytes == pytest.approx(shape.parameters / 2, rel=0.03)
    bf16 = build(QWEN3_235B, "h200_sxm", 4, "bf16")
    assert bf16.memory.weight_bytes == pytest.approx(2 * 235_093_634_560 / 4, rel=0.03)
    fp8 = build(QWEN3_235B, "h200_sxm", 4, "fp8")
    assert fp8.memory.kv_cache_bytes > bf16.memory.kv_cache_bytes + 50 * 2**30
    # Qwen3-235B in bf16 (470 GB) does not fit two H200s: refused with the numbers.
    with pytest.raises(TunerError, match="vLLM refuses to start"):
        build(QWEN3_235B, "h200_sxm", 2, "bf16")


def test_serve_lines_carry_the_split_and_only_the_quantization_a_checkpoint_needs() -> None:
    minimax = build(MINIMAX, "b200_sxm", 4, "fp8", expert_parallel=True)
    assert minimax.serve_args == ("--tensor-parallel-size", "4", "--enable-expert-parallel")
    mixtral = build(MIXTRAL_8X7B, "h100_sxm", 2, "fp8")
    assert mixtral.serve_args == ("--tensor-parallel-size", "2", "--quantization", "fp8")
    assert mixtral.expert_dtype == "fp8" and minimax.expert_dtype == "fp8_block"


def test_what_the_tables_or_vllm_do_not_cover_is_refused_in_one_line() -> None:
    cases = [
        # An fp8 checkpoint runs in fp8.
        (lambda: build(MINIMAX, "b200_sxm", 2, "bf16"), "`dtype` bf16: "),
        # A dense model has no experts to spread.
        (
            lambda: build("Qwen/Qwen3-32B", "h100_sxm", 2, expert_parallel=True),
            "`expert_parallel`: Qwen/Qwen3-32B has no experts",
        ),
        # Mixtral's 8 experts do not divide among 16 GPUs.
        (
            lambda: build(MIXTRAL_8X7B, "h100_sxm", 16, expert_parallel=True),
            "`tp` 16",
        ),
        # A split the tables never measured: they say which they did.
        (lambda: build(MINIMAX, "b200_sxm", 8, "fp8"), "tables time its fp8_block experts at"),
        # A GPU without MoE tables for this shape and dtype.
        (lambda: build(QWEN3_30B, "a100_sxm"), "`gpu` a100_sxm: its tables time no bf16 experts"),
    ]
    for call, words in cases:
        with pytest.raises(TunerError) as refused:
            call()
        assert words in str(refused.value) and "\n" not in str(refused.value), words


def test_the_dtype_defaults_to_the_checkpoints() -> None:
    spec = ProfileSpec(gpu="b200_sxm", tp=2, expert_parallel=True)
    p = spec.build(MINIMAX)
    assert p.dtype == "fp8" and p.expert_dtype == "fp8_block" and p.expert_parallel
    assert ProfileSpec(gpu="h100_sxm").build(QWEN3_30B).dtype == "bf16"
    with pytest.raises(TunerError, match="`expert_parallel`: only with `gpu`"):
        ProfileSpec(expert_parallel=True).check()


def test_tune_profile_builds_a_moe_profile_and_says_how(tmp_path: Path, tune) -> None:
    out = tmp_path / "minimax.yaml"
    code, printed, err = tune(
        "profile",
        "--model",
        MINIMAX,
        "--gpu",
        "b200_sxm",
        "--tp",
        "4",
        "--enable-expert-parallel",
        "-o",
        str(out),
    )
    assert code == 0, err
    assert "fused experts" in printed or "experts" in printed
    first = out.read_text().splitlines()[0]
    assert first == (
        f"# made by: tune profile --model {MINIMAX} --gpu b200_sxm --tp 4 "
        "--enable-expert-parallel -o FILE"
    )
    loaded = load_profile(str(out))
    assert isinstance(loaded, KernelProfile) and loaded.expert_parallel
    assert loaded.experts is not None
    assert loaded.step_seconds(prefill(2048)) == build(
        MINIMAX, "b200_sxm", 4, "fp8", expert_parallel=True
    ).step_seconds(prefill(2048))


def test_gpt_oss_alternates_window_and_full_attention_with_mxfp4_experts() -> None:
    small, large = load_model_shape("openai/gpt-oss-20b"), load_model_shape("openai/gpt-oss-120b")
    assert (small.parameters, large.parameters) == (20_908_050_240, 116_789_232_960)
    assert (large.window, large.window_layers, large.layers) == (128, 18, 36)
    assert large.checkpoint_dtype == "mxfp4" and large.attention_bias
    p = build_kernel_profile(large, "h100_sxm", 1, "bf16")
    assert p.expert_dtype == "mxfp4" and p.serve_args == ()  # the checkpoint is MXFP4 already
    # One 80 GB GPU holds it (MXFP4 experts: 4.25 bits a weight), as gpt-oss-120b is sold.
    assert 55 * 2**30 < p.memory.weight_bytes < 65 * 2**30
    # KV a token: the 18 full-attention layers' (vLLM keeps a window layer's last 128 only).
    assert p.kv_bytes_per_token == 2 * 18 * 8 * 64 * 2
    # A window layer's long prefill and long decode cost less than a full layer's.
    full = build_kernel_profile(
        large.model_copy(update={"window_layers": 0}), "h100_sxm", 1, "bf16"
    )
    assert p.step_seconds(prefill(16384)) < full.step_seconds(prefill(16384))
    assert p.step_seconds(decode(64, 32768)) < full.step_seconds(decode(64, 32768))
    assert p.step_seconds(prefill(64)) == pytest.approx(full.step_seconds(prefill(64)), rel=1e-9)
    assert any("sliding-window attention (18 of 36 layers" in n for n in p.provenance.extrapolated)
    with pytest.raises(TunerError, match="keeps all but its MXFP4 experts in bf16"):
        build_kernel_profile(large, "h100_sxm", 1, "fp8")


def test_tune_profile_list_names_the_gpus_with_expert_tables(tune) -> None:
    code, printed, _ = tune("profile", "--list")
    assert code == 0
    line = next(row for row in printed.splitlines() if row.startswith("mixture-of-experts"))
    assert "h100_sxm (bf16, fp8, fp8_block, mxfp4)" in line and "a100_sxm" not in line
    assert MINIMAX in printed and "openai/gpt-oss-120b" in printed
