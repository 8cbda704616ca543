"""Deployable recommendations (issue 29): the headroom checks of the best settings
(tuner/study/headroom.py), the windows a study also judges trials on (tuner/study/windows.py),
and what the outputs say about them."""

from __future__ import annotations

import gc
import json
import math
import weakref
from dataclasses import replace
from pathlib import Path

import pytest

from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.storage.store import TunerStore, _json_safe
from prefill_tuner.study.evaluation import verdict_of
from prefill_tuner.study.headroom import (
    Candidate,
    Check,
    HeadroomReport,
    Neighbour,
    choose,
    neighbours,
)
from prefill_tuner.study.summary import stored_headroom, summarize_stored
from prefill_tuner.study.windows import judge_windows
from prefill_tuner.trace import ShapeOptions, load_trace
from prefill_tuner.trace.model import Request, Trace
from prefill_tuner.trace.shaping import busiest_window, scale_rate
from tests.conftest import MOONCAKE

SHAPING = ["--dequantize", "auto", "--duration", "60", "--rate-scale", "0.1"]
SMALL = ["--trace", str(MOONCAKE), *SHAPING, "--set", "max_model_len=32768"]
SLOS = ["--slo", "p99_tpot=30ms", "--slo", "p99_ttft=5s"]


def check(what: str, meets: bool, rate: float = 1.0, worst: float = 0.9) -> Check:
    return Check(what, {}, rate, meets, worst if meets else 1.1, "p99_tpot")


def candidate(number: int, *, neighbours_meet: bool = True, load: float = 2.0) -> Candidate:
    near = [check("max_num_batched_tokens ×1.25", neighbours_meet), check("x", True)]
    loads = [check(f"load ×{r:g}", r <= load, r) for r in (1.25, 1.5, 2.0) if r <= load]
    if load < 2.0:
        loads.append(check("load ×next", False, min(r for r in (1.25, 1.5, 2.0) if r > load)))
    return Candidate(number, near, loads, 0.5 + number / 100, {"p99_tpot": 0.02})


def test_neighbours_move_each_unfixed_knob_a_step_and_are_repaired() -> None:
    settings = {"max_num_batched_tokens": 1000, "max_num_seqs": 100, "enable_chunked_prefill": True}
    moves = moved_to(neighbours(settings, {}, 32768))
    assert moves["max_num_batched_tokens ×0.8"]["max_num_batched_tokens"] == 800
    assert moves["max_num_batched_tokens ×1.25"]["max_num_batched_tokens"] == 1250
    assert moves["max_num_seqs ×0.8"]["max_num_seqs"] == 80
    assert moves["max_num_seqs ×1.25"]["max_num_seqs"] == 125
    assert {k for m in moves.values() for k in m} == set(settings)
    # A fixed knob stays; a move that the rules undo is left out (seqs can't pass the budget).
    fixed = moved_to(neighbours(settings, {"max_num_seqs": 100}, 32768))
    assert set(fixed) == {"max_num_batched_tokens ×0.8", "max_num_batched_tokens ×1.25"}
    tight = {"max_num_batched_tokens": 100, "max_num_seqs": 100}
    moved = moved_to(neighbours(tight, {}, 32768))
    assert "max_num_seqs ×1.25" not in moved  # repaired back to 100: the setting itself
    assert moved["max_num_batched_tokens ×0.8"] == {
        "max_num_batched_tokens": 80,
        "max_num_seqs": 80,
    }


def moved_to(found: list[Neighbour]) -> dict[str, dict]:
    return {n.what: n.settings for n in found if n.settings is not None}


