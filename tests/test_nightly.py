"""``tune nightly`` on the simulator: the same trace twice keeps the incumbent, a changed trace
with a better configuration promotes it (exit code 3), a new engine version forces the
incumbent's re-measurement, and every night is recorded on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from prefill_tuner.cli import display
from prefill_tuner.engines.sim.cost_model import PROFILES_DIR
from prefill_tuner.nightly.retune import EXIT_CODES, EXIT_KEPT, EXIT_PROMOTED, unavailable_settings
from prefill_tuner.search_spaces.space import EngineCapabilities
from prefill_tuner.storage.models import NightlyRun
from prefill_tuner.storage.store import TunerStore

SLOS = ("--slo", "p99_tpot=100ms", "--slo", "p99_ttft=5s")


@pytest.fixture
def traces(tmp_path: Path, tune) -> Path:
    # Monday is busy enough that the defaults are not the only Pareto-optimal setting.
    for name, mix, rate in (
        ("monday", "interactive=1", "8"),
        ("tuesday", "interactive=8,longdoc-16k=1", "4"),
    ):
        code, _, err = tune(
            "trace", "synth", str(tmp_path / f"{name}.jsonl"), "--mix", mix,
            "--rate", rate, "--duration", "90", "--seed", "2",
        )  # fmt: skip
        assert code == 0, err
    return tmp_path


def nightly(tune, folder: Path, storage: str, trace: str, *extra: str) -> tuple[int, str, str]:
    return tune(
        "nightly", "--study", "prod", "--trace", str(folder / f"{trace}.jsonl"), *SLOS,
        "--trials", "15", "--storage", storage, "--report-dir", str(folder / "reports"), *extra,
    )  # fmt: skip


def nights(storage: str) -> list[NightlyRun]:
    store = TunerStore(storage)
    with store.session() as session:
        return list(session.query(NightlyRun).order_by(NightlyRun.generation))


def check_same_trace_keeps_changed_trace_promotes(tune, traces: Path, storage: str) -> None:
    reports = traces / "reports" / "prod"
    code, out, err = nightly(tune, traces, storage, "monday")
    assert code == EXIT_PROMOTED, err  # the first night deploys its best configuration
    assert "no incumbent yet" in out
    first_yaml = (reports / "serve.yaml").read_text()
    code, out, err = nightly(tune, traces, storage, "monday")
    assert code == EXIT_KEPT, err
    # The previous Pareto set and the incumbent, less the baseline (queued already, not counted).
    assert "keep:" in out and "warm start: 1 configuration of" in err
    assert (reports / "serve.yaml").read_text() == first_yaml
    code, out, err = nightly(tune, traces, storage, "tuesday")
    assert code == EXIT_PROMOTED, out + err
    assert "more headroom in every run" in out
    assert (reports / "serve.yaml").read_text() != first_yaml
    recorded = nights(storage)
    assert [n.decision for n in recorded] == ["promote", "keep", "promote"]
    assert [n.study_name for n in recorded] == ["prod-g1", "prod-g2", "prod-g3"]
    third = recorded[2]
    assert third.incumbent == recorded[1].deployed == recorded[0].deployed
    assert third.deployed == third.challenger != third.incumbent
    assert third.challenger_runs[0]["headroom"] > third.incumbent_runs[0]["headroom"] + 0.05
    report = Path(third.report_path).read_text()
    assert "**Decision: PROMOTE**" in report
    assert "| requests | " in report and "## The promotion rule" in report
    assert third.serve_command in report and third.serve_command in out
    deployed = yaml.safe_load((reports / "serve.yaml").read_text())
    assert deployed["max-num-seqs"] == third.deployed["max_num_seqs"]


@pytest.mark.slow
def test_same_trace_keeps_and_a_changed_trace_promotes(tune, traces: Path) -> None:
    check_same_trace_keeps_changed_trace_promotes(tune, traces, f"sqlite:///{traces / 'n.db'}")


@pytest.mark.slow
def test_the_same_on_postgresql(tune, traces: Path, postgres_url: str) -> None:
    check_same_trace_keeps_changed_trace_promotes(tune, traces, postgres_url)


@pytest.mark.slow
def test_a_new_engine_version_forces_the_incumbent_to_be_measured_again(tune, traces: Path) -> None:
    storage = f"sqlite:///{traces / 'n.db'}"
    assert nightly(tune, traces, storage, "monday")[0] == EXIT_PROMOTED
    # The same engine under another version: a renamed copy of the shipped profile.
    profile = yaml.safe_load((PROFILES_DIR / "llama-3.1-8b-h100.yaml").read_text())
    profile["name"] = "llama-3.1-8b-h100-rev2"
    (traces / "rev2.yaml").write_text(yaml.safe_dump(profile))
    code, out, err = nightly(
        tune, traces, storage, "monday", "--profile", str(traces / "rev2.yaml")
    )
    assert code == EXIT_KEPT, err
    assert "engine changed" in err and "re-measuring the incumbent" in err
    assert "keep:" in out
    report = Path(nights(storage)[-1].report_path).read_text()
    assert "A new engine version" in report and "rev2" in report


def test_settings_a_new_version_refuses_make_the_incumbent_unrunnable() -> None:
    flags = frozenset({"--max-num-seqs", "--max-num-batched-tokens"})
    engine = SimpleNamespace(
        capabilities=EngineCapabilities(engine="vllm", version="9.9", accepted_flags=flags)
    )
    assert unavailable_settings({"max_num_seqs": 64}, engine) == ""  # type: ignore[arg-type]
    reason = unavailable_settings(
        {"max_num_seqs": 64, "long_prefill_token_threshold": 512},
        engine,  # type: ignore[arg-type]
    )
    assert "does not accept --long-prefill-token-threshold" in reason


def test_bad_input_is_one_line(tune, traces: Path) -> None:
    code, _, err = tune(
        "nightly", "--study", "prod", "--trace", str(traces / "missing.jsonl"), *SLOS,
        "--storage", f"sqlite:///{traces / 'n.db'}",
    )  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "missing.jsonl" in err


# --- an interrupted night (a systemd or Kubernetes timeout) never wedges the schedule ----
def interrupt_after(monkeypatch: pytest.MonkeyPatch, trials: int) -> None:
    original = display.ProgressDisplay._trial
    seen = {"n": 0}

    def stop(self, result) -> None:
        original(self, result)
        seen["n"] += 1
        if seen["n"] == trials:
            raise KeyboardInterrupt

    monkeypatch.setattr(display.ProgressDisplay, "_trial", stop)


@pytest.mark.slow
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


def test_incumbent_and_challenger_are_shown_on_tonights_busiest_window(tune, traces: Path) -> None:
    """Issue 29: the report shows both on tonight's busiest window, measured as the night's
    runs are (the window is the busiest stretch: its runs are what the simulator gives there)."""
    storage = f"sqlite:///{traces / 'busy.db'}"
    code, _, err = nightly(tune, traces, storage, "monday", "--trials", "4")
    assert code == EXIT_PROMOTED, err
    code, _, err = nightly(
        tune, traces, storage, "tuesday", "--trials", "4", "--judge-window", "busiest:20"
    )
    assert code in EXIT_CODES.values(), err
    second = nights(storage)[1]
    busiest = second.busiest
    assert busiest is not None and busiest["window"] == "busiest:20"
    assert len(busiest["incumbent_runs"]) == 1
    assert len(busiest["challenger_runs"]) == (1 if second.challenger else 0)
    report = Path(second.report_path).read_text()
    assert "### On tonight's busiest window (busiest:20" in report
    assert "| incumbent | " in report.split("### On tonight's busiest window")[1]
    # The first night had no window given: the busiest quarter of its arrivals' span (~90 s).
    first = nights(storage)[0]
    assert first.busiest is not None and first.busiest["incumbent_runs"] == []
    assert 20 < float(first.busiest["window"].removeprefix("busiest:")) <= 22.5
