"""``--max-concurrency N`` (issue 28, item 4): closed-loop load from every command that replays
a trace, stored with the study like any shaping option (a resume with another value is
refused in test_interrupts.py), applied by the engine each trial runs on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefill_tuner.diagnosis.runs import trial_view
from prefill_tuner.engines.sim import SimConfig, load_profile
from prefill_tuner.engines.sim.replicas import simulate_replicas
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.objectives.metrics import summarize_run
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.trace import ShapeOptions, load_trace
from tests.conftest import AZURE

H100 = load_profile("llama-3.1-8b-h100")
BUSY = ["--trace", str(AZURE), "--max-requests", "120", "--rate-scale", "4"]
"""120 conversations at 4× their rate: a dozen in flight at once, open loop."""


def one_line_error(code: int, out: str, err: str) -> str:
    assert code == 2, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in out + err
    return err


def busy_trace():
    return load_trace(str(AZURE), options=ShapeOptions(max_requests=120, rate_scale=4))


def test_simulate_replays_closed_loop(tune) -> None:
    code, out, err = tune("simulate", *BUSY, "--max-concurrency", "4")
    assert code == 0, err
    assert "closed loop, at most 4 in flight:" in out and "waited for a slot" in out
    code, out, err = tune("simulate", *BUSY, "--max-concurrency", "4", "--json")
    assert code == 0, err
    closed = json.loads(out)
    code, out, err = tune("simulate", *BUSY, "--json")
    assert code == 0, err
    open_loop = json.loads(out)
    assert (closed["max_concurrency"], open_loop["max_concurrency"]) == (4, None)
    assert closed["requests_held"] > 0 and open_loop["requests_held"] == 0
    assert closed["metrics"]["duration_s"] > open_loop["metrics"]["duration_s"]


def test_run_stores_the_limit_and_its_trials_run_under_it(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", *BUSY, "--slo", "p99_tpot=50ms", "--trials", "3", "--storage", storage,
        "--study", "closed", "--max-concurrency", "4", "--no-report",
    )  # fmt: skip
    assert code == 0, err
    assert "load: closed loop, at most 4 requests in flight" in err
    store = TunerStore(storage)
    record = store.get_study("closed")
    assert record is not None and record.shaping["max_concurrency"] == 4
    trials = store.trials(record)
    assert len(trials) == 3 and all(t.shaping["max_concurrency"] == 4 for t in trials)
    # The baseline measured what the simulator gives under the limit, not the open loop's.
    baseline = next(t for t in trials if t.is_baseline)
    engine = SimEngine(H100)
    trace = busy_trace()
    closed = engine.run(trace, baseline.settings, max_concurrency=4).metrics
    open_loop = engine.run(trace, baseline.settings).metrics
    assert closed is not None and open_loop is not None
    stored = (baseline.metrics or {})["ttft_s"]["p99"]
    assert stored == pytest.approx(closed.ttft_s["p99"])
    assert stored != pytest.approx(open_loop.ttft_s["p99"])


def test_a_worker_replays_under_the_studys_limit(tune, tmp_path: Path) -> None:
    """A study created with a limit: its worker's trials are the ones ``tune run`` gets with
    the same limit (the simulator is deterministic), not the open loop's."""
    runs = {}
    for name, extra in (("created", ["--create-only"]), ("run", []), ("open", None)):
        storage = f"sqlite:///{tmp_path / f'{name}.db'}"
        limit = [] if extra is None else ["--max-concurrency", "3"]
        code, _, err = tune(
            "run", *BUSY, "--slo", "p99_tpot=50ms", "--trials", "2", "--storage", storage,
            "--study", "s", "--no-report", *limit, *(extra or []),
        )  # fmt: skip
        assert code == 0, err
        if name == "created":
            code, _, err = tune("worker", "--study", "s", "--storage", storage)
            assert code == 0, err
        store = TunerStore(storage)
        record = store.get_study("s")
        assert record is not None
        runs[name] = {t.trial_number: t.metrics["ttft_s"] for t in store.trials(record)}  # type: ignore[index]
    assert runs["created"] == runs["run"]
    assert runs["created"] != runs["open"]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "1e309", "2.5", "99999999999999999999"])
@pytest.mark.parametrize("command", ["run", "simulate", "plan"])
def test_a_limit_that_is_no_count_of_requests_is_refused(
    tune, tmp_path: Path, command: str, value: str
) -> None:
    storage = tmp_path / "s.db"
    study = (
        ["--slo", "p99_tpot=50ms", "--trials", "2", "--storage", f"sqlite:///{storage}"]
        if command != "simulate"
        else []
    )
    err = one_line_error(*tune(command, *BUSY, *study, f"--max-concurrency={value}"))
    assert "--max-concurrency" in err
    assert list(tmp_path.iterdir()) == [], "no study stored"


def test_trace_commands_take_no_limit(tune) -> None:
    """``tune trace`` shapes and converts traces; it replays none: no limit to take."""
    code, _, err = tune("trace", "stats", str(AZURE), "--max-concurrency", "4")
    assert code == 2 and "No such option: --max-concurrency" in err


def test_diagnosis_and_the_report_simulate_a_trial_again_under_its_limit(
    tune, tmp_path: Path
) -> None:
    """A stored simulated trial is simulated again for its findings and its report: under the
    study's limit, so that it is the run that was measured. Of several replicas (tune plan),
    the busiest one's share is simulated alone, each request arriving when the client sent
    it: exactly that replica's part of the run."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", *BUSY, "--slo", "p99_tpot=50ms", "--trials", "2", "--storage", storage,
        "--study", "closed", "--max-concurrency", "3", "--no-report",
    )  # fmt: skip
    assert code == 0, err
    store = TunerStore(storage)
    record = store.get_study("closed")
    assert record is not None
    for trial in store.trials(record):
        view = trial_view(record, trial)
        assert summarize_run(view.records).ttft_s == (trial.metrics or {})["ttft_s"]
    report = tmp_path / "closed.html"
    code, _, err = tune("report", "--study", "closed", "--storage", storage, "-o", str(report))
    assert code == 0, err
    assert "closed loop: at most 3 requests in flight" in report.read_text()
    code, _, err = tune(
        "plan", *BUSY, "--slo", "p99_tpot=7ms", "--trials", "2", "--max-replicas", "2",
        "--storage", storage, "--max-concurrency", "5",
    )  # fmt: skip
    assert code in (0, 4), err  # one replica misses p99_tpot=7ms: two are searched
    record = store.get_study("azure_conv_2023_head-plan-least-outstanding-2x")
    assert record is not None and record.shaping["max_concurrency"] == 5
    trial = store.trials(record)[0]
    view = trial_view(record, trial)
    resolved = trial.resolved_config
    config = SimConfig(**{k: v for k, v in resolved.items() if k in SimConfig.model_fields})
    routed = simulate_replicas(
        busy_trace(), config, H100, replicas=2, router="least-outstanding", max_concurrency=5
    )
    assert summarize_run(routed.result.records).ttft_s == (trial.metrics or {})["ttft_s"]
    busiest = max(range(2), key=lambda index: routed.replicas[index].busy_s)
    share = [
        record
        for record, home in zip(routed.result.records, routed.assignment, strict=True)
        if home == busiest
    ]
    assert view.records == share
