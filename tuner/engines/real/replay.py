"""Replaying a trace against a running server as streaming completions, at the trace's times.

Each request is sent when its (scaled) arrival time comes, to ``/v1/completions`` with a prompt
of exactly its token count as token ids (no tokenizer needed; requests sharing prefix-block ids
share their leading tokens, see :mod:`tuner.trace.tokens`), ``max_tokens`` set to its output
length, ``ignore_eos`` and a streamed usage report. Every token's arrival time is recorded.
The client measures its own lateness (how far behind schedule each request went out), so a
saturated client is never mistaken for a slow server. Requests that fail, time out, or are
still running when the replay ends are kept, with their reason: they count against the SLOs.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx
import numpy as np

from objectives.metrics import RequestRecord
from tuner.trace.model import Request, Trace
from tuner.trace.tokens import prompt_token_ids

LATE_WARNING_S = 0.05
"""A replay whose p99 lateness exceeds this is reported as client-bound."""


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay."""

    model: str
    """The model name the server serves (its ``--model``)."""
    token_low: int = 16
    token_high: int = 4096
    """Prompt token ids are drawn from ``[token_low, token_high)``: below the vocabulary size
    and clear of special ids."""
    seed: int = 0
    max_concurrency: int = 512
    """Most requests in flight; more wait (and show up as lateness)."""
    request_timeout_s: float = 600.0
    """A request that has not finished after this long is abandoned (and counted)."""
    drain_timeout_s: float = 600.0
    """After the last send, how long to wait for the rest before giving up on them."""


@dataclass
class ReplayResult:
    records: list[RequestRecord]
    lateness_s: np.ndarray
    """How far behind its scheduled time each request was sent."""
    wall_s: float

    @property
    def client_bound(self) -> bool:
        return bool(self.lateness_s.size) and float(np.percentile(self.lateness_s, 99)) > (
            LATE_WARNING_S
        )


async def replay(base_url: str, trace: Trace, options: ReplayOptions) -> ReplayResult:
    """Replay ``trace`` against the server at ``base_url``."""
    limits = httpx.Limits(
        max_connections=options.max_concurrency, max_keepalive_connections=options.max_concurrency
    )
    timeout = httpx.Timeout(options.request_timeout_s, connect=30.0)
    semaphore = asyncio.Semaphore(options.max_concurrency)
    prompts = [
        prompt_token_ids(r, low=options.token_low, high=options.token_high, seed=options.seed)
        for r in trace.requests
    ]
    lateness = np.zeros(len(trace.requests))
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        started = time.monotonic()

        async def one(index: int, request: Request) -> RequestRecord:
            delay = started + request.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the trace's schedule itself
            async with semaphore:
                sent = time.monotonic()
                lateness[index] = sent - started - request.arrival_s
                return await _send(
                    client, request, prompts[index], options, sent - started, started
                )

        tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(trace.requests)]
        last_arrival = trace.requests[-1].arrival_s if trace.requests else 0.0
        done, pending = await asyncio.wait(tasks, timeout=last_arrival + options.drain_timeout_s)
        for task in pending:
            task.cancel()
        records = []
        for index, (task, request) in enumerate(zip(tasks, trace.requests, strict=True)):
            if task in done and not task.cancelled() and task.exception() is None:
                records.append(task.result())
            else:
                records.append(
                    RequestRecord(
                        id=request.id,
                        sent_s=request.arrival_s + float(lateness[index]),
                        token_times_s=[],
                        expected_tokens=request.output_tokens,
                        error="unfinished when the replay ended",
                    )
                )
        wall = time.monotonic() - started
    return ReplayResult(records=records, lateness_s=lateness, wall_s=wall)


async def _send(
    client: httpx.AsyncClient,
    request: Request,
    prompt: list[int],
    options: ReplayOptions,
    sent_s: float,
    started: float,
) -> RequestRecord:
    body = {
        "model": options.model,
        "prompt": prompt,
        "max_tokens": request.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    times: list[float] = []
    error: str | None = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                error = f"HTTP {response.status_code}: {_message(text)}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    now = time.monotonic() - started
                    choices = json.loads(line[6:]).get("choices") or []
                    if choices:
                        ids = choices[0].get("token_ids")
                        times.extend([now] * (len(ids) if ids else 1))
    except httpx.TimeoutException:
        error = f"timed out after {options.request_timeout_s:g} s"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    if error is None and len(times) != request.output_tokens:
        error = f"{len(times)} of {request.output_tokens} tokens streamed"
    return RequestRecord(
        id=request.id,
        sent_s=sent_s,
        token_times_s=times,
        expected_tokens=request.output_tokens,
        error=error,
    )


def _message(text: str) -> str:
    try:
        payload = json.loads(text)
        message = payload.get("message") or payload.get("error", {}).get("message") or text
    except (ValueError, AttributeError):
        message = text
    return str(message).strip().splitlines()[0][:300] if str(message).strip() else "(empty)"
