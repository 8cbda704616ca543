"""A request's whole life on a simulated vLLM server (issue 42): which scheduling loop the
server's release runs, the front end before the engine sees a request, and the way back to
the client after its tokens are sampled."""

from __future__ import annotations

import numpy as np
import pytest

from prefill_tuner.diagnosis import simulated_view
from prefill_tuner.engines.sim import SimConfig, StepRecord, load_profile, simulate
from prefill_tuner.engines.sim.config import (
    async_scheduling_default,
    release_defaults,
    release_memory_share,
)
from prefill_tuner.engines.sim.cost_model import profile_from_record
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.engines.sim.replicas import simulate_replicas
from prefill_tuner.engines.sim.trial_engine import profile_words
from prefill_tuner.engines.timeline import build_timeline
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.metrics import RequestRecord
from prefill_tuner.output.html.timeline import panels
from prefill_tuner.trace import ShapeOptions, load_trace
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import AZURE


@pytest.mark.parametrize(
    ("version", "asynchronous"),
    [
        ("0.12.0", False),
        ("0.13.0", False),
        ("v0.13.1rc2", False),
        ("0.14.0", True),
        ("0.32.0", True),
        ("a build whose version cannot be read", True),
    ],
)
def test_vllm_schedules_asynchronously_by_default_from_0_14(
    version: str, asynchronous: bool
) -> None:
    """vLLM 0.12 and 0.13 defaulted ``async_scheduling`` to False; 0.14.0 made it None,
    resolved to on (read in the three wheels: docs/vllm-facts.md)."""
    assert async_scheduling_default(version) is asynchronous


@pytest.mark.parametrize(
    ("gpu", "version", "budget"),
    [
        ("b200_sxm", "0.17.0", 8192),
        ("b200_sxm", "0.27.1", 8192),
        ("b200_sxm", "0.28.0", None),
        ("b200_sxm", "a build whose version cannot be read", None),
        ("h100_sxm", "0.12.0", None),
    ],
)
def test_large_gpus_had_the_70_gib_budget_before_0_28(
    gpu: str, version: str, budget: int | None
) -> None:
    """Profiles hold the current release's defaults (a B200's 16,384-token budget); replaying
    a run of an older release takes that release's: 8,192 on 160 GiB GPUs before vLLM 0.28.0,
    which added their tier (read in the wheels: docs/vllm-facts.md), and its scheduling."""
    profile = ProfileSpec(gpu=gpu).build()
    current = profile.engine_defaults["max_num_batched_tokens"]
    assert current == (16384 if gpu == "b200_sxm" else 8192)
    settings = release_defaults(profile, version)
    assert settings.get("max_num_batched_tokens") == budget
    assert settings["async_scheduling"] is async_scheduling_default(version)


@pytest.mark.parametrize(
    ("version", "share"),
    [("0.12.0", 0.9), ("0.19.0", 0.9), ("0.20.0", 0.92), ("0.33.0", 0.92), ("unreadable", 0.92)],
)
def test_vllm_took_less_of_the_gpu_before_0_20(version: str, share: float) -> None:
    """``gpu_memory_utilization`` defaulted to 0.9 up to 0.19 and to 0.92 from 0.20.0 (read in
    the wheels' ``vllm/config/cache.py``): a replay of an older run sizes its KV pool so."""
    assert release_memory_share(version) == share


# The request path: the way in (the API server's front end) and the way back (its streaming).

H100 = load_profile("llama-3.1-8b-h100")
PATH = {
    "request_latency_ms": 2.0,
    "request_interval_ms": 1.5,
    "request_token_us": 3.0,
    "response_latency_ms": 1.0,
    "response_output_us": 400.0,
    "resend_ms": 2.5,
}
"""A request path with every term set (each a plausible API server's and client's)."""
WITH_PATH = H100.model_copy(update=PATH)


def config(async_scheduling: bool, **values: object) -> SimConfig:
    return SimConfig(**{**H100.engine_defaults, **values, "async_scheduling": async_scheduling})


def wave(count: int, prompt: int = 1024, output: int = 64) -> Trace:
    """``count`` identical requests, all ready at the start (a load generator's first wave)."""
    return Trace(tuple(Request(f"r{i}", 0.0, prompt, output) for i in range(count)))


def records_of(
    records: list[RequestRecord],
) -> list[tuple[str, float, float | None, list[float]]]:
    return [(r.id, r.sent_s, r.seen_s, list(r.token_times_s)) for r in records]


