"""Rule-derived first trials (issue 17): what the rules propose, when they stay silent, and
that a study runs them right after the baseline, once."""

from __future__ import annotations

from pathlib import Path

import optuna

from prefill_tuner import defaults
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.study.evaluation import verdict_of
from prefill_tuner.study.first_trials import burst_batch, decode_batch, rule_trials
from prefill_tuner.study.plan import SpaceSpec, TraceSpec, build_plan
from prefill_tuner.trace import ShapeOptions
from prefill_tuner.trace.model import Request, Trace
from prefill_tuner.trace.native import write_native
from prefill_tuner.trace.stats import peak_in_flight, trace_stats
from prefill_tuner.trace.synth import Burst, MixPart, RequestClass, synthesize
from tests.conftest import AZURE
from tests.test_tuning_loop import run_args

ENGINE = SimEngine(load_profile(defaults.PROFILE))
TRACE = TraceSpec(AZURE, shaping=ShapeOptions(max_requests=150))
DEFAULT_SPACE = SpaceSpec()


def plan_for(slos=("p99_tpot=11ms", "p99_ttft=1s"), space=DEFAULT_SPACE, **options):
    return build_plan(ENGINE, TRACE, space, slos=list(slos), **options)


def rules(plan):
    return rule_trials(plan, ENGINE.default_settings(), ENGINE.max_model_len(plan.space.fixed))


def test_the_rules_follow_the_decode_batch_at_the_tpot_limit() -> None:
    plan = plan_for()
    batch = decode_batch(plan)
    assert batch == trace_stats(plan.trace).output_tokens_per_s * 0.011
    small, capped, roomy, *between = (trial.settings for trial in rules(plan))
    budget = small["max_num_batched_tokens"]
    assert budget >= batch + 128 and budget & (budget - 1) == 0  # a power of two just above
    assert budget < 2 * (batch + 128) or budget == 256  # (the range's lowest)
    assert small["long_prefill_token_threshold"] == 0 and small["enable_chunked_prefill"]
    assert capped["max_num_batched_tokens"] == budget
    cap = capped["long_prefill_token_threshold"]
    assert cap <= budget - batch < 2 * cap  # the largest power of two the decodes leave
    assert roomy["max_num_batched_tokens"] >= batch + 2048
    # Rule 4 (issue 46): the budget axis between the small and the roomy budget, doubling.
    budgets = [settings["max_num_batched_tokens"] for settings in between]
    assert budgets == [budget * 2**k for k in range(1, len(budgets) + 1)]
    assert budgets and budgets[-1] * 2 == roomy["max_num_batched_tokens"]
    for settings in (small, capped, roomy, *between):
        assert settings["max_num_seqs"] >= 4 * batch
        assert settings["max_num_seqs"] <= settings["max_num_batched_tokens"]
        assert set(settings) == set(plan.space.ranges)


def test_a_tighter_tpot_limit_means_a_smaller_batch_and_the_ranges_clip() -> None:
    loose = decode_batch(plan_for(("p99_tpot=200ms",)))
    tight = decode_batch(plan_for(("p99_tpot=10ms",)))
    assert loose is not None and tight is not None and loose > tight
    narrow = plan_for(space=SpaceSpec(ranges={"max_num_batched_tokens": "1024..2048"}))
    budgets = [trial.settings["max_num_batched_tokens"] for trial in rules(narrow)]
    assert budgets and all(1024 <= budget <= 2048 for budget in budgets)


def test_no_rules_without_a_tpot_slo_a_searched_budget_or_in_capacity_mode() -> None:
    assert rules(plan_for(("p99_ttft=1s",))) == []
    assert rules(plan_for(space=SpaceSpec(fixed={"max_num_batched_tokens": 2048}))) == []
    assert rules(plan_for(("p99_tpot=20ms",), objective_mode="capacity")) == []


def test_rules_repeating_the_defaults_or_each_other_are_left_out() -> None:
    # With chunked prefill off, every budget is raised to max_model_len: one trial is left,
    # and it is not the defaults (whose chunked prefill is on).
    plan = plan_for(space=SpaceSpec(fixed={"enable_chunked_prefill": False}))
    kept = rules(plan)
    assert len(kept) < 3
    settings = [trial.settings for trial in kept]
    assert len({tuple(sorted(s.items())) for s in settings}) == len(settings)


def test_a_study_runs_the_rules_after_the_baseline_once(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 5, slos=("p99_tpot=11ms", "p99_ttft=1s")))
    assert code == 0, err
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[0].user_attrs.get("baseline")
    # No more rule trials than the study has trials after the baseline.
    assert [bool(t.user_attrs.get("rule")) for t in trials] == [False, True, True, True, True]
    plan = plan_for()  # the same trace, clipped to the same 150 requests
    expected = [trial.settings for trial in rules(plan)][:4]
    ran = [t.user_attrs["settings"] for t in trials[1:5]]
    assert [{k: r[k] for k in e} for e, r in zip(expected, ran, strict=True)] == expected
    # A resumed study does not queue them again.
    code, _, err = tune(*run_args(storage, 7, slos=("p99_tpot=11ms", "p99_ttft=1s")))
    assert code == 0, err
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert sum(bool(t.user_attrs.get("rule")) for t in trials) == 4