def test_every_searched_knob_the_pick_uses_is_moved_and_a_refused_move_says_why() -> None:
    """Issue 46: a pick with chunked prefill off and a 128-token threshold depended on the
    threshold (64 broke the TPOT SLO) where no check looked, and its budget's ×0.8 cannot run
    (vLLM wants the budget ≥ max_model_len without chunking): both now show."""
    searched = [
        "max_num_batched_tokens",
        "max_num_seqs",
        "enable_chunked_prefill",
        "long_prefill_token_threshold",
        "scheduler_reserve_full_isl",
        "watermark",
    ]
    pick = {
        "max_num_batched_tokens": 32768,
        "max_num_seqs": 64,
        "enable_chunked_prefill": False,
        "long_prefill_token_threshold": 128,
        "scheduler_reserve_full_isl": True,
        "watermark": 0.0,
    }
    found = neighbours(pick, {}, 32768, searched)
    moves = moved_to(found)
    assert moves["long_prefill_token_threshold ×0.5"]["long_prefill_token_threshold"] == 64
    assert moves["long_prefill_token_threshold ×2"]["long_prefill_token_threshold"] == 256
    assert "max_num_batched_tokens ×1.25" in moves
    refused = {n.what: n.why for n in found if n.settings is None}
    assert list(refused) == ["max_num_batched_tokens ×0.8"]
    assert "must be at least max_model_len (32768)" in refused["max_num_batched_tokens ×0.8"]
    # Off, a threshold or share is not used: not moved; booleans are not moved either.
    assert not any(n.what.startswith(("watermark", "enable_", "scheduler_")) for n in found)
    on = moved_to(neighbours({**pick, "watermark": 0.01}, {}, 32768, ["watermark"]))
    assert [m["watermark"] for m in on.values()] == [0.005, 0.02]
    # A small count still moves a whole unit each way.
    cadence = moved_to(
        neighbours({"prefill_schedule_interval": 2}, {}, 32768, ["prefill_schedule_interval"])
    )
    assert [m["prefill_schedule_interval"] for m in cadence.values()] == [1, 3]


def test_the_first_safe_candidate_wins_over_the_rules_pick_on_an_edge() -> None:
    edge, safe = candidate(1, neighbours_meet=False), candidate(2)
    assert choose([edge, safe], None) is safe
    assert choose([safe, edge], None) is safe
    # Safe needs 1.25x the load too.
    light = candidate(1, load=1.0)
    assert choose([light, safe], None) is safe
    # Nothing safe: the first that meets its neighbours, else the rule's pick.
    assert choose([edge, light], None) is light
    assert choose([edge, candidate(2, neighbours_meet=False)], None) is edge


def test_a_required_margin_is_a_constraint() -> None:
    modest, strong = candidate(1, load=1.25), candidate(2, load=2.0)
    assert choose([modest, strong], None) is modest
    assert choose([modest, strong], 1.5) is strong
    report = HeadroomReport("sim", 3.0, 1, 1, [modest, strong], finished=5)
    assert not report.margin_met
    assert any("NO candidate carries it" in line for line in report.lines())
    # Issue 46: it says the best margin any checked setting carries, and what would carry it.
    short = next(line for line in report.lines() if line.startswith("no setting checked"))
    assert "carries 3× this trace's rate" in short
    assert "the most any carries is 2× (trial 2)" in short and "tune plan" in short


def test_with_no_margin_asked_it_says_when_no_checked_setting_is_safe() -> None:
    """No margin required: when no checked setting carries 1.25× the load, the statement says
    so (and the most any carries), instead of only that no candidate is safer."""
    tight = HeadroomReport("sim", None, 1, 1, [candidate(1, load=1.0)], finished=5)
    lines = tight.lines()
    assert any(
        "no setting checked carries 1.25× this trace's rate" in line
        and "none carries more load than this trace's" in line
        for line in lines
    ), lines
    edge = HeadroomReport(
        "sim", None, 1, 1, [candidate(1, neighbours_meet=False, load=1.5)], finished=5
    )
    assert any("no candidate within 20% of it is safer" in line for line in edge.lines())


def test_the_report_states_the_trade_and_survives_storage() -> None:
    edge, safe = candidate(1, neighbours_meet=False), candidate(2, load=1.5)
    report = HeadroomReport("the simulator", None, 1, 2, [edge, safe], finished=9)
    lines = report.lines()
    assert "trial 2" in lines[0] and "up to 1.5× this trace's rate (not at 2×)" in lines[0]
    assert "chosen over trial 1" in lines[1]
    assert "misses them at max_num_batched_tokens ×1.25" in lines[1]
    # Storage keeps no infinity (null) and JSON makes tuples lists: read back the same.
    failed = replace(edge, loads=[Check("load ×1.25", {}, 1.25, False, math.inf, "errors")])
    report = replace(report, candidates=[failed, safe])
    stored = json.loads(json.dumps(_json_safe(report.as_dict())))
    assert HeadroomReport.from_dict(stored) == report


def test_busiest_window_is_the_stretch_with_the_most_work() -> None:
    quiet = [Request(f"q{i}", float(i * 10), 100, 10) for i in range(30)]
    burst = [Request(f"b{i}", 150.0 + i * 0.5, 2000, 100) for i in range(20)]
    trace = Trace(tuple(sorted(quiet + burst, key=lambda r: r.arrival_s)))
    start, window = busiest_window(trace, 10)
    assert start == 150.0
    assert len(window) == 20 + 1  # the burst and the quiet arrival at 150
    assert window.requests[0].arrival_s == 0.0
    # Longer than the trace: the whole of it.
    assert busiest_window(trace, 1e6) == (0.0, trace)