@pytest.mark.parametrize("limit", [None, 4, 16])
@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_fast_forward_is_exact_with_a_request_path(
    async_scheduling: bool, limit: int | None
) -> None:
    """Where a request stands among its last step's outputs is counted one way for a step
    applied alone and another for a fast-forwarded run: both give the same reads, and a
    closed-loop client resends at the same ticks."""
    trace = load_trace(str(AZURE), options=ShapeOptions(max_requests=250))
    runs = [
        simulate(
            trace,
            config(async_scheduling),
            WITH_PATH,
            fast_forward=fast,
            max_concurrency=limit,
        )
        for fast in (True, False)
    ]
    assert records_of(runs[0].records) == records_of(runs[1].records)
    assert runs[0].steps == runs[1].steps


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_one_replica_with_a_request_path_is_the_single_engine(async_scheduling: bool) -> None:
    """The router frees a slot when the client reads a last token, as the single engine's
    client does."""
    trace = load_trace(str(AZURE), options=ShapeOptions(max_requests=150))
    for limit in (None, 3):
        single = simulate(trace, config(async_scheduling), WITH_PATH, max_concurrency=limit)
        one = simulate_replicas(
            trace,
            config(async_scheduling),
            WITH_PATH,
            replicas=1,
            router="round-robin",
            max_concurrency=limit,
        )
        assert records_of(one.result.records) == records_of(single.records)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_a_steps_outputs_reach_their_clients_one_after_another(async_scheduling: bool) -> None:
    """Eight prompts prefilled in one step: their first tokens are read the path's latency
    after the step's end, each ``response_output`` after the one before (the API server
    streams them in the step's order); no path, all at the step's end."""
    profile = H100.model_copy(update={"response_latency_ms": 1.0, "response_output_us": 500.0})
    plain = simulate(wave(8), config(async_scheduling), H100)
    firsts = [r.token_times_s[0] for r in plain.records]
    assert len(set(firsts)) == 1  # one lockstep wave: the engine's view
    read = simulate(wave(8), config(async_scheduling), profile)
    expected = [firsts[0] + 0.001 + 0.0005 * position for position in range(8)]
    assert [r.token_times_s[0] for r in read.records] == pytest.approx(expected, abs=1e-9)
    for before, after in zip(plain.records, read.records, strict=True):
        times = np.asarray(after.token_times_s)
        assert np.all(np.diff(times) >= 0)  # read in order
        # TPOT runs from the first token to the last: moved by the places they were read in
        first = after.token_times_s[0] - before.token_times_s[0]
        last = after.token_times_s[-1] - before.token_times_s[-1]
        assert min(first, last) >= 0.001 - 1e-9 and max(first, last) <= 0.001 + 0.0035 + 1e-9


def test_a_closed_loop_resends_a_wave_one_request_at_a_time() -> None:
    """Four requests finishing on one step free their slots as their clients read their last
    tokens, one after another: the next four are sent ``response_output`` apart, not at one
    tick (the lockstep wave the engine's view alone would replay)."""
    profile = H100.model_copy(update={"response_output_us": 700.0})
    run = simulate(wave(8), config(False), profile, max_concurrency=4)
    second = sorted(r.sent_s for r in run.records[4:])
    gaps = np.diff(second)
    assert gaps == pytest.approx([0.0007] * 3, abs=1e-9)
    lockstep = simulate(wave(8), config(False), H100, max_concurrency=4)
    assert len({r.sent_s for r in lockstep.records[4:]}) == 1


@pytest.mark.parametrize("replicas", [None, 1, 2])
def test_a_closed_loop_client_handles_one_response_end_at_a_time(replicas: int | None) -> None:
    """Four responses ending on one step, read at one tick: the client handles their ends
    one after another, so the next four are sent ``resend`` after the read, then ``resend``
    apart (one client process, alone or in front of replicas)."""
    profile = H100.model_copy(update={"resend_ms": 3.0})
    if replicas is None:
        run = simulate(wave(8), config(False), profile, max_concurrency=4)
    else:
        run = simulate_replicas(
            wave(8),
            config(False),
            profile,
            replicas=replicas,
            router="round-robin",
            max_concurrency=4,
        ).result
    ends = sorted(r.token_times_s[-1] for r in run.records[:4])
    assert len(set(ends)) == 1  # one step's
    second = sorted(r.sent_s for r in run.records[4:])
    assert second == pytest.approx([ends[0] + 0.003 * k for k in (1, 2, 3, 4)], abs=1e-9)


