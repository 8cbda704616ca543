"""vLLM 0.32's queue limits (issue 45): the API server answers HTTP 503 to a request arriving
when ``max_num_queued_reqs`` requests are unfinished, or while the prompts not yet past their
first token hold ``max_num_queued_tokens`` (``AsyncLLM.check_admission``). A request turned
away fails the SLOs, so the limits are searched only with an error budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefill_tuner.engines.sim import SimConfig, simulate
from prefill_tuner.engines.sim.cost_model import ConstantProfile
from prefill_tuner.engines.sim.loop import PREFILL_BACKLOG, QUEUE_FULL
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.scoring import ERRORS, judge
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.render import serve_args
from prefill_tuner.search_spaces.space import EngineCapabilities, build_space, knob_availability
from prefill_tuner.trace import Request, Trace

PROFILE = ConstantProfile(step_ms=10.0)
BURST = Trace(tuple(Request(f"r{i}", 0.0, 64, 8) for i in range(40)))
"""40 requests at once: the engine sees them together."""


def run(trace: Trace = BURST, max_concurrency: int | None = None, **settings: object):  # type: ignore[no-untyped-def]
    config = SimConfig(max_num_batched_tokens=512, max_num_seqs=64, max_model_len=4096, **settings)  # type: ignore[arg-type]
    return simulate(trace, config, PROFILE, max_concurrency=max_concurrency)


def test_a_full_queue_turns_requests_away_and_they_fail() -> None:
    free, limited = run(), run(max_num_queued_reqs=4)
    assert free.metrics.failed == 0
    # The first four are unfinished when the fifth arrives: 4 + 1 > 4.
    assert limited.metrics.completed == 4 and limited.metrics.failed == 36
    assert limited.metrics.failure_reasons == {QUEUE_FULL: 36}
    turned_away = [r for r in limited.records if r.error]
    assert all(not r.token_times_s and r.seen_s is None for r in turned_away)
    assert [r.id for r in limited.records if not r.error] == ["r0", "r1", "r2", "r3"]
    # Load shed is not latency won: the run fails its error constraint.
    assert judge(limited.metrics, ()).constraints[ERRORS] == pytest.approx(0.9)


def test_the_prefill_backlog_limit_counts_whole_prompts_until_their_first_token() -> None:
    # 64-token prompts: the backlog is 0, 64, 128 as three arrive; 128 >= 100 turns the third away.
    limited = run(max_num_queued_tokens=100)
    assert [r.id for r in limited.records if not r.error] == ["r0", "r1"]
    assert set(limited.metrics.failure_reasons) == {PREFILL_BACKLOG}
    # Spread out, each request is past its first token (one 10 ms step) before the next.
    spread = Trace(tuple(Request(f"r{i}", 0.05 * i, 64, 8) for i in range(40)))
    assert run(spread, max_num_queued_tokens=100).metrics.failed == 0


def test_a_closed_loop_client_sends_the_next_request_when_one_is_turned_away() -> None:
    """``vllm bench serve --max-concurrency 8`` against a limit of 4: a 503 frees its slot at
    once, the client goes on, and every request ends (completed or turned away)."""
    result = run(max_concurrency=8, max_num_queued_reqs=4)
    metrics = result.metrics
    assert metrics.completed + metrics.failed == 40
    assert 0 < metrics.failed < 40 and metrics.completed >= 4
    assert result.peak_running <= 4


def test_searched_only_when_asked_only_where_vllm_has_them_and_rendered_as_flags() -> None:
    sim = EngineCapabilities(engine="sim", version="test")
    assert not {"max_num_queued_reqs", "max_num_queued_tokens"} & set(build_space(sim).ranges)
    space = build_space(sim, {"max_num_queued_reqs": "16..256"})
    assert space.ranges["max_num_queued_reqs"].knob.sheds_load
    old = EngineCapabilities(engine="vllm", version="0.31.0")
    assert "0.32.0" in (knob_availability(KNOBS["max_num_queued_tokens"], old) or "")
    assert knob_availability(KNOBS["max_num_queued_tokens"], sim) is None
    assert serve_args({"max_num_queued_reqs": 64, "max_num_queued_tokens": None}) == [
        "--max-num-queued-reqs",
        "64",
    ]


def test_a_study_searches_them_only_with_an_error_budget(tmp_path: Path) -> None:
    from prefill_tuner import EngineOptions, build_engine
    from prefill_tuner.study.plan import SpaceSpec, TraceSpec, build_plan

    trace = tmp_path / "t.csv"
    trace.write_text("timestamp_s,input_length,output_length\n0,64,8\n1,64,8\n")
    engine = build_engine(EngineOptions())
    space = SpaceSpec(ranges={"max_num_queued_tokens": "1024..65536"})
    with pytest.raises(TunerError, match="error budget"):
        build_plan(engine, TraceSpec(path=trace), space, slos=["p99_ttft=1s"])
    plan = build_plan(engine, TraceSpec(path=trace), space, slos=["p99_ttft=1s"], error_budget=0.01)
    assert "max_num_queued_tokens" in plan.space.ranges
