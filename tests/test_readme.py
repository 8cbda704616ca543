"""The README's two commands are the ones that work: CI runs the second one verbatim."""

from __future__ import annotations

import re

from prefill_tuner import defaults
from tests.conftest import ROOT


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .*?)\n```", readme)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = _readme_commands()
    assert len(commands) == 2, "the README must open with exactly two setup commands"
    assert ci_lines[-1] == commands[1]


def test_main_job_is_the_card_command_on_the_bundled_sample() -> None:
    """The README's first command is the one users are told to type, and what it replays
    ships inside the package (not read from examples/, which a wheel does not have)."""
    main_job = _readme_commands()[0]
    assert main_job.endswith("tune run --slo p99_tpot=50ms")
    assert defaults.SAMPLE_TRACE.is_file()
    assert ROOT in defaults.SAMPLE_TRACE.parents  # the checkout's copy, shipped as package data