def test_the_front_end_tokenises_a_prompt_before_the_next_request() -> None:
    """The scheduler sees a request ``request_latency`` after its send plus its prompt's
    tokenising, and the request behind it no sooner than ``request_interval`` later plus its
    own: a long prompt holds up a short one sent just after it."""
    profile = H100.model_copy(
        update={"request_latency_ms": 2.0, "request_interval_ms": 1.0, "request_token_us": 10.0}
    )
    trace = Trace((Request("long", 0.0, 8000, 4), Request("short", 0.0001, 10, 4)))
    steps: list[StepRecord] = []
    simulate(trace, config(False), profile, on_step=steps.append)
    long_seen = 0.002 + 8000 * 10e-6  # 82 ms
    assert steps[0].start_s == pytest.approx(long_seen)
    assert list(steps[0].scheduled) == ["long"]
    short_seen = long_seen + 0.001 + 10 * 10e-6
    # the short one joins the first step that starts after it reached the scheduler
    joined = next(step for step in steps if "short" in step.scheduled)
    before = steps[steps.index(joined) - 1]
    assert before.start_s < short_seen <= joined.start_s


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_the_timeline_says_when_the_engine_saw_the_long_prompt_and_first_scheduled_it(
    async_scheduling: bool,
) -> None:
    """The report's timeline follows the longest prompt from its send to its first token:
    the scheduler has it ``request_latency`` plus its prompt's tokenising after its send (the
    front end free: nothing sent just before it), its first step starts after that, and its
    first token comes after that; the report says the three in words."""
    profile = H100.model_copy(update={"request_latency_ms": 5.0, "request_token_us": 2.0})
    streams = tuple(Request(f"s{i}", 0.01 * i, 200, 300) for i in range(4))
    trace = Trace((*streams, Request("long", 0.5, 8000, 4)))
    view = simulated_view(trace, config(async_scheduling), profile)
    prompt = build_timeline(trace, view.records, view.steps)["window"]["long_prompt"]
    assert prompt["id"] == "long" and prompt["arrival_s"] == 0.5
    assert prompt["seen_s"] == pytest.approx(0.5 + 0.005 + 8000 * 2e-6, abs=1e-6)
    assert view.records[-1].seen_s == pytest.approx(0.521, abs=1e-9)
    assert all(r.seen_s is not None and r.seen_s > r.sent_s for r in view.records)
    first = next(step for step in view.steps if "long" in (step.prefill_chunks or {}))
    assert first.start_s is not None and prompt["admitted_s"] == round(first.start_s, 6)
    assert prompt["arrival_s"] <= prompt["seen_s"] <= prompt["admitted_s"]
    assert prompt["admitted_s"] <= prompt["first_token_s"]
    assert first.decode_tokens >= 1  # the streams were decoding: it queued behind a step
    words = panels([("baseline (trial 0)", {"window": _window_of(prompt)})])[0]
    assert words is not None
    label = words.life_label()
    assert label.startswith("long prompt 8,000 tokens: front end 21 ms, queued ")
    assert ", prefill to first token " in label and label.endswith(" ms")


def _window_of(prompt: dict) -> dict:
    """A window of the long prompt alone (what the words are made of)."""
    empty = {"start_s": [], "duration_s": [], "prefill_tokens": [], "decode_tokens": []}
    return {"long_prompt": prompt, "steps": empty, "streams": []}


def test_a_profile_without_the_new_terms_keeps_its_record() -> None:
    """The terms added for the way back and the prompt's tokenising are left out of a
    profile's record while 0: a study's engine version, which names its profile by content,
    is the same as before they existed."""
    record = H100.model_dump(mode="json")
    assert "request_latency_ms" in record
    later = {"request_token_us", "response_latency_ms", "response_output_us", "resend_ms"}
    assert not later & set(record)
    assert profile_words(H100) == "llama-3.1-8b-h100 (sha256 196894871e95)"
    assert {"response_output_us": 400.0}.items() <= WITH_PATH.model_dump(mode="json").items()


@pytest.mark.parametrize(
    ("term", "value"),
    [
        ("response_output_us", -1.0),
        ("response_latency_ms", float("inf")),
        ("request_token_us", 1e300),
        ("resend_ms", float("nan")),
    ],
)
def test_a_request_path_term_is_finite_and_bounded(term: str, value: float) -> None:
    with pytest.raises(TunerError, match=term):
        profile_from_record({**H100.model_dump(mode="json"), term: value})
