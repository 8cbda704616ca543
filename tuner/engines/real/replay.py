"""Replaying a trace against a running server as streaming completions, at the trace's times.

Each request is sent when its (scaled) arrival time comes, to ``/v1/completions`` with a prompt
of exactly its token count as token ids (no tokenizer needed; requests sharing prefix-block ids
share their leading tokens, see :mod:`prefill_tuner.trace.tokens`), ``max_tokens`` set to its output
length, ``ignore_eos`` and a streamed usage report. Every token's arrival time is recorded.
The client measures its own lateness (how far behind schedule each request went out), so a
saturated client is never mistaken for a slow server. Requests that fail, time out, or are
still running when the replay ends are kept, with their reason: they count against the SLOs.

With a client limit (``max_concurrency``, as ``vllm bench serve --max-concurrency``) the load
is closed-loop: at most N requests are in flight; a request whose time has come waits for a
free slot, in arrival order (:class:`ClientLimit`), and is timed from its actual send.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from prefill_tuner.objectives.early_abort import Snapshot
from prefill_tuner.objectives.metrics import RequestRecord
from prefill_tuner.trace.model import Request, Trace
from prefill_tuner.trace.tokens import prompt_token_ids

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
    max_concurrency: int | None = None
    """The benchmark's client limit: at most this many requests in flight, a request whose
    time has come waiting for a free slot (in arrival order; its wait is not lateness).
    ``None``: open loop, each request sent at its time (up to :attr:`connections` at once)."""
    connections: int = 512
    """Most requests in flight in an open-loop replay; more wait (and show up as lateness)."""
    request_timeout_s: float = 600.0
    """A request that has not finished after this long is abandoned (and counted)."""
    drain_timeout_s: float = 600.0
    """After the last send (an open-loop replay: the last arrival), how long to wait for the
    rest before giving up on them."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer KEY`` (a server started with ``--api-key``)."""


