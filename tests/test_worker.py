"""``tune worker``: several worker processes share one study on PostgreSQL, one is killed
mid-trial and its trial is retried; exactly the target of trials; one-line errors."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from prefill_tuner.storage.store import TunerStore
from tests.support.worker_support import STUDY, create_study, tiny_trace

HANGING_WORKER = Path(__file__).parent / "support" / "hanging_worker.py"
TRIALS = 40
HEARTBEAT, GRACE = 1, 5
"""Seconds: a dead worker's trial is retried GRACE seconds after its last heartbeat."""


def worker_args(storage: str, name: str) -> list[str]:
    return [
        "worker",
        "--study",
        STUDY,
        "--storage",
        storage,
        "--name",
        name,
        "--heartbeat",
        str(HEARTBEAT),
        "--grace",
        str(GRACE),
    ]


def wait_for(condition: Callable[[], bool], what: str, alive: list[subprocess.Popen]) -> None:
    """Poll a real condition; fail at once if a process it depends on has ended."""
    deadline = time.monotonic() + 60
    while not condition():
        assert all(p.poll() is None for p in alive), f"a worker ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_four_workers_share_a_study_and_retry_a_killed_workers_trial(
    tune, tmp_path: Path, postgres_url: str
) -> None:
    create_study(tune, postgres_url, tiny_trace(tmp_path), TRIALS)
    marker = tmp_path / "doomed-is-inside-a-trial"
    logs: dict[str, Path] = {}
    processes: dict[str, subprocess.Popen] = {}

    def start(name: str, command: list[str]) -> None:
        logs[name] = tmp_path / f"{name}.log"
        with logs[name].open("w") as log:
            processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    try:
        # The doomed worker finishes one trial alone, then hangs inside its second.
        start(
            "doomed",
            [
                sys.executable,
                str(HANGING_WORKER),
                str(marker),
                "2",
                *worker_args(postgres_url, "doomed"),
            ],
        )
        wait_for(marker.exists, "its second trial", [processes["doomed"]])
        study = optuna.load_study(study_name=STUDY, storage=postgres_url)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        assert [t.user_attrs["worker"] for t in running] == ["doomed"]
        killed = running[0].number
        names = [f"w{index}" for index in range(4)]
        for name in names:
            start(name, [sys.executable, "-m", "tuner", *worker_args(postgres_url, name)])

        def all_working() -> bool:
            claimed = {t.user_attrs.get("worker") for t in study.get_trials(deepcopy=False)}
            return set(names) <= claimed

        # Killed while the others run trials: its trial stays RUNNING until its heartbeat
        # is GRACE seconds old, then a survivor fails it and runs it again.
        wait_for(all_working, "all four claimed a trial", list(processes.values()))
        processes["doomed"].send_signal(signal.SIGKILL)
        assert processes["doomed"].wait(timeout=30) == -signal.SIGKILL
        for name in names:
            code = processes[name].wait(timeout=120)
            assert code == 0, logs[name].read_text()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    trials = optuna.load_study(study_name=STUDY, storage=postgres_url).trials
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == TRIALS
    assert len({t.number for t in trials}) == len(trials)
    assert [t.number for t in trials if t.state == TrialState.FAIL] == [killed]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    [retry] = [t for t in complete if t.system_attrs.get("failed_trial") == killed]
    assert retry.params == trials[killed].params
    assert retry.user_attrs["worker"] != "doomed"
    workers = {t.user_attrs["worker"] for t in complete}
    assert workers == {"doomed", "w0", "w1", "w2", "w3"}
    # The tuner's own records: one per COMPLETE trial.
    store = TunerStore(postgres_url)
    record = store.get_study(STUDY)
    assert record is not None
    recorded = [row.trial_number for row in store.trials(record)]
    assert recorded == sorted(t.number for t in complete)
    store.engine.dispose()
    output = "".join(logs[f"w{index}"].read_text() for index in range(4))
    assert f"(retry of trial {killed})" in output
    assert output.count(f"has its {TRIALS} trials") == 4


