"""A night stopped mid-search (a systemd or Kubernetes timeout sends SIGINT/SIGTERM) never
wedges the schedule: the same night run again resumes its generation; the next night, on a new
trace, supersedes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefill_tuner.cli import display
from prefill_tuner.nightly.retune import EXIT_CODES

from tests.test_nightly import nightly, nights
from tests.test_nightly import traces as traces_fixture  # noqa: F401 (registers "traces")


def interrupt_after(monkeypatch: pytest.MonkeyPatch, trials: int) -> None:
    original = display.ProgressDisplay._trial
    seen = {"n": 0}

    def stop(self, result) -> None:
        original(self, result)
        seen["n"] += 1
        if seen["n"] == trials:
            raise KeyboardInterrupt

    monkeypatch.setattr(display.ProgressDisplay, "_trial", stop)


def test_an_interrupted_night_is_resumed_or_superseded(
    tune,
    traces: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage = f"sqlite:///{tmp_path / 'nights.db'}"
    code, _, err = nightly(tune, traces, storage, "monday")
    assert code in EXIT_CODES.values(), err
    with monkeypatch.context() as patch:
        interrupt_after(patch, 3)
        code, _, err = nightly(tune, traces, storage, "tuesday")
    assert code == 130 and "interrupted" in err
    # The same night again: generation 2 goes on where it stopped.
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)
        code, _, err = nightly(tune, traces, storage, "tuesday")
    assert code == 130 and "resuming generation 2, which was interrupted" in err
    # The next night, on another trace: generation 2 is superseded, not a wall.
    code, out, err = nightly(tune, traces, storage, "monday")
    assert code in EXIT_CODES.values(), err
    assert "generation 2 was interrupted and is superseded by generation 3" in err
    assert "--trace: the study has sha256" in err
    assert "generation 3 (prod-g3)" in out
    # And every night after that runs too.
    code, out, err = nightly(tune, traces, storage, "tuesday")
    assert code in EXIT_CODES.values(), err
    assert "generation 4 (prod-g4)" in out
    assert [n.generation for n in nights(storage)] == [1, 3, 4]
