"""What the server itself says about a replay: ``/metrics`` (Prometheus) before, during and
after, and the per-step lines of ``--enable-logging-iteration-details``.

The step lines become the same per-step records the simulator writes (``step``,
``duration_s``, ``prefill_tokens``, ``decode_tokens``, plus request counts and KV use), so the
two engines' timelines can be compared and the simulator's cost model fitted from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from prefill_tuner.engines.vllm_args import CONFIG_SECTIONS, is_secret
from prefill_tuner.files import atomic_text

ITERATION_RE = re.compile(
    r"^(?:(?P<at>\d{9,11}\.\d+) )?[^\n]*?"
    r"Iteration\((?P<step>\d+)\): (?P<ctx_reqs>\d+) context requests, (?P<ctx_tokens>\d+) "
    r"context tokens, (?P<gen_reqs>\d+) generation requests, (?P<gen_tokens>\d+) generation "
    r"tokens, iteration elapsed time: (?P<ms>[0-9.]+) ms(?:, \w+ KV cache usage: "
    r"(?P<kv>[0-9.]+)%)?",
    re.MULTILINE,
)
LOGGING_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "timed": {
            "format": "%(created).6f %(levelname)s %(asctime)s %(process)d "
            "[%(filename)s:%(lineno)d] %(message)s",
            "datefmt": "%m-%d %H:%M:%S",
        }
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "timed",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {"vllm": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
"""vLLM's log as it prints it by default, after the Unix time to the microsecond: the front
end logs every step's line as that step's output arrives, so consecutive lines time the
engine's full step cycle (vLLM's own "elapsed time" leaves out scheduling and output
processing). Given to the server as ``VLLM_LOGGING_CONFIG_PATH``."""
GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
COUNTERS = ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits")


def parse_iteration_log(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The server's per-step lines as step records (empty when the log has none), from byte
    ``offset`` on (a kept server's log holds every trial it served)."""
    steps = []
    try:
        with path.open("rb") as stream:
            stream.seek(offset)
            text = stream.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    for match in ITERATION_RE.finditer(text):
        logged_at = float(match["at"]) if match["at"] else None
        steps.append(
            {
                "step": int(match["step"]),
                "logged_at_s": logged_at,
                "duration_s": float(match["ms"]) / 1000.0,
                "prefill_tokens": int(match["ctx_tokens"]),
                "decode_tokens": int(match["gen_tokens"]),
                "prefill_requests": int(match["ctx_reqs"]),
                "decode_requests": int(match["gen_reqs"]),
                "kv_usage": float(match["kv"]) / 100.0 if match["kv"] else None,
            }
        )
    return steps


def logging_config_env(folder: Path) -> dict[str, str]:
    """The server environment that makes its log time every step (:data:`LOGGING_CONFIG`),
    written to ``folder/vllm-logging.json``."""
    path = folder / "vllm-logging.json"
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_text(path) as stream:
        stream.write(json.dumps(LOGGING_CONFIG, indent=1) + "\n")
    return {"VLLM_LOGGING_CONFIG_PATH": str(path.resolve())}


def step_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and step-time percentiles of a step trace."""
    if not steps:
        return {"steps": 0}
    durations = np.array([s["duration_s"] for s in steps])
    return {
        "steps": len(steps),
        "step_s_p50": float(np.percentile(durations, 50)),
        "step_s_p99": float(np.percentile(durations, 99)),
        "step_s_max": float(durations.max()),
        "prefill_tokens": int(sum(s["prefill_tokens"] for s in steps)),
        "decode_tokens": int(sum(s["decode_tokens"] for s in steps)),
        "max_tokens_in_a_step": int(max(s["prefill_tokens"] + s["decode_tokens"] for s in steps)),
    }


def parse_metrics(text: str) -> dict[str, Any]:
    """The vLLM gauges and counters we track, summed over engines, plus the cache config."""
    values: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.removeprefix("vllm:")
        if name in GAUGES or name in COUNTERS:
            values[name] = sum(
                sample.value for sample in family.samples if not sample.name.endswith("_created")
            )
        elif name == "cache_config_info" and family.samples:
            labels = family.samples[0].labels
            values["cache_config"] = {
                k: labels[k]
                for k in ("num_gpu_blocks", "block_size", "kv_cache_memory_bytes")
                if k in labels
            }
    return values


def server_config(server_info: dict[str, Any]) -> dict[str, Any]:
    """The recorded sections of a running server's config (``GET /server_info`` with
    ``VLLM_SERVER_DEV_MODE=1``): plain values only, secrets left out, as in the resolved
    config computed before the start (so the two compare key by key)."""
    config = server_info.get("vllm_config")
    if not isinstance(config, dict):
        return {}
    return {
        name: {
            key: value
            for key, value in section.items()
            if not is_secret(key) and (value is None or isinstance(value, str | int | float | bool))
        }
        for name in CONFIG_SECTIONS
        if isinstance(section := config.get(name), dict)
    }


def config_mismatches(resolved: dict[str, Any], served: dict[str, Any]) -> dict[str, list[Any]]:
    """Scheduler settings where the running server differs from the config resolved before it
    started (``{"max_num_seqs": [resolved, served]}``); empty when they agree."""
    before = resolved.get("scheduler_config", {})
    after = served.get("scheduler_config", {})
    return {
        key: [before[key], after[key]]
        for key in sorted(before.keys() & after.keys())
        if before[key] != after[key]
    }


@dataclass
class MetricsWatch:
    """Scrapes ``/metrics`` before, every ``interval_s`` during, and after a replay."""

    base_url: str
    interval_s: float = 1.0
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)
    scrapes: int = 0

    async def scrape(self, client: httpx.AsyncClient) -> dict[str, Any]:
        response = await client.get(f"{self.base_url}/metrics")
        values = parse_metrics(response.text)
        self.scrapes += 1
        for name in GAUGES:
            if name in values:
                self.peaks[name] = max(self.peaks.get(name, 0.0), float(values[name]))
        return values

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set (the replay's end)."""
        async with httpx.AsyncClient(timeout=5.0) as client:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):  # a missed scrape is not a failure
                    await self.scrape(client)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.interval_s)
                except asyncio.TimeoutError:
                    continue

    def summary(self) -> dict[str, Any]:
        """What changed during the replay, and the peaks seen."""
        result: dict[str, Any] = {"scrapes": self.scrapes}
        for name in COUNTERS:
            if name in self.before and name in self.after:
                result[name] = self.after[name] - self.before[name]
        result.update({f"peak_{name}": value for name, value in self.peaks.items()})
        cache_config = self.after.get("cache_config") or self.before.get("cache_config")
        if cache_config:
            result["cache_config"] = cache_config
        return result