class ReplayState:
    """What a replay has seen so far, request by request; watchers running beside the replay
    read it (:meth:`snapshot`, :meth:`stalled_s`) and may :meth:`stop` it."""

    def __init__(self, trace: Trace) -> None:
        count = len(trace.requests)
        self.started = time.monotonic()
        self.sent_s = np.full(count, np.nan)
        self.first_token_s = np.full(count, np.nan)
        self.last_token_s = np.full(count, np.nan)
        self.tokens = np.zeros(count, dtype=np.int64)
        self.expected = np.array([r.output_tokens for r in trace.requests], dtype=np.int64)
        classes = [r.traffic_class for r in trace.requests]
        self.traffic_class = (
            np.array(classes, dtype=object) if any(c is not None for c in classes) else None
        )
        self.failed = np.zeros(count, dtype=bool)
        self.finished = np.zeros(count, dtype=bool)
        self.token_times: list[list[float]] = [[] for _ in range(count)]
        self.last_progress_s = 0.0
        """When a token last arrived or a request last ended."""
        self.stop_reason: str | None = None
        self.stopped_at_s: float | None = None
        """Replay time when :meth:`stop` was called."""
        self.stopped = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.started

    def stop(self, reason: str) -> None:
        """End the replay now; requests still running are recorded as unfinished, with
        ``reason``. The first reason given wins."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.stopped_at_s = self.now()
            self.stopped.set()

    def stalled_s(self) -> float:
        """How long requests have been in flight without any token or completion (0 when
        none is in flight)."""
        in_flight = ~np.isnan(self.sent_s) & ~self.finished
        if not in_flight.any():
            return 0.0
        since = max(self.last_progress_s, float(np.min(self.sent_s[in_flight])))
        return self.now() - since

    def snapshot(self) -> Snapshot:
        return Snapshot(
            now_s=self.now(),
            sent_s=self.sent_s.copy(),
            first_token_s=self.first_token_s.copy(),
            last_token_s=self.last_token_s.copy(),
            tokens=self.tokens.copy(),
            expected=self.expected,
            failed=self.failed.copy(),
            traffic_class=self.traffic_class,
        )

    def record_tokens(self, index: int, count: int) -> None:
        """``count`` more output tokens of request ``index`` arrived now."""
        now = self.now()
        if self.tokens[index] == 0:
            self.first_token_s[index] = now
        self.last_token_s[index] = now
        self.tokens[index] += count
        self.token_times[index].extend([now] * count)
        self.last_progress_s = now

    def record_end(self, index: int, failed: bool) -> None:
        """Request ``index`` ended (completed, or failed)."""
        self.finished[index] = True
        self.failed[index] = failed
        self.last_progress_s = self.now()


class ClientLimit:
    """At most ``limit`` requests in flight, sent in trace (arrival) order: a request takes a
    slot once every request before it has taken one and a slot is free (:meth:`acquire`),
    and gives it back when it ends (:meth:`release`)."""

    def __init__(self, limit: int, count: int) -> None:
        if limit < 1:
            raise ValueError(f"max_concurrency must be at least 1, not {limit}")
        self.free = limit
        self.turn = 0
        """The request whose turn it is to take a slot."""
        self.count = count
        self.ready: dict[int, asyncio.Future[None]] = {}
        """Requests whose time has come, waiting for their turn and a slot."""
        self.all_sent = asyncio.Event()
        """Set once every request has taken its slot."""
        self.last_sent = time.monotonic()
        """When the latest request took its slot."""
        if count == 0:
            self.all_sent.set()

    async def acquire(self, index: int) -> None:
        """Wait until request ``index`` may be sent: its turn, and a free slot."""
        granted = asyncio.get_running_loop().create_future()
        self.ready[index] = granted
        self._dispatch()
        try:
            await granted
        except asyncio.CancelledError:
            self.ready.pop(index, None)
            if granted.done() and not granted.cancelled():
                self.release()  # granted as it was cancelled: the slot is not used
            raise

    def release(self) -> None:
        """A request ended: its slot is free for the next."""
        self.free += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self.free > 0 and self.turn in self.ready:
            granted = self.ready.pop(self.turn)
            self.turn += 1
            if granted.done():  # cancelled while waiting
                continue
            self.free -= 1
            self.last_sent = time.monotonic()
            granted.set_result(None)
        if self.turn >= self.count:
            self.all_sent.set()


@dataclass
class ReplayResult:
    records: list[RequestRecord]
    lateness_s: np.ndarray
    """How far behind its scheduled time each request was sent."""
    wall_s: float
    started_unix_s: float = 0.0
    """The Unix time of the replay's clock zero (to place a server's logged steps on it)."""

    @property
    def client_bound(self) -> bool:
        return bool(self.lateness_s.size) and float(np.percentile(self.lateness_s, 99)) > (
            LATE_WARNING_S
        )


async def replay(
    base_url: str, trace: Trace, options: ReplayOptions, state: ReplayState | None = None
) -> ReplayResult:
    """Replay ``trace`` against the server at ``base_url``. Pass a ``state`` to watch the
    replay as it runs and to stop it early (:meth:`ReplayState.stop`)."""
    state = state or ReplayState(trace)
    connections = options.max_concurrency or options.connections
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    timeout = httpx.Timeout(options.request_timeout_s, connect=30.0)
    gate = (
        ClientLimit(options.max_concurrency, len(trace.requests))
        if options.max_concurrency is not None
        else None
    )
    semaphore = asyncio.Semaphore(options.connections)
    prompts = [
        prompt_token_ids(r, low=options.token_low, high=options.token_high, seed=options.seed)
        for r in trace.requests
    ]
    lateness = np.zeros(len(trace.requests))
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
    async with httpx.AsyncClient(
        base_url=base_url, limits=limits, timeout=timeout, headers=headers
    ) as client:
        state.started = started = time.monotonic()
        started_unix = time.time()

        async def one(index: int, request: Request) -> RequestRecord:
            delay = started + request.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the trace's schedule itself
            if gate is None:
                async with semaphore:
                    return await send(index, request, open_loop=True)
            lateness[index] = time.monotonic() - started - request.arrival_s
            await gate.acquire(index)  # waiting for a slot, in arrival order, is not lateness
            try:
                return await send(index, request, open_loop=False)
            finally:
                gate.release()

        async def send(index: int, request: Request, *, open_loop: bool) -> RequestRecord:
            sent = time.monotonic()
            if open_loop:
                lateness[index] = sent - started - request.arrival_s
            state.sent_s[index] = sent - started
            try:
                record = await _send(client, index, request, prompts[index], options, state)
            except Exception as exc:  # a malformed answer: the request failed, nothing else
                record = RequestRecord(
                    id=request.id,
                    sent_s=sent - started,
                    token_times_s=list(state.token_times[index]),
                    expected_tokens=request.output_tokens,
                    traffic_class=request.traffic_class,
                    error=f"bad response: {type(exc).__name__}: {exc}"[:300],
                )
            state.record_end(index, failed=not record.completed)
            return record

        tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(trace.requests)]
        everything = asyncio.gather(*tasks, return_exceptions=True)
        stopped = asyncio.create_task(state.stopped.wait())
        last_arrival = trace.requests[-1].arrival_s if trace.requests else 0.0
        waited: set[asyncio.Future[Any]] = {everything, stopped}
        drain_from = started + last_arrival
        if gate is not None:  # the last send may come long after the last arrival
            sending = asyncio.create_task(gate.all_sent.wait())
            await asyncio.wait({*waited, sending}, return_when=asyncio.FIRST_COMPLETED)
            sending.cancel()
            drain_from = max(drain_from, gate.last_sent)
        await asyncio.wait(
            waited,
            timeout=max(drain_from + options.drain_timeout_s - time.monotonic(), 0.0),
            return_when=asyncio.FIRST_COMPLETED,
        )
        stopped.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(everything, stopped, return_exceptions=True)
        records = _records(tasks, trace, state)
        wall = time.monotonic() - started
    return ReplayResult(
        records=records, lateness_s=lateness, wall_s=wall, started_unix_s=started_unix
    )


def _records(
    tasks: list[asyncio.Task[RequestRecord]], trace: Trace, state: ReplayState
) -> list[RequestRecord]:
    """Each request's record: its task's, or, for one stopped or cancelled before its end,
    what arrived of it, marked unfinished with the reason the replay stopped."""
    unfinished = f"unfinished: {state.stop_reason or 'the replay ended'}"
    records = []
    for index, (task, request) in enumerate(zip(tasks, trace.requests, strict=True)):
        if not task.cancelled() and task.exception() is None:
            records.append(task.result())
            continue
        sent = state.sent_s[index]
        records.append(
            RequestRecord(
                id=request.id,
                sent_s=float(sent) if not np.isnan(sent) else request.arrival_s,
                token_times_s=list(state.token_times[index]),
                expected_tokens=request.output_tokens,
                traffic_class=request.traffic_class,
                error=unfinished,
            )
        )
    return records


async def _send(
    client: httpx.AsyncClient,
    index: int,
    request: Request,
    prompt: list[int],
    options: ReplayOptions,
    state: ReplayState,
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
                    chunk = json.loads(line[6:])
                    if "error" in chunk and error is None:
                        # The stream began, then the server gave up on the request (vLLM
                        # 0.32's queue limits can answer so): its own status and words.
                        error = _streamed_error(chunk["error"])
                    choices = chunk.get("choices") or []
                    if choices:
                        ids = choices[0].get("token_ids")
                        state.record_tokens(index, len(ids) if ids else 1)
    except httpx.TimeoutException:
        error = f"timed out after {options.request_timeout_s:g} s"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    times = state.token_times[index]
    if error is None and len(times) != request.output_tokens:
        error = f"{len(times)} of {request.output_tokens} tokens streamed"
    return RequestRecord(
        id=request.id,
        sent_s=float(state.sent_s[index]),
        token_times_s=list(times),
        expected_tokens=request.output_tokens,
        traffic_class=request.traffic_class,
        error=error,
    )


def _streamed_error(error: object) -> str:
    """``HTTP 503: ...`` for an error object sent in a stream (its ``code`` is the status)."""
    if not isinstance(error, dict):
        return _message(json.dumps(error))
    code = error.get("code")
    status = f"HTTP {code}: " if isinstance(code, int) else "error in the stream: "
    return status + _message(json.dumps({"message": error.get("message") or str(error)}))


def _message(text: str) -> str:
    try:
        payload = json.loads(text)
        message = payload.get("message") or payload.get("error", {}).get("message") or text
    except (ValueError, AttributeError):
        message = text
    return str(message).strip().splitlines()[0][:300] if str(message).strip() else "(empty)"
