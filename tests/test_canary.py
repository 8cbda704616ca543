"""The whole CLI under a canary secret (a database password, in a URL and in $TUNE_STORAGE):
run, create-only, worker, pareto, export, report, studies, trials, nightly and their error
paths; the canary is nowhere
in what they print, in any file they write, or in any row of the database. (The real engine's
secrets, --api-key and HF_TOKEN, are planted the same way in tests/test_real_engine_study.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from tests.conftest import AZURE

CANARY = "pw-canary-5e1d9b"


def _with_password(url: str) -> str:
    """The same database with a password in the URL (trust authentication ignores it)."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{CANARY}@{host}"


def _database_text(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            names = inspect(connection).get_table_names()
            rows = [
                repr(row)
                for name in names
                for row in connection.execute(text(f'SELECT * FROM "{name}"'))
            ]
    finally:
        engine.dispose()
    return "\n".join(rows)


@pytest.mark.slow
def test_a_password_canary_is_found_nowhere(
    tune, tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret_url = _with_password(postgres_url)
    said: list[str] = []

    def run(*args: str, expect: int | None = 0) -> None:
        code, out, err = tune(*args)
        said.extend([out, err])
        if expect is not None:
            assert code == expect, err

    trace = ["--trace", str(AZURE), "--max-requests", "60", "--slo", "p99_tpot=50ms"]
    run("run", *trace, "--trials", "3", "--storage", secret_url, "--study", "c")
    run("pareto", "--storage", secret_url, "--study", "c")
    run("pareto", "--storage", secret_url, "--study", "c", "--json")
    run("report", "--storage", secret_url, "--study", "c", "-o", str(tmp_path / "c.html"))
    run("studies", "--storage", secret_url, "--json")
    run("trials", "--storage", secret_url, "--study", "c")
    for fmt in ("shell", "yaml", "json"):
        run("export", "--format", fmt, "-o", str(tmp_path / f"x.{fmt}"), "--storage", secret_url)
    # From the environment, as the README recommends, for workers.
    monkeypatch.setenv("TUNE_STORAGE", secret_url)
    run("run", *trace, "--trials", "4", "--study", "w", "--create-only")
    run("worker", "--study", "w", "--heartbeat", "1", "--grace", "5")
    monkeypatch.delenv("TUNE_NO_REPORT")  # the night's HTML report too
    run(
        "nightly", "--study", "n", *trace, "--trials", "3", "--repeats", "1",
        "--report-dir", str(tmp_path / "reports"), expect=None,
    )  # fmt: skip
    # Error paths: an unknown study, an unreachable server, a resume that is refused.
    run("pareto", "--study", "nope", expect=2)
    unreachable = secret_url.replace("127.0.0.1:5432", "127.0.0.1:1")
    run("pareto", "--storage", unreachable, "--study", "c", expect=None)
    run("run", *trace, "--trials", "3", "--study", "c", "--error-budget", "0.5", expect=2)

    assert len(list(tmp_path.rglob("*.html"))) == 2  # tune report's and the night's
    assert CANARY not in "\n".join(said)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert CANARY not in path.read_text(errors="replace"), path
    stored = _database_text(postgres_url)
    assert "p99_tpot=50ms" in stored and "vllm serve" in stored  # the rows were read
    assert CANARY not in stored
    assert "***" in "\n".join(said)  # the URL was shown, masked
