"""Measured-kernel step-time profiles (``kind: kernels``): built from the shipped tables for
any bundled model, GPU, tensor-parallel size and dtype, or refused in one line; exact at the
measured points; monotone; as fast-forwardable and as bounded below as the simulator needs; a
self-contained YAML; tables that regenerate byte for byte from AIConfigurator's."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefill_tuner.engines.sim import SimConfig, StepRecord, simulate
from prefill_tuner.engines.sim.cost_model import (
    ConstantProfile,
    StepShape,
    load_profile,
    shape_of,
)
from prefill_tuner.engines.sim.kernels import (
    KernelProfile,
    ModelShape,
    build_kernel_profile,
    bundled_models,
    known_gpus,
    load_model_shape,
)
from prefill_tuner.engines.sim.kernels.models import shape_from_config
from prefill_tuner.engines.sim.kernels.tables import DATA_DIR, gpu_tables
from prefill_tuner.errors import TunerError
from prefill_tuner.trace import ShapeOptions, load_trace
from tests.conftest import MOONCAKE, ROOT
from tests.support.sim_scenarios import LINEAR

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
QWEN3_32B = "Qwen/Qwen3-32B"
MISTRAL_7B = "mistralai/Mistral-7B-Instruct-v0.3"
MATRIX_MODELS = (LLAMA_8B, LLAMA_70B, QWEN3_32B, MISTRAL_7B)
GPUS = ("h100_sxm", "h200_sxm", "a100_sxm", "b200_sxm", "l40s")


def profile(
    model: str = LLAMA_8B, gpu: str = "h100_sxm", tp: int = 1, dtype: str = "bf16", **kw
) -> KernelProfile:
    return build_kernel_profile(load_model_shape(model), gpu, tp, dtype, **kw)  # type: ignore[arg-type]


def step(chunks: list[tuple[int, int]] = (), decodes: list[int] = ()) -> StepShape:  # type: ignore[assignment]
    """A step of prefill chunks ``(prior, tokens)`` and decodes at the given context lengths
    (the tokens already computed, the new one not counted)."""
    items = [(before, tokens, False) for before, tokens in chunks]
    items += [(context, 1, True) for context in decodes]
    return shape_of(items, len(items))


def device(p: KernelProfile, shape: StepShape) -> float:
    return p.step_seconds(shape) - p.host_seconds(shape.requests)


# --- model shapes ------------------------------------------------------------------------


def test_the_bundled_models_have_their_published_shapes() -> None:
    assert set(MATRIX_MODELS) <= set(bundled_models())
    published = {  # parameters of the published checkpoints
        LLAMA_8B: 8_030_261_248,
        LLAMA_70B: 70_553_706_496,
        QWEN3_32B: 32_762_123_264,
        MISTRAL_7B: 7_248_023_552,
        "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
        "Qwen/Qwen3-8B": 8_190_735_360,
    }
    for name, parameters in published.items():
        assert load_model_shape(name).parameters == parameters, name
    qwen = load_model_shape(QWEN3_32B)
    assert (qwen.heads, qwen.kv_heads, qwen.head_dim, qwen.hidden) == (64, 8, 128, 5120)
    assert qwen.qk_norm and qwen.max_position_embeddings == 40960


def test_a_config_json_or_its_folder_is_read(tmp_path: Path) -> None:
    config = json.loads((DATA_DIR.parent / "models" / "Qwen--Qwen3-8B.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    by_folder = load_model_shape(tmp_path)
    by_file = load_model_shape(str(tmp_path / "config.json"))
    assert (
        by_folder.parameters == by_file.parameters == load_model_shape("Qwen/Qwen3-8B").parameters
    )
    # Multi-head attention (no num_key_value_heads) and a derived head_dim.
    mha = {**config, "num_key_value_heads": None, "head_dim": None}
    mha = {k: v for k, v in mha.items() if v is not None}
    shape = shape_from_config(mha, "mha")
    assert shape.kv_heads == shape.heads == 32 and shape.head_dim == 128


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_type": "olmoe", "num_experts": 64}, "model_type 'olmoe'"),
        ({"model_type": "mixtral", "num_local_experts": 8}, "num_experts_per_tok"),
        (
            {
                "model_type": "qwen3_moe",
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "decoder_sparse_step": 2,
            },
            "dense layers among the expert layers",
        ),
        ({"model_type": "mistral", "quantization_config": {"quant_method": "awq"}}, "awq"),
        ({"model_type": "deepseek_v3", "kv_lora_rank": 512, "n_routed_experts": 256}, "latent"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding-window"),
        ({"model_type": "gemma2"}, "model_type 'gemma2'"),
        ({"model_type": "llama", "hidden_size": 4096}, "num_attention_heads"),
        ({"model_type": "llava", "text_config": {}}, "multimodal"),
    ],
)
def test_models_it_cannot_model_are_refused_in_one_line(config: dict, words: str) -> None:
    base = json.loads(
        (DATA_DIR.parent / "models" / "mistralai--Mistral-7B-Instruct-v0.3.json").read_text()
    )
    if config.get("model_type") == "llama":
        base = {}
    with pytest.raises(TunerError) as refused:
        shape_from_config({**base, **config}, "m")
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_unreadable_configs_and_unknown_names_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TunerError, match="cannot read the model config"):
        load_model_shape(tmp_path)
    with pytest.raises(TunerError, match=r"a folder without a config\.json"):
        load_model_shape(tmp_path / ".." / tmp_path.name / "..")
    with pytest.raises(TunerError, match="no bundled model of that name") as refused:
        load_model_shape("acme/Nonexistent-7B")
    assert LLAMA_8B in str(refused.value)


# --- building: the matrix ----------------------------------------------------------------


def test_every_gpu_model_tp_and_dtype_builds_or_is_refused_in_one_line() -> None:
    built, refused = {}, {}
    started = time.perf_counter()
    for gpu in GPUS:
        for model in MATRIX_MODELS:
            for tp in (1, 2, 4, 8):
                for dtype in ("bf16", "fp8"):
                    key = (gpu, model, tp, dtype)
                    try:
                        built[key] = profile(model, gpu, tp, dtype)
                    except TunerError as exc:
                        refused[key] = str(exc)
    elapsed = time.perf_counter() - started
    assert elapsed < 60  # 160 builds; each well under a second
    assert all("\n" not in why for why in refused.values())
    # fp8 on A100: refused, never invented.
    for key, why in refused.items():
        if key[0] == "a100_sxm" and key[3] == "fp8":
            assert why.startswith("`dtype` fp8: the a100_sxm tables have no fp8 GEMMs")
    assert not [k for k in built if k[0] == "a100_sxm" and k[3] == "fp8"]
    # 70B does not fit one 80 GB GPU: refused with the numbers, as vLLM refuses to start.
    why = refused[("h100_sxm", LLAMA_70B, 1, "bf16")]
    assert "131.4 GiB of weights" in why and "131,072-token" in why and "vLLM refuses" in why
    assert ("h100_sxm", LLAMA_70B, 4, "bf16") in built
    for key, p in built.items():
        config = SimConfig.model_validate(p.engine_defaults)  # vLLM would accept it
        assert config.usable_blocks * config.block_size >= config.max_model_len, key
        assert p.provenance.kind == "measured-kernels"
        assert p.step_seconds(step(decodes=[1000])) > 0
    assert len(built) >= 100


def test_refusals_name_the_field() -> None:
    llama = load_model_shape(LLAMA_8B)
    cases = [
        (
            dict(gpu="h100_sxm", tp=16),
            "`tp` 16: the h100_sxm tables measure all-reduce up to 8 GPUs",
        ),
        (dict(gpu="h100_sxm", tp=3), "`tp` 3: the h100_sxm tables measure all-reduce at 2, 4, 8"),
        (dict(gpu="tpu_v5", tp=1), "`gpu` 'tpu_v5': no measured kernel tables"),
        (dict(gpu="a100_sxm", tp=1, kv_cache_dtype="fp8"), "`kv_cache_dtype` fp8: the a100_sxm"),
        (dict(gpu="h100_sxm", tp=1, kv_cache_dtype="int4"), "`kv_cache_dtype` 'int4'"),
        (dict(gpu="h100_sxm", tp=1, max_model_len=200_000), "`max_model_len` 200000: beyond"),
    ]
    for options, message in cases:
        with pytest.raises(TunerError) as refused:
            build_kernel_profile(llama, dtype="bf16", **options)  # type: ignore[arg-type]
        assert str(refused.value).startswith(message), str(refused.value)
        assert "--" not in str(refused.value)  # values, not command-line flags
    odd = llama.model_copy(update={"head_dim": 96})
    with pytest.raises(TunerError, match="head_dim 96: the h100_sxm context attention tables"):
        build_kernel_profile(odd, "h100_sxm", 1, "bf16")
    qwen = load_model_shape("Qwen/Qwen2.5-7B-Instruct")
    with pytest.raises(TunerError, match="28 attention heads are not divisible"):
        build_kernel_profile(qwen, "h100_sxm", 8, "bf16")
    # A shorter context makes a model fit that does not at its full context.
    big = load_model_shape(LLAMA_70B)
    with pytest.raises(TunerError, match="vLLM refuses to start"):
        build_kernel_profile(big, "b200_sxm", 1, "bf16")
    fits = build_kernel_profile(big, "b200_sxm", 1, "bf16", max_model_len=32768)
    assert fits.engine_defaults["max_model_len"] == 32768


def test_engine_defaults_are_what_vllm_resolves_on_the_gpu() -> None:
    expected = {  # vLLM's batch defaults for `vllm serve` by GPU memory (EngineArgs)
        "h100_sxm": (8192, 1024),
        "h200_sxm": (8192, 1024),
        "b200_sxm": (16384, 1024),
        "a100_sxm": (2048, 256),
        "l40s": (2048, 256),
    }
    for gpu, (batched, seqs) in expected.items():
        p = profile(MISTRAL_7B, gpu)
        defaults = p.engine_defaults
        assert (defaults["max_num_batched_tokens"], defaults["max_num_seqs"]) == (batched, seqs)
        assert defaults["block_size"] == 16 and defaults["async_scheduling"] is True
        assert defaults["max_model_len"] == 32768
        # The pool: what is left after weights and the activation reserve, in 16-token blocks
        # of 2 × layers × KV heads × head_dim × 2 bytes.
        assert p.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
        memory = p.memory
        left = memory.capacity_bytes * memory.gpu_memory_utilization
        left -= memory.weight_bytes + memory.activation_reserve_bytes
        assert memory.kv_cache_bytes == int(left)
        assert defaults["num_gpu_blocks"] == memory.kv_cache_bytes // (16 * p.kv_bytes_per_token)
    # KV heads are replicated, not split, past their count; fp8 halves the KV bytes.
    assert profile(LLAMA_8B, tp=8).kv_bytes_per_token == 2 * 32 * 1 * 128 * 2
    assert profile(LLAMA_8B, kv_cache_dtype="fp8").kv_bytes_per_token == 2 * 32 * 8 * 128
    # Llama-3.1-8B bf16 on one H100: 14.96 GiB of weights, as vLLM reports loading it.
    assert round(profile().memory.weight_bytes / 2**30, 2) == 14.96


# --- exactness and provenance ------------------------------------------------------------


def test_measured_points_are_reproduced_exactly() -> None:
    p = profile()
    tables = gpu_tables("h100_sxm")
    n_axis, k_axis = list(tables["gemm.bf16.n"]), list(tables["gemm.bf16.k"])
    grid = tables["gemm.bf16.ms"]
    for name in ("qkv", "o"):  # measured shapes: (6144, 4096) and (4096, 4096)
        curve = p.gemms[name]
        measured = grid[n_axis.index(curve.n), k_axis.index(curve.k)]
        assert list(curve.ms) == measured.tolist()
        for m, ms in zip(p.gemm_tokens, measured, strict=True):
            assert p.gemm_ms(name, m) == ms
    keys = tables["ctx.bf16.keys"].tolist()
    assert list(p.context_attention.ms) == tables["ctx.bf16.ms"][keys.index([32, 8, 128])].tolist()
    gen = tables["gen.bf16.ms"][tables["gen.bf16.keys"].tolist().index([32, 8, 128])]
    measured_cells = ~np.isnan(gen)
    assert np.array(p.decode_attention.ms)[measured_cells].tolist() == gen[measured_cells].tolist()


def test_what_was_interpolated_or_extrapolated_is_said() -> None:
    p = profile()
    provenance = p.provenance
    assert any(
        "gate_up (N 28,672" in line and "between" in line for line in provenance.interpolated
    )
    assert any("down (N 4,096, K 14,336)" in line for line in provenance.interpolated)
    assert any("lm_head (N 128,256" in line for line in provenance.extrapolated)
    assert provenance.source_commit == "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
    assert provenance.tables == {"gemm": "vLLM 0.24.0", "attention": "vLLM 0.24.0"}
    assert provenance.kernel_sources["gemm"] == "torch.nn.functional.linear"
    assert provenance.kernel_sources["context attention"] == "vllm_flash_attn_fa3"
    assert profile(dtype="fp8").provenance.kernel_sources["gemm"] == (
        "CutlassFP8ScaledMMLinearKernel"
    )
    summary = provenance.summary()
    assert "\n" not in summary and summary.startswith("measured kernels (vLLM 0.24.0 tables")
    assert "2 shapes interpolated" in summary and "time outside kernels estimated" in summary
    qwen = profile("Qwen/Qwen2.5-7B-Instruct")  # 28 query heads: between 24 and 32
    assert any("28 query heads per GPU between the measured 24 and 32" in line
               for line in qwen.provenance.interpolated)  # fmt: skip
    assert (
        profile(gpu="a100_sxm")
        .provenance.tables["gemm"]
        .startswith("vLLM 0.22.0 (rows measured with vLLM 0.14.0")
    )


# --- behaviour the simulator relies on ---------------------------------------------------


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "dtype"),
    [
        (LLAMA_8B, "h100_sxm", 1, "bf16"),
        (QWEN3_32B, "b200_sxm", 2, "fp8"),
        (MISTRAL_7B, "l40s", 2, "bf16"),
    ],
)
def test_more_work_is_never_faster(model: str, gpu: str, tp: int, dtype: str) -> None:
    p = profile(model, gpu, tp, dtype)
    for prior in (0, 3000, 50_000):
        times = [
            p.step_seconds(step([(prior, n)])) for n in [*range(1, 600), *range(600, 40_000, 61)]
        ]
        assert times == sorted(times)
    for context in (10, 2000, 100_000):
        times = [p.step_seconds(step(decodes=[context] * b)) for b in range(1, 3000, 7)]
        assert times == sorted(times)
    times = [p.step_seconds(step(decodes=[c] * 64)) for c in range(1, 300_000, 997)]
    assert times == sorted(times)
    mixed = [p.step_seconds(step([(0, n)], [2048] * 64)) for n in range(1, 9000, 13)]
    assert mixed == sorted(mixed)


def test_two_gpus_prefill_faster_than_one() -> None:
    for gpu in GPUS:
        for model in (LLAMA_8B, MISTRAL_7B):
            one, two = profile(model, gpu, 1), profile(model, gpu, 2)
            for tokens in (2048, 8192):
                shape = step([(0, tokens)])
                assert device(two, shape) < device(one, shape), (gpu, model, tokens)


def test_decode_runs_are_the_step_times_bit_for_bit() -> None:
    rng = random.Random(7)
    for p in (profile(), profile(QWEN3_32B, "b200_sxm", 4, "fp8"), profile(gpu="a100_sxm", tp=2)):
        for _ in range(400):
            requests = rng.choice([1, 2, 3, 7, 64, 255, 1000, 2048, 2500])
            first = requests * rng.choice([2, 30, 1500, 70_000, 140_000]) + rng.randrange(requests)
            count = rng.randrange(1, 60)
            run = p.decode_run_seconds(requests, first, count)
            singles = [
                p.step_seconds(
                    StepShape(
                        decode_tokens=requests,
                        requests=requests,
                        decode_context_tokens=first + requests * k,
                    )
                )
                for k in range(count)
            ]
            assert run.tolist() == singles
            assert p.decode_steps_seconds(requests, first, count) == singles


def test_chunk_runs_are_the_step_times_bit_for_bit() -> None:
    """A fast-forwarded run of decodes beside prefill chunks is timed on arrays: each step's
    float is :meth:`step_seconds`' for that step's shape, on every profile kind, for contexts
    inside, below and beyond the measured points."""
    rng = random.Random(13)
    kinds = (
        profile(),
        profile(QWEN3_32B, "b200_sxm", 4, "fp8"),
        profile(gpu="a100_sxm", tp=2),
        LINEAR,
        ConstantProfile(step_ms=7.0),
    )
    for p in kinds:
        for _ in range(300):
            decodes = rng.choice([0, 1, 3, 64, 700])
            context = decodes * rng.choice([2, 30, 1500, 70_000]) + rng.randrange(decodes + 1)
            chunks = [
                (rng.choice([0, 5, 900, 60_000, 200_000]), rng.choice([1, 16, 64, 257, 2048]))
                for _ in range(rng.randint(1, 3))
            ]
            count = rng.randrange(1, 50)
            run = p.chunk_run_seconds(decodes, decodes + len(chunks), context, chunks, count)
            singles = [
                p.step_seconds(
                    StepShape(
                        **shape_fields(
                            [(before + tokens * k, tokens) for before, tokens in chunks],
                            decodes + len(chunks),
                        ),
                        decode_tokens=decodes,
                        decode_context_tokens=context + decodes * k,
                    )
                )
                for k in range(count)
            ]
            assert run.tolist() == singles, (p.name, decodes, context, chunks)
            scalar = p.chunk_steps_seconds(decodes, decodes + len(chunks), context, chunks, count)
            assert scalar == singles, (p.name, decodes, context, chunks)


def shape_fields(chunks: list[tuple[int, int]], requests: int) -> dict[str, Any]:
    """The prefill half of a step's shape, as :func:`shape_of` makes it."""
    shape = shape_of([(before, tokens, False) for before, tokens in chunks], requests)
    return {
        "prefill_tokens": shape.prefill_tokens,
        "requests": requests,
        "prefill_context_tokens": shape.prefill_context_tokens,
        "prefill_attention_pairs": shape.prefill_attention_pairs,
        "prefill_chunks": shape.prefill_chunks,
    }