def test_bad_input_is_one_line_and_exit_code_2(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    trace = tiny_trace(tmp_path)
    create_study(tune, storage, trace, 3)
    args = ["worker", "--storage", storage, "--study"]
    for extra, words in [
        (["nope"], "no such study"),
        ([STUDY, "--engine", "tgi"], "runs on the sim engine"),
        ([STUDY, "--heartbeat", "5", "--grace", "5"], "--grace"),
        ([STUDY, "--trace", str(tmp_path / "missing.jsonl")], "cannot be read on this machine"),
    ]:
        code, _, err = tune(*args, *extra)
        assert code == 2 and err.startswith("error: ") and words in err, (extra, err)
        assert err.count("\n") == 1
    code, _, err = tune(
        "worker", "--study", STUDY, "--storage", "postgresql+psycopg://tuner:s3cret@127.0.0.1:1/x"
    )
    assert code == 2 and "tuner:***@127.0.0.1:1" in err and "s3cret" not in err
    trace.write_text(trace.read_text().replace('"output_length": 64', '"output_length": 65', 1))
    code, _, err = tune(*args, STUDY)
    assert code == 2 and "the file has changed" in err
    # A study recorded before workers existed says how to fix it.
    engine = create_engine(storage)
    with engine.begin() as connection:
        connection.execute(text("UPDATE tuner_studies SET definition = NULL"))
    engine.dispose()
    code, _, err = tune(*args, STUDY, "--trace", str(trace))
    assert code == 2 and "--create-only" in err


def test_a_worker_runs_the_study_to_its_target_then_others_stop_at_once(
    tune, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    trace = tiny_trace(tmp_path)
    create_study(tune, storage, trace, 5)
    copy = tmp_path / "elsewhere.jsonl"
    copy.write_bytes(trace.read_bytes())
    trace.unlink()  # another machine: the trace is somewhere else
    code, _, err = tune("worker", "--study", STUDY, "--storage", storage, "--trace", str(copy))
    assert code == 0, err
    assert "trial 0 started" in err and "trial 4 meets the SLOs" in err
    assert "has its 5 trials (5 run here)" in err
    code, _, err = tune("worker", "--study", STUDY, "--storage", storage, "--trace", str(copy))
    assert code == 0 and "has its 5 trials (0 run here)" in err
    # The command it names runs as printed (the storage included: it is not the default).
    printed = err.split("(0 run here); ")[1].split(" shows the results")[0]
    code, out, _ = tune(*shlex.split(printed)[1:])
    assert code == 0 and "Pareto-optimal" in out


def test_tune_run_create_only_again_raises_the_target(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    trace = tiny_trace(tmp_path)
    create_study(tune, storage, trace, 2)
    assert tune("worker", "--study", STUDY, "--storage", storage)[0] == 0
    create_study(tune, storage, trace, 4)  # the same study, a larger target
    code, _, err = tune("worker", "--study", STUDY, "--storage", storage)
    assert code == 0 and "has its 4 trials (2 run here)" in err


@pytest.mark.parametrize(
    "signals",
    [("SIGTERM",), ("SIGTERM", "SIGTERM"), ("SIGINT", "SIGINT")],
    ids=["sigterm", "sigterm-twice", "ctrl-c-twice"],
)
def test_a_stop_signal_fails_the_running_trial_and_queues_it_at_once(
    tune, tmp_path: Path, signals: tuple[str, ...]
) -> None:
    """Once or twice (the second lands during the clean-up, as systemd's second SIGTERM or a
    second Ctrl-C would): the trial is failed and queued again, nothing is left RUNNING."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    create_study(tune, storage, tiny_trace(tmp_path), 3, rule_trials=False)  # 3 trials in all
    marker = tmp_path / "inside-a-trial"
    command = [sys.executable, str(HANGING_WORKER), str(marker), "2"]
    env = dict(os.environ)
    if len(signals) == 2:
        env["SECOND_SIGNAL"] = signals[1]
    process = subprocess.Popen(
        [*command, *worker_args(storage, "stopped")], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        wait_for(marker.exists, "its second trial", [process])
        process.send_signal(signal.Signals[signals[0]])
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "interrupted: trial 1 marked failed and queued for another worker" in err
    assert "Traceback" not in err
    trials = optuna.load_study(study_name=STUDY, storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert trials[2].params == trials[1].params  # the next claim runs it, without waiting
