"""Study names become file and folder names: one safe character set, checked everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefill_tuner.study.plan import default_study_name
from tests.conftest import AZURE

BAD = ["../escape", "a/b", "", ".hidden", "-flag", "x" * 101, "[bold red]x[/]", "name with space"]


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("command", ["run", "nightly", "worker", "pareto", "export"])
def test_an_unsafe_study_name_is_refused(tune, tmp_path: Path, command: str, name: str) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    args = [command, "--study", name, "--storage", storage]
    if command in ("run", "nightly"):
        args += ["--trace", str(AZURE), "--slo", "p99_tpot=50ms", "--max-requests", "20"]
    if command == "nightly":
        args += ["--report-dir", str(tmp_path / "reports")]
    code, out, err = tune(*args)
    assert code == 2, err
    assert err.startswith("error: --study") and err.count("\n") == 1, err
    assert "Traceback" not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no database, no report folder


def test_the_default_name_is_made_safe() -> None:
    assert default_study_name(Path("/x/my trace (1).csv"), "latency") == "my-trace-1-latency"
    assert default_study_name(Path("..csv"), "capacity") == "trace-capacity"
