"""The replay client against a small stand-in HTTP server: a malformed answer fails its
request (and ends it, so the hang guard never waits on it), and a stop ends the replay with
the unfinished requests recorded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
