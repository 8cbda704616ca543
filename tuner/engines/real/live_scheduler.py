"""A vLLM scheduler that takes new values of the knobs vLLM reads every step, so a real study
changes them on a running server instead of starting a new one (issue 45).

This file runs inside the vLLM server (``--scheduler-cls prefill_tuner_live.LiveScheduler``,
copied beside nothing else onto the server's ``PYTHONPATH`` by
:mod:`prefill_tuner.engines.real.live`): it imports only vLLM and the standard library, never
the tuner. It is vLLM's own scheduler (``Scheduler``, or ``AsyncScheduler`` where the engine
schedules asynchronously) with one addition: before each ``schedule()``, if the settings file
named by ``$PREFILL_TUNER_LIVE_SETTINGS`` changed, it sets the values it holds on itself, reads
them back, and writes what it now runs with beside the file (``.ack``). The tuner writes the
file only while the server is idle, then sends one request to make the scheduler look, and
waits for the acknowledgement of that generation.

What each knob sets is what vLLM's scheduler reads it from on every step (vLLM 0.32/0.33:
``vllm/v1/core/sched/scheduler.py``): nothing sized at start-up (the runner, the KV pool, the
CUDA graphs, the compiled graph's hash) depends on any of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

SETTINGS_ENV = "PREFILL_TUNER_LIVE_SETTINGS"
ACK_SUFFIX = ".ack"


def _active_seqs(scheduler: Any, value: Any) -> Any:
    slots = scheduler.max_num_running_reqs
    scheduler.max_num_active_reqs = slots if value is None else min(int(value), slots)
    scheduler.scheduler_config.max_num_active_seqs = value
    return None if scheduler.max_num_active_reqs == slots else scheduler.max_num_active_reqs


def _threshold(scheduler: Any, value: Any) -> Any:
    scheduler.scheduler_config.long_prefill_token_threshold = int(value)
    return scheduler.scheduler_config.long_prefill_token_threshold


def _reserve_full_isl(scheduler: Any, value: Any) -> Any:
    scheduler.scheduler_reserve_full_isl = bool(value)
    scheduler.scheduler_config.scheduler_reserve_full_isl = bool(value)
    return scheduler.scheduler_reserve_full_isl


def _watermark(scheduler: Any, value: Any) -> Any:
    share = float(value)
    scheduler.kv_cache_manager.watermark_blocks = int(share * scheduler.kv_cache_config.num_blocks)
    scheduler.scheduler_config.watermark = share
    return share


def _prefill_interval(scheduler: Any, value: Any) -> Any:
    interval = int(value)
    scheduler.scheduler_config.prefill_schedule_interval = interval
    if hasattr(scheduler, "local_prefill_interval"):  # 0.33: the cadence on one engine
        if scheduler.parallel_config.data_parallel_size == 1:
            scheduler.local_prefill_interval = interval
        # As at start-up: a full interval back, so the next step is never held.
        held = scheduler.local_prefill_interval
        scheduler.last_prefill_step = scheduler.num_executed_steps - held
    return interval


SETTERS: dict[str, Callable[[Any, Any], Any]] = {
    "max_num_active_seqs": _active_seqs,
    "long_prefill_token_threshold": _threshold,
    "scheduler_reserve_full_isl": _reserve_full_isl,
    "watermark": _watermark,
    "prefill_schedule_interval": _prefill_interval,
}
"""Each knob a running server takes, and how: the tuner's knobs with ``restart=False``
(``tests/test_live_scheduler.py`` checks the two lists are the same)."""


class _Live:
    """The addition to vLLM's scheduler (a mixin: first in the bases)."""

    _live_seen: tuple[int, int, int] | None = None

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._take_new_settings()
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def _take_new_settings(self) -> None:
        path = os.environ.get(SETTINGS_ENV)
        if not path:
            return
        try:
            stat = os.stat(path)
        except OSError:
            return
        seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if seen == self._live_seen:
            return
        self._live_seen = seen
        with open(path, encoding="utf-8") as stream:
            data = json.load(stream)
        applied: dict[str, Any] = {}
        refused: dict[str, str] = {}
        for name, value in data.get("settings", {}).items():
            setter = SETTERS.get(name)
            if setter is None:
                refused[name] = "not a knob a running server takes"
                continue
            try:
                applied[name] = setter(self, value)
            except (AttributeError, TypeError, ValueError) as exc:
                refused[name] = f"{type(exc).__name__}: {exc}"
        ack = path + ACK_SUFFIX
        with open(ack + ".tmp", "w", encoding="utf-8") as stream:
            json.dump(
                {"generation": data.get("generation"), "applied": applied, "refused": refused},
                stream,
            )
        os.replace(ack + ".tmp", ack)


class LiveScheduler(_Live, Scheduler):
    """vLLM's synchronous scheduler, taking new per-step settings between replays."""


class LiveAsyncScheduler(_Live, AsyncScheduler):
    """vLLM's asynchronous scheduler (its GPU default), the same."""
