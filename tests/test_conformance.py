"""Conformance suites, one per extension point, as Optuna ships ``StorageTestCase``: a new
step-time profile kind, router or trial engine subclasses its suite with a fixture that makes
one, and must pass every test of it.

- :class:`StepProfileSuite`: the interface the simulator asks of a profile
  (``engines/sim/profile_base.py``'s ``StepProfile``), above all that the fast path's run
  methods give exactly the floats ``step_seconds`` gives step by step (the fast-forward's
  exactness rests on it);
- :class:`RouterSuite`: a router picks a replica in range, the same way for the same requests;
- :class:`TrialEngineSuite`: what a study asks of an engine before and during a trial
  (``engines/base.py``'s ``TrialEngine``). The real engine runs the same contract on a real
  server in ``tests/test_real_engine_study.py`` (minutes each), not here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.factory import ENGINES
from prefill_tuner.engines.sim.cost_model import (
    ConstantProfile,
    FittedProfile,
    StepProfile,
    StepShape,
    load_profile,
    profile_from_record,
)
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.engines.sim.loop import request_templates
from prefill_tuner.engines.sim.request import SimRequest
from prefill_tuner.engines.sim.routing import ROUTERS, Router, make_router
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.trace.model import Request, Trace

DECODE_RUNS = [(1, 100, 1), (3, 3000, 7), (64, 64 * 900, 40), (200, 200 * 4000, 3)]
"""``(requests, first_context, steps)``: plain decode runs."""
CHUNK_RUNS = [
    (0, 1, 0, [(0, 512)], 4),
    (5, 6, 5 * 700, [(0, 256)], 9),
    (30, 32, 30 * 2000, [(1024, 128), (0, 64)], 5),
]
"""``(decodes, requests, decode_context, chunks, steps)``: decodes beside prefill chunks."""


def _decode_shape(requests: int, context: int) -> StepShape:
    return StepShape(decode_tokens=requests, requests=requests, decode_context_tokens=context)


def _chunk_shape(
    decodes: int, requests: int, context: int, chunks: list[tuple[int, int]]
) -> StepShape:
    return StepShape(
        prefill_tokens=sum(count for _, count in chunks),
        decode_tokens=decodes,
        requests=requests,
        decode_context_tokens=context,
        prefill_context_tokens=sum(before + count for before, count in chunks),
        prefill_attention_pairs=sum(
            count * before + count * (count + 1) // 2 for before, count in chunks
        ),
        prefill_chunks=tuple(chunks),
    )


class StepProfileSuite:
    """What every step-time profile kind must do. Subclasses give ``profile``."""

    @pytest.fixture
    def profile(self) -> StepProfile:
        raise NotImplementedError

    def test_steps_take_a_positive_finite_time(self, profile: StepProfile) -> None:
        for requests, context, _ in DECODE_RUNS:
            assert 0 < profile.step_seconds(_decode_shape(requests, context)) < math.inf
        for decodes, requests, context, chunks, _ in CHUNK_RUNS:
            seconds = profile.step_seconds(_chunk_shape(decodes, requests, context, chunks))
            assert 0 < seconds < math.inf

    @pytest.mark.parametrize(("requests", "first_context", "steps"), DECODE_RUNS)
    def test_a_decode_run_is_exactly_its_steps(
        self, profile: StepProfile, requests: int, first_context: int, steps: int
    ) -> None:
        one_by_one = [
            profile.step_seconds(_decode_shape(requests, first_context + requests * step))
            for step in range(steps)
        ]
        run = profile.decode_run_seconds(requests, first_context, steps)
        assert isinstance(run, np.ndarray)
        assert run.tolist() == one_by_one
        assert profile.decode_steps_seconds(requests, first_context, steps) == one_by_one

    @pytest.mark.parametrize(("decodes", "requests", "context", "chunks", "steps"), CHUNK_RUNS)
    def test_a_chunk_run_is_exactly_its_steps(
        self,
        profile: StepProfile,
        decodes: int,
        requests: int,
        context: int,
        chunks: list[tuple[int, int]],
        steps: int,
    ) -> None:
        one_by_one = [
            profile.step_seconds(
                _chunk_shape(
                    decodes,
                    requests,
                    context + decodes * step,
                    [(before + count * step, count) for before, count in chunks],
                )
            )
            for step in range(steps)
        ]
        run = profile.chunk_run_seconds(decodes, requests, context, chunks, steps)
        assert run.tolist() == one_by_one
        assert profile.chunk_steps_seconds(decodes, requests, context, chunks, steps) == one_by_one

    def test_host_time_and_prefill_work_are_parts_of_a_step(self, profile: StepProfile) -> None:
        for requests, context, _ in DECODE_RUNS:
            host = profile.host_seconds(requests)
            assert 0 <= host <= profile.step_seconds(_decode_shape(requests, context))
        for _, _, _, chunks, _ in CHUNK_RUNS:
            shape = _chunk_shape(0, len(chunks), 0, chunks)
            work = profile.prefill_work_seconds(shape.prefill_tokens, shape.prefill_attention_pairs)
            assert 0 <= work <= profile.step_seconds(shape)

    def test_the_request_path_takes_no_negative_time(self, profile: StepProfile) -> None:
        for term in (
            profile.request_latency_s,
            profile.request_interval_s,
            profile.request_token_s,
            profile.response_latency_s,
            profile.response_output_s,
        ):
            assert 0 <= term < math.inf

    def test_its_record_gives_it_back(self, profile: StepProfile) -> None:
        """A study stores its profile as a record and a resume reads it back."""
        record = profile.model_dump(mode="json")  # type: ignore[attr-defined]
        assert profile_from_record(record) == profile
        assert profile.name and isinstance(profile.engine_defaults, dict)
        assert all(isinstance(arg, str) for arg in profile.serve_args)


class TestConstantProfile(StepProfileSuite):
    @pytest.fixture
    def profile(self) -> StepProfile:
        return ConstantProfile(step_ms=12.5)


class TestFittedProfile(StepProfileSuite):
    @pytest.fixture
    def profile(self) -> StepProfile:
        return FittedProfile(
            name="fitted-example",
            base_ms=4.0,
            prefill_token_ms=0.02,
            prefill_pair_ms=1e-6,
            prefill_context_ms=1e-4,
            decode_ms=0.05,
            decode_squared_ms=1e-5,
            decode_context_ms=2e-6,
            request_ms=0.01,
            prefill_step_ms=1.2,
            host_ms=1.5,
            host_request_ms=0.002,
            request_latency_ms=2.0,
            response_output_us=40.0,
        )


class TestShippedKernelProfile(StepProfileSuite):
    @pytest.fixture
    def profile(self) -> StepProfile:
        return load_profile("llama-3.1-8b-h100")


class TestBuiltKernelProfile(StepProfileSuite):
    @pytest.fixture
    def profile(self) -> StepProfile:
        return ProfileSpec(gpu="h100_sxm", tp=2, dtype="fp8").build("Qwen/Qwen3-32B", 16384)


class RouterSuite:
    """What every router must do. Subclasses give ``name`` (one of ``ROUTERS``)."""

    name: str
    REPLICAS = 4

    def _requests(self) -> list[SimRequest]:
        trace = Trace(
            tuple(
                Request(
                    str(i),
                    0.01 * i,
                    prompt_tokens=64 + 16 * (i % 7),
                    output_tokens=8,
                    prefix_blocks=tuple(range(i % 3, i % 3 + 4)),
                    prefix_block_size=16,
                )
                for i in range(40)
            )
        )
        return [SimRequest(i, t) for i, t in enumerate(request_templates(trace))]

    def _choices(self, router: Router) -> list[int]:
        outstanding = [0] * self.REPLICAS
        choices = []
        for request in self._requests():
            choice = router.choose(request, list(outstanding))
            choices.append(choice)
            outstanding[choice] += 1
            if len(choices) % 3 == 0:  # requests finish now and then
                busiest = max(range(self.REPLICAS), key=lambda i: outstanding[i])
                outstanding[busiest] -= 1
        return choices

    def test_it_picks_a_replica_in_range(self) -> None:
        choices = self._choices(make_router(self.name, self.REPLICAS))
        assert all(0 <= choice < self.REPLICAS for choice in choices)

    def test_the_same_requests_go_the_same_way(self) -> None:
        """A replay is deterministic: two routers of a kind route alike."""
        first = self._choices(make_router(self.name, self.REPLICAS))
        assert first == self._choices(make_router(self.name, self.REPLICAS))

    def test_every_replica_gets_work(self) -> None:
        choices = self._choices(make_router(self.name, self.REPLICAS))
        assert set(choices) == set(range(self.REPLICAS))


@pytest.mark.parametrize("name", ROUTERS)
def test_every_router_has_its_suite(name: str) -> None:
    assert any(suite.name == name for suite in RouterSuite.__subclasses__())


class TestRoundRobin(RouterSuite):
    name = "round-robin"


class TestLeastOutstanding(RouterSuite):
    name = "least-outstanding"


class TestPrefixAware(RouterSuite):
    name = "prefix-aware"


class TrialEngineSuite:
    """What a study asks of every trial engine. Subclasses give ``engine``."""

    @pytest.fixture
    def engine(self) -> TrialEngine:
        raise NotImplementedError

    def test_it_says_what_it_is(self, engine: TrialEngine) -> None:
        assert engine.capabilities.engine in ENGINES
        assert engine.name and engine.version
        assert isinstance(engine.deterministic, bool)
        assert isinstance(engine.starts_servers, bool)

    def test_its_defaults_are_knobs_it_takes(self, engine: TrialEngine) -> None:
        defaults = engine.default_settings()
        assert defaults and set(defaults) <= set(KNOBS)
        assert engine.validate_fixed(dict(defaults)) == defaults

    def test_it_refuses_a_setting_it_cannot_take(self, engine: TrialEngine) -> None:
        with pytest.raises(TunerError):
            engine.validate_fixed({"no_such_setting": 1})
        with pytest.raises(TunerError):
            engine.validate_fixed({"max_num_seqs": 0})

    def test_its_context_length_follows_the_fixed_settings(self, engine: TrialEngine) -> None:
        assert engine.max_model_len({}) >= 2
        assert engine.max_model_len({"max_model_len": 4096}) == 4096

    def test_a_run_serves_the_trace(self, engine: TrialEngine) -> None:
        trace = Trace(
            tuple(Request(str(i), 0.05 * i, prompt_tokens=200, output_tokens=5) for i in range(8))
        )
        run = engine.run(trace, engine.default_settings())
        assert run.failure is None and run.metrics is not None
        assert run.metrics.completed == len(trace.requests)
        assert run.version == engine.version
        if engine.deterministic:
            again = engine.run(trace, engine.default_settings())
            assert again.metrics == run.metrics
        engine.close()


class TestSimEngine(TrialEngineSuite):
    @pytest.fixture
    def engine(self) -> TrialEngine:
        return SimEngine(load_profile("llama-3.1-8b-h100"))