def test_a_run_states_headroom_that_reruns_confirm(tune, tmp_path: Path) -> None:
    """Every recommendation states its headroom, and what it states is what the simulator
    measures when run again; the stored checks are shown by `tune pareto` without running
    them again, and a resume with more trials checks again."""
    storage = f"sqlite:///{tmp_path / 't.db'}"
    code, out, err = tune(
        "run", *SMALL, *SLOS, "--trials", "8", "--storage", storage, "--study", "s", "--json"
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    headroom = doc["headroom"]
    assert headroom["recommended"] == doc["recommended"]["number"]
    assert any("headroom (trial" in line for line in headroom["statement"])
    chosen = next(c for c in headroom["candidates"] if c["trial"] == headroom["recommended"])
    recommended = doc["recommended"]["settings"]
    searched = [
        name for name, knob in KNOBS.items() if knob.searched_by_default and not knob.v0_only
    ]
    expected = neighbours(recommended, {"max_model_len": 32768}, 32768, searched)
    assert [n["what"] for n in chosen["neighbours"]] == [
        n.what for n in expected if n.settings is not None
    ]
    assert len(expected) >= 3  # only a move the rules undo is left out
    trace = load_trace(
        str(MOONCAKE),
        options=ShapeOptions(
            dequantize_s="auto", duration_s=60, rate_scale=0.1, max_model_len=32768
        ),
    )
    engine = SimEngine(load_profile("llama-3.1-8b-h100"))
    slos = parse_slos(["p99_tpot=30ms", "p99_ttft=5s"])
    for stated in chosen["neighbours"] + chosen["loads"]:
        run = engine.run(scale_rate(trace, stated["rate"]), stated["settings"])
        assert verdict_of(run, slos, 0.0).feasible == stated["meets"], stated["what"]
    # Stored: shown again as it was.
    code, out, err = tune("pareto", "--study", "s", "--storage", storage, "--json")
    assert code == 0, err
    assert json.loads(out)["headroom"] == headroom
    code, out, err = tune("pareto", "--study", "s", "--storage", storage, "--explain")
    assert "headroom (trial" in out and "headroom rule:" in out
    # A trial more makes the stored checks stale (not shown as current); the run rechecks.
    store = TunerStore(storage)
    record = store.get_study("s")
    assert record is not None and record.headroom is not None
    assert stored_headroom(record, record.headroom["finished"] + 1, []) is None
    code, out, err = tune(
        "run", *SMALL, *SLOS, "--trials", "9", "--storage", storage, "--study", "s"
    )
    assert code == 0, err
    summary = summarize_stored(TunerStore(storage), "s")
    assert summary.headroom is not None and summary.headroom.finished == 9


def test_off_says_the_headroom_was_not_checked(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    code, out, err = tune(
        "run", *SMALL, *SLOS, "--trials", "4", "--storage", storage, "--headroom-check", "off"
    )  # fmt: skip
    assert code == 0, err
    assert "headroom: not checked" in out


def test_an_unmet_margin_exits_4_and_says_so(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    code, out, err = tune(
        "run", *SMALL, *SLOS, "--trials", "4", "--storage", storage, "--headroom", "64"
    )  # fmt: skip
    assert code == 4, err
    assert "required load margin 64×: NO candidate carries it" in out


def test_judge_windows_join_the_verdict(tune, tmp_path: Path) -> None:
    """A trial meets the SLOs only on the whole trace and its busiest window; the window's
    constraints and statistics are stored with it; a resume with another window is refused."""
    storage = f"sqlite:///{tmp_path / 't.db'}"
    args = ["run", *SMALL, *SLOS, "--trials", "4", "--storage", storage, "--study", "w"]
    code, _, err = tune(*args, "--judge-window", "busiest:15")
    assert code in (0, 4), err
    store = TunerStore(storage)
    record = store.get_study("w")
    assert record is not None
    trials = store.trials(record)
    trace = load_trace(
        str(MOONCAKE),
        options=ShapeOptions(
            dequantize_s="auto", duration_s=60, rate_scale=0.1, max_model_len=32768
        ),
    )
    (window,) = judge_windows(trace, ["busiest:15"])
    engine = SimEngine(load_profile("llama-3.1-8b-h100"))
    slos = parse_slos(["p99_tpot=30ms", "p99_ttft=5s"])
    for trial in trials:
        assert "p99_tpot@busiest:15" in trial.constraints
        judged = trial.metrics["details"]["windows"]["busiest:15"]
        alone = verdict_of(engine.run(window.trace, trial.settings), slos, 0.0).feasible
        assert judged["feasible"] == alone
        whole = all(v <= 0 for k, v in trial.constraints.items() if "@" not in k)
        assert trial.feasible == (whole and alone)
    code, _, err = tune(*args, "--judge-window", "busiest:20")
    assert code == 2 and "--judge-window" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--headroom", "0"),
        ("--headroom", "-1"),
        ("--headroom", "1"),
        ("--headroom", "nan"),
        ("--headroom", "inf"),
        ("--headroom", "1e309"),
        ("--headroom", "65"),
        ("--headroom-check", "maybe"),
        ("--judge-window", ""),
        ("--judge-window", "busiest:0"),
        ("--judge-window", "busiest:-5"),
        ("--judge-window", "busiest:nan"),
        ("--judge-window", "busiest:inf"),
        ("--judge-window", "busiest:1e309"),
        ("--judge-window", "30..10"),
        ("--judge-window", "busiest"),
        ("--judge-window", "9000..9100"),
    ],
)
def test_bad_headroom_and_window_values_are_one_line_errors(
    tune, tmp_path: Path, flag: str, value: str
) -> None:
    storage = tmp_path / "s.db"
    code, out, err = tune("run", *SMALL, *SLOS, "--storage", f"sqlite:///{storage}", flag, value)
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert flag in err and "Traceback" not in out + err
    assert not storage.exists() or not TunerStore(f"sqlite:///{storage}").study_names()


def test_a_met_margin_is_carried_by_the_recommendation(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 't.db'}"
    code, out, err = tune(
        "run", *SMALL, *SLOS, "--trials", "6", "--storage", storage, "--headroom", "1.4", "--json"
    )  # fmt: skip
    assert code == 0, err
    headroom = json.loads(out)["headroom"]
    assert headroom["margin"] == 1.4 and headroom["margin_met"]
    chosen = next(c for c in headroom["candidates"] if c["trial"] == headroom["recommended"])
    assert chosen["load"] >= 1.4
    assert any(c["rate"] == 1.4 and c["meets"] for c in chosen["loads"])  # the margin itself ran


def test_the_simulator_does_not_run_a_max_num_seqs_it_never_reaches_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Settings that differ from an earlier run's only in a ``max_num_seqs`` above the most
    requests that run had running give that run: the engine returns it, under the new
    config, without simulating (the headroom checks' ``max_num_seqs`` neighbours, most
    often); a limit the run reached, another trace object or another client limit is
    simulated."""
    from prefill_tuner.engines.sim import trial_engine

    peaks: list[int] = []
    simulate = trial_engine.simulate

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = simulate(*args, **kwargs)
        peaks.append(result.peak_running)
        return result

    monkeypatch.setattr(trial_engine, "simulate", counted)
    trace = load_trace(
        str(MOONCAKE),
        options=ShapeOptions(
            dequantize_s="auto", duration_s=60, rate_scale=0.1, max_model_len=32768
        ),
    )
    profile = load_profile("llama-3.1-8b-h100")
    engine = SimEngine(profile)
    settings = {"max_model_len": 32768, "max_num_batched_tokens": 2048, "max_num_seqs": 256}
    first = engine.run(trace, settings)
    (peak,) = peaks
    assert 1 < peak < 256
    for limit in (peak + 1, 2048):
        again = engine.run(trace, {**settings, "max_num_seqs": limit})
        assert len(peaks) == 1, limit
        assert again.metrics == first.metrics and again.metrics is not first.metrics
        assert again.resolved_config == {**first.resolved_config, "max_num_seqs": limit}
        assert again.details == first.details and again.details is not first.details
        assert again.failure == first.failure and again.version == first.version
    fresh = SimEngine(profile).run(trace, {**settings, "max_num_seqs": peak + 1})
    assert fresh.metrics == first.metrics  # what it returned is what simulating gives
    engine.run(trace, {**settings, "max_num_seqs": peak})  # reached: it may bind
    other = replace(trace)  # an equal trace, another object
    engine.run(other, settings)
    engine.run(trace, settings, max_concurrency=4)
    assert len(peaks) == 5
    alive = weakref.ref(other)
    del other
    gc.collect()
    assert alive() is None  # what the engine remembers does not keep a trace alive