def test_prefill_work_is_a_lower_bound_over_any_chunking() -> None:
    rng = random.Random(11)
    for p in (profile(), profile(LLAMA_70B, "h200_sxm", 4, "fp8"), profile(gpu="l40s", tp=2)):
        for _ in range(200):
            prompts = [
                rng.choice([1, 7, 300, 2048, 9000, 40_000]) for _ in range(rng.randint(1, 4))
            ]
            done = [0] * len(prompts)
            spent = 0.0
            while any(d < n for d, n in zip(done, prompts, strict=True)):
                chunks = []
                budget = rng.choice([16, 512, 2048, 8192, 32768])
                for i, n in enumerate(prompts):
                    if done[i] < n and budget > 0:
                        take = min(n - done[i], rng.randint(1, budget))
                        chunks.append((done[i], take))
                        done[i] += take
                        budget -= take
                decodes = [rng.randint(1, 50_000) for _ in range(rng.choice([0, 0, 5, 100]))]
                spent += device(p, step(chunks, decodes))
            work = sum(p.prefill_work_seconds(n, n * (n + 1) // 2) for n in prompts)
            assert 0 < work <= spent
        # Each prompt alone in one step: the bound is also below that.
        for n in (1, 100, 8192, 100_000):
            assert p.prefill_work_seconds(n, n * (n + 1) // 2) <= device(p, step([(0, n)]))


def test_a_shape_without_chunks_is_one_chunk() -> None:
    p = profile()
    by_hand = StepShape(
        prefill_tokens=500,
        requests=1,
        prefill_context_tokens=1500,
        prefill_attention_pairs=500 * 1000 + 500 * 501 // 2,
    )
    assert p.step_seconds(by_hand) == p.step_seconds(step([(1000, 500)]))


def test_the_yaml_round_trips_to_the_same_profile(tmp_path: Path) -> None:
    for p in (profile(), profile(QWEN3_32B, "h200_sxm", 2, "fp8", kv_cache_dtype="fp8")):
        p.step_seconds(step(decodes=[5]))  # derived curves computed: still equal
        path = tmp_path / f"{p.name}.yaml"
        path.write_text(p.yaml_text())
        assert path.stat().st_size < 100_000
        loaded = load_profile(str(path))
        assert isinstance(loaded, KernelProfile) and loaded == p
        for shape in (step(decodes=[3000] * 9), step([(100, 4000)], [10] * 3)):
            assert loaded.step_seconds(shape) == p.step_seconds(shape)
        assert loaded.prefill_work_seconds(9, 45) == p.prefill_work_seconds(9, 45)


def test_the_simulator_runs_on_a_kernel_profile_and_fast_forwards_exactly() -> None:
    p = profile()
    trace = load_trace(
        str(MOONCAKE), options=ShapeOptions(rate_scale=0.1, max_model_len=32768, max_requests=80)
    )
    for async_scheduling in (True, False):
        config = SimConfig(
            **{**p.engine_defaults, "max_model_len": 32768, "async_scheduling": async_scheduling}
        )
        runs = []
        for fast in (True, False):
            steps: list[StepRecord] = []
            result = simulate(trace, config, p, on_step=steps.append, fast_forward=fast)
            runs.append((result, steps))
        (fast_result, fast_steps), (slow_result, slow_steps) = runs
        assert fast_steps == slow_steps and fast_result.metrics == slow_result.metrics
        assert len(fast_steps) > 100


def test_the_h100_reference_steps() -> None:
    """Llama-3.1-8B bf16 on one H100: the issue's reference points (AIConfigurator's vLLM 0.24
    tables summed per step give ~43 ms for a 2,048-token chunk and ~199 ms for 8,192; a lone
    decode about as the old estimate's 7.5 ms). Ours add the LM head, sampling and the
    estimated time outside kernels (1.5 ms)."""
    p = profile()
    lone = p.step_seconds(step(decodes=[1024])) * 1e3
    chunk_2k = p.step_seconds(step([(0, 2048)])) * 1e3
    chunk_8k = p.step_seconds(step([(0, 8192)])) * 1e3
    mixed = p.step_seconds(step([(0, 512)], [2048] * 64)) * 1e3
    assert 6.5 < lone < 9
    assert 40 < chunk_2k < 50
    assert 185 < chunk_8k < 215
    assert lone < mixed < chunk_2k


# --- the tables ------------------------------------------------------------------------


def test_the_shipped_tables_are_small_and_say_where_they_come_from() -> None:
    files = sorted(DATA_DIR.iterdir())
    assert sum(path.stat().st_size for path in files) < 10_000_000
    names = {path.name for path in files}
    assert {"LICENSE", "NOTICE.md", "index.json"} <= names
    assert {f"{gpu}.npz" for gpu in GPUS} <= names and set(known_gpus()) == set(GPUS)
    assert "Apache License" in (DATA_DIR / "LICENSE").read_text()
    notice = (DATA_DIR / "NOTICE.md").read_text()
    assert "095f58a51c4ca8e61b66ec108d86f223f8d559ce" in notice and "aic-core/src" in notice


def test_the_runtime_needs_neither_pandas_nor_pyarrow() -> None:
    code = (
        "import sys\n"
        "from prefill_tuner.engines.sim.kernels import build_kernel_profile, load_model_shape\n"
        "build_kernel_profile(load_model_shape('Qwen/Qwen3-8B'), 'b200_sxm', 2, 'fp8')\n"
        "print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _source_folder() -> Path | None:
    given = os.environ.get("AICONFIGURATOR_PERF_DIR")
    candidates = [Path(given)] if given else []
    candidates.append(ROOT.parent / "shared" / "aiconfigurator-vllm-perf")
    return next((path for path in candidates if (path / "data").is_dir()), None)


def test_the_shipped_tables_regenerate_byte_for_byte(tmp_path: Path) -> None:
    for module in ("pandas", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed here: scripts/build-kernel-tables needs it")
    source = _source_folder()
    if source is None:
        pytest.skip(
            "no copy of AIConfigurator's tables (shared/aiconfigurator-vllm-perf beside the "
            "checkout, or AICONFIGURATOR_PERF_DIR)"
        )
    loader = importlib.machinery.SourceFileLoader(
        "build_kernel_tables", str(ROOT / "scripts" / "build-kernel-tables")
    )
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    script = importlib.util.module_from_spec(spec)
    loader.exec_module(script)
    assert script.main([str(source), "--out", str(tmp_path)]) == 0
    shipped = {path.name: path.read_bytes() for path in DATA_DIR.iterdir()}
    rebuilt = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    assert rebuilt.keys() == shipped.keys()
    for name, data in shipped.items():
        assert rebuilt[name] == data, name


def test_a_model_shape_is_plain_data() -> None:
    shape = load_model_shape(LLAMA_8B)
    assert ModelShape.model_validate(shape.model_dump()) == shape
    assert (shape.q_size, shape.kv_size) == (4096, 1024)


def test_a_decode_shape_the_tables_measure_only_at_large_batches_is_refused() -> None:
    """L40S measured 48 query heads over one fp8 KV head only from batch 1,024: smaller
    batches are not guessed (found by benchmarks/kernel_profiles.py: it was a traceback)."""
    config = {
        "model_type": "llama",
        "hidden_size": 6144,
        "num_attention_heads": 48,
        "num_key_value_heads": 1,
        "num_hidden_layers": 4,
        "intermediate_size": 16384,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
    }
    with pytest.raises(TunerError, match=r"^`kv_cache_dtype` fp8: .* only from batch 1,024$"):
        build_kernel_profile(shape_from_config(config, "x"), "l40s", 1, "bf16", "fp8")
