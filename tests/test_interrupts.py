"""``tune run`` stopped mid-trial (SIGKILL; SIGTERM or Ctrl-C, once or twice) and resumed:
nothing lost (the baseline runs again if it was the trial stopped), nothing left RUNNING; and a
resume with other options is refused, naming the option and both values."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.test_tuning_loop import run_args, stored

HANGING = Path(__file__).parent / "support" / "hanging_worker.py"


def _wait_until_inside(process: subprocess.Popen, marker: Path) -> None:
    """Poll until the hanging ``tune run`` has written its marker (it is where it hangs)."""
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None, "tune run ended before it got there"
        assert time.monotonic() < deadline, "tune run never got there"
        time.sleep(0.05)


def _stop_during_trial(
    storage: str, tmp_path: Path, nth_run: int, signals: tuple[str, ...], hang_in: str = "run"
) -> tuple[int, str]:
    """Start ``tune run`` whose ``nth_run`` engine run hangs (``hang_in="ask"``: whose
    ``nth_run`` trial hangs inside Optuna's ``ask``, RUNNING before any code of ours has it);
    once there, send the first signal (a second one, if given, lands during the clean-up)."""
    marker = tmp_path / "inside"
    env = {**os.environ, "HANG_IN": hang_in}
    if len(signals) == 2:
        env["SECOND_SIGNAL"] = signals[1]
    process = subprocess.Popen(
        [sys.executable, str(HANGING), str(marker), str(nth_run), *run_args(storage, 4)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        _wait_until_inside(process, marker)
        process.send_signal(signal.Signals[signals[0]])
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, err


@pytest.mark.parametrize(
    "signals",
    [("SIGKILL",), ("SIGTERM", "SIGTERM"), ("SIGINT", "SIGINT")],
    ids=["sigkill", "sigterm-twice", "ctrl-c-twice"],
)
def test_stopped_during_the_baseline_then_resumed(
    tune, tmp_path: Path, signals: tuple[str, ...]
) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, err = _stop_during_trial(storage, tmp_path, 1, signals)
    if signals[0] == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        assert code == 130 and "Traceback" not in err, err
        assert "interrupted: every finished trial is kept" in err
    study = optuna.load_study(study_name="s", storage=storage)
    expected = TrialState.RUNNING if signals[0] == "SIGKILL" else TrialState.FAIL
    assert [t.state for t in study.trials][:1] == [expected]

    code, out, err = tune(*run_args(storage, 4))
    assert code == 0, err
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    assert states.count(TrialState.COMPLETE) == 4
    _, trials = stored(storage)
    baselines = [t for t in trials if t.is_baseline]
    assert len(baselines) == 1  # the defaults ran after all, once
    retry = study.trials[baselines[0].trial_number]
    assert retry.user_attrs["retry_of"] == 0 and retry.params == study.trials[0].params
    assert "against the engine defaults" in out or "already the best" in out


@pytest.mark.parametrize(
    "signals",
    [("SIGKILL",), ("SIGTERM", "SIGTERM"), ("SIGINT",)],
    ids=["sigkill", "sigterm-twice", "ctrl-c"],
)
def test_stopped_inside_optunas_ask_the_baseline_runs_on_resume(
    tune, tmp_path: Path, signals: tuple[str, ...]
) -> None:
    """Optuna makes the queued baseline RUNNING inside ``ask``, before our objective has it
    (and before its parameters are suggested): a stop there left it RUNNING for ever, or
    queued again without its parameters, and the resume never ran the engine's defaults."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, err = _stop_during_trial(storage, tmp_path, 1, signals, hang_in="ask")
    if signals[0] == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        assert code == 130 and "Traceback" not in err, err
    study = optuna.load_study(study_name="s", storage=storage)
    expected = TrialState.RUNNING if signals[0] == "SIGKILL" else TrialState.FAIL
    assert study.trials[0].state == expected
    defaults = study.trials[0].system_attrs["fixed_params"]

    code, out, err = tune(*run_args(storage, 4))
    assert code == 0, err
    assert "trial 0 did not finish in an earlier run and runs again" in err
    study = optuna.load_study(study_name="s", storage=storage)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and states.count(TrialState.COMPLETE) == 4
    _, trials = stored(storage)
    baselines = [t for t in trials if t.is_baseline]
    assert len(baselines) == 1
    assert study.trials[baselines[0].trial_number].params == defaults
    assert "against the engine defaults" in out or "already the best" in out


def test_a_second_run_of_a_running_study_is_refused(tune, tmp_path: Path) -> None:
    """Two ``tune run``s of one study would each run its --trials (22 of a 12-trial study):
    the second is refused before any trial while the first runs, and runs once it is gone
    (killed: the lock is the operating system's, so it ends with the process)."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    marker = tmp_path / "inside"
    process = subprocess.Popen(
        [sys.executable, str(HANGING), str(marker), "2", *run_args(storage, 4)],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_until_inside(process, marker)
        before = len(optuna.load_study(study_name="s", storage=storage).trials)
        code, _, err = tune(*run_args(storage, 4))
        assert code == 2, err
        assert f"study 's' is being run by another process (pid {process.pid} on host" in err
        assert len(err.strip().splitlines()) == 1, err
        assert len(optuna.load_study(study_name="s", storage=storage).trials) == before
    finally:
        process.kill()
        process.wait()
    code, _, err = tune(*run_args(storage, 4))
    assert code == 0, err
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 4


def test_a_stop_a_finalizer_swallowed_still_stops(tmp_path: Path) -> None:
    """A KeyboardInterrupt raised while Python runs a finalizer is printed and dropped: the
    command went on to its end (exit 0) after a Ctrl-C. The process's stop handler raises
    it again once out of the finalizer, and prints no traceback."""
    script = tmp_path / "swallowed.py"
    script.write_text(
        "import gc, os, signal, sys\n"
        "from prefill_tuner.stopping import install_for_process\n"
        "install_for_process()\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        for _ in range(1000):\n"
        "            pass\n"
        "try:\n"
        "    Finalized()\n"
        "    gc.collect()\n"
        "    for step in range(2000):\n"
        "        signal.sigtimedwait([signal.SIGUSR1], 0.01)\n"
        "    print('went on to the end')\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "stopped", (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr


def test_stopped_mid_study_reruns_the_interrupted_settings(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _ = _stop_during_trial(storage, tmp_path, 3, ("SIGTERM",))
    assert code == 130
    interrupted = optuna.load_study(study_name="s", storage=storage).trials[2]
    assert interrupted.state == TrialState.FAIL
    code, _, err = tune(*run_args(storage, 4))
    assert code == 0, err
    trials = optuna.load_study(study_name="s", storage=storage).trials
    retries = [t for t in trials if t.user_attrs.get("retry_of") == 2]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == interrupted.params


@pytest.mark.parametrize(
    ("option", "first", "second", "says"),
    [
        (
            "--error-budget",
            "0",
            "0.05",
            "--error-budget: the study has 0.0, this command gives 0.05",
        ),
        (
            "--space",
            "max_num_seqs=8..64",
            "max_num_seqs=8..128",
            "max_num_seqs: 8..64 (log scale)",
        ),
        ("--set", "max_model_len=8192", "max_model_len=4096", "--set: the study has"),
        (
            "--max-concurrency",
            "4",
            "8",
            "--max-concurrency: the study has 4, this command gives 8",
        ),
    ],
)
def test_a_resume_with_other_options_is_refused(
    tune, tmp_path: Path, option: str, first: str, second: str, says: str
) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(*run_args(storage, 2, option, first))
    assert code == 0, err
    code, _, err = tune(*run_args(storage, 3, option, second))
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1, err
    code, _, err = tune(*run_args(storage, 3, option, first))  # the same options resume
    assert code == 0, err


def test_a_ctrl_c_while_the_command_line_loads_is_an_interrupt() -> None:
    """Ctrl-C in the second ``tune`` spends importing (made certain: the import of optuna
    raises it) ends as any interrupt does, one line and exit code 130, not a traceback."""
    code = (
        "import sys\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'optuna':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "sys.argv = ['tune', 'studies']\n"
        "from prefill_tuner.entry import main\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "error: interrupted\n")
