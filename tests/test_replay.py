"""The replay client against a small stand-in HTTP server: a malformed answer fails its
request (and ends it, so the hang guard never waits on it), and a stop ends the replay with
the unfinished requests recorded."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from prefill_tuner.engines.real.replay import ReplayOptions, ReplayState, replay
from prefill_tuner.trace.model import Request, Trace


class MalformedStream(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"data: {not json\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def base_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), MalformedStream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def trace(*arrivals: float) -> Trace:
    return Trace(
        requests=tuple(
            Request(id=str(i), arrival_s=t, prompt_tokens=8, output_tokens=4)
            for i, t in enumerate(arrivals)
        )
    )


def test_a_malformed_answer_fails_and_ends_its_request(base_url: str) -> None:
    requests = trace(0.0, 0.01)
    state = ReplayState(requests)
    result = asyncio.run(replay(base_url, requests, ReplayOptions(model="m"), state))
    assert [r.error.split(":")[0] for r in result.records] == ["bad response"] * 2
    assert state.finished.all() and state.failed.all() and state.stalled_s() == 0


def test_a_stop_ends_the_replay_and_records_the_rest(base_url: str) -> None:
    requests = trace(0.0, 3600.0)  # the second request is an hour away

    async def stop_after_the_first() -> None:
        state = ReplayState(requests)
        task = asyncio.create_task(replay(base_url, requests, ReplayOptions(model="m"), state))
        while not state.finished[0]:
            await asyncio.sleep(0.01)  # polling a condition, not waiting for it
        state.stop("cut short: test")
        result = await task
        assert result.records[1].error == "unfinished: cut short: test"
        assert result.wall_s < 60

    asyncio.run(stop_after_the_first())


class SlowStream(BaseHTTPRequestHandler):
    """Streams each request's tokens 50 ms apart, and counts the requests it serves at once."""

    lock = threading.Lock()
    serving = 0
    most = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.serving += 1
            cls.most = max(cls.most, cls.serving)
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for _ in range(body["max_tokens"]):
                time.sleep(0.05)
                self.wfile.write(b'data: {"choices": [{"token_ids": [7]}]}\n\n')
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            with cls.lock:
                cls.serving -= 1

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_url() -> Iterator[str]:
    SlowStream.serving = SlowStream.most = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowStream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_client_limit_holds_requests_in_arrival_order(slow_url: str) -> None:
    """Eight requests arriving together, two allowed in flight: they go two at a time, in
    arrival order, each as another ends, timed from its send; the last goes out long after
    the drain deadline an open-loop replay would count from the last arrival, and is kept;
    waiting for a slot is not lateness."""
    requests = trace(*[0.0] * 8)
    options = ReplayOptions(model="m", max_concurrency=2, drain_timeout_s=0.3)
    result = asyncio.run(replay(slow_url, requests, options))
    records = result.records
    assert all(r.completed for r in records), [r.error for r in records]
    assert SlowStream.most == 2
    sent = [r.sent_s for r in records]
    assert sent == sorted(sent)
    for index, record in enumerate(records):
        others = [r for r in records[:index] if r.token_times_s[-1] > record.sent_s]
        assert len(others) <= 1  # with it, at most two in flight
    assert sent[-1] > 0.5  # three pairs of 0.2 s requests before it
    ttft = [r.token_times_s[0] - r.sent_s for r in records]
    assert max(ttft) < 0.5  # from the send, not from the arrival
    assert float(result.lateness_s.max()) < 0.25
    assert not result.client_bound


def test_a_stop_ends_a_closed_loop_replay_with_requests_still_waiting(slow_url: str) -> None:
    requests = trace(*[0.0] * 6)

    async def stop_after_the_first() -> None:
        state = ReplayState(requests)
        options = ReplayOptions(model="m", max_concurrency=1)
        task = asyncio.create_task(replay(slow_url, requests, options, state))
        while not state.finished[0]:
            await asyncio.sleep(0.01)  # polling a condition, not waiting for it
        state.stop("cut short: test")
        result = await task
        assert result.records[0].completed
        assert [r.error for r in result.records[2:]] == ["unfinished: cut short: test"] * 4
        assert np.isnan(state.sent_s[2:]).all()  # never sent: they waited for the slot
        assert result.wall_s < 5

    asyncio.run(stop_after_the_first())