def test_no_rule_trials_option(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 3, "--no-rule-trials"))
    assert code == 0, err
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert not any(t.user_attrs.get("rule") for t in trials)


def test_peak_in_flight_counts_a_burst_at_the_tpot_limit() -> None:
    def at(*shapes: tuple[float, int]) -> Trace:
        return Trace(
            tuple(
                Request(id=str(i), arrival_s=t, prompt_tokens=100, output_tokens=out)
                for i, (t, out) in enumerate(shapes)
            )
        )

    # Three arrive together and stream 10 tokens at 0.1 s each (1 s); the fourth arrives as
    # they finish, the fifth while the fourth streams.
    trace = at((0.0, 10), (0.0, 10), (0.0, 10), (1.0, 10), (1.5, 10))
    assert peak_in_flight(trace, 0.1) == 3
    assert peak_in_flight(trace, 0.2) == 5  # twice as slow: everyone overlaps
    assert peak_in_flight(at((0.0, 1)), 0.1) == 1


def bursty_code_trace(tmp_path: Path) -> Path:
    """Short code completions (512 prompt tokens, 32 output) at one a second, and three
    bursts of 64 at once: the average decode batch at a 20 ms TPOT is about 1, a burst's 64."""
    shape = RequestClass("code", 512, 32)
    trace = synthesize(
        [MixPart(shape, 1.0)],
        1.0,
        count=300,
        seed=1,
        bursts=[Burst(shape, at_s, 64) for at_s in (10.0, 25.0, 40.0)],
    )
    path = tmp_path / "code.jsonl"
    write_native(trace.requests, path)
    return path


def test_rule_trials_make_room_for_a_burst(tmp_path: Path) -> None:
    """Sized on the average batch (the previous rule, 4 × the batch), ``max_num_seqs`` is 8 and
    every rule trial keeps a burst waiting for slots past the p99 TTFT limit; never below the
    burst's peak, none does, and a rule trial meets every SLO."""
    plan = build_plan(
        ENGINE,
        TraceSpec(bursty_code_trace(tmp_path)),
        DEFAULT_SPACE,
        slos=["p99_tpot=20ms", "p99_ttft=2s"],
    )
    batch, peak = decode_batch(plan), burst_batch(plan)
    assert batch is not None and batch < 2 and peak is not None and peak >= 64
    trials = rules(plan)[:3]  # the three from the decode batch (the sweep between has more)
    assert len(trials) == 3

    def run(settings):
        result = ENGINE.run(plan.trace, dict(settings))
        return result.metrics, verdict_of(result, plan.slos, 0.0)

    ttft = next(slo for slo in plan.slos if slo.metric == "ttft")
    for trial in trials:
        new = trial.settings
        old = {**new, "max_num_seqs": 8}  # what 4 × the average batch gave
        assert new["max_num_seqs"] >= peak and new["max_num_batched_tokens"] >= peak
        old_metrics, _ = run(old)
        new_metrics, _ = run(new)
        assert old_metrics.ttft_s["p99"] > ttft.limit_s  # the burst waits for slots
        assert new_metrics.ttft_s["p99"] <= ttft.limit_s
    assert any(run(trial.settings)[1].feasible for trial in trials)


def test_the_random_sampler_runs_the_defaults_but_no_rule_trials(tune, tmp_path: Path) -> None:
    """A random search is the reference the rules and TPE are measured against: after the
    engine's defaults (every ratio's reference) it runs only random points."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    slos = ("p99_tpot=11ms", "p99_ttft=1s")
    code, _, err = tune(*run_args(storage, 4, "--sampler", "random", slos=slos))
    assert code == 0, err
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[0].user_attrs.get("baseline")
    assert not any(t.user_attrs.get("rule") for t in trials)
    assert rules(plan_for(slos))  # TPE would have run them
    code, out, _ = tune("run", "--help")
    assert "random then runs random points only" in " ".join(out.split())  # the help says so


def test_a_client_limit_caps_the_bursts_peak() -> None:
    """Closed-loop load: no more requests are in flight than the client allows."""
    open_loop = burst_batch(plan_for())
    closed = build_plan(
        ENGINE,
        TraceSpec(AZURE, shaping=ShapeOptions(max_requests=150, max_concurrency=2)),
        DEFAULT_SPACE,
        slos=["p99_tpot=11ms", "p99_ttft=1s"],
    )
    assert open_loop is not None and open_loop > 2
    assert burst_batch(closed) == 2
    assert burst_batch(plan_for(("p99_ttft=1s",))) is None  # no TPOT SLO: no rule
