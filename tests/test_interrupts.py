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

HANGING = Path(__file__).with_name("hanging_worker.py")


def _stop_during_trial(
    storage: str, tmp_path: Path, nth_run: int, signals: tuple[str, ...]
) -> tuple[int, str]:
    """Start ``tune run`` whose ``nth_run`` engine run hangs; once inside it, send the first
    signal (a second one, if given, lands during the clean-up)."""
    marker = tmp_path / "inside"
    env = dict(os.environ)
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
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None, "tune run ended before the trial"
            assert time.monotonic() < deadline, "tune run never reached the trial"
            time.sleep(0.05)
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
