"""The README's two commands are the ones that work: CI runs the second one verbatim."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(python3 -m venv .*?)\n```", readme)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = _readme_commands()
    assert len(commands) == 2, "the README must open with exactly two setup commands"
    assert ci_lines[-1] == commands[1]


def test_main_job_command_names_a_bundled_file() -> None:
    main_job = _readme_commands()[0]
    paths = [token for token in main_job.split() if token.startswith("examples/")]
    assert paths, "the README's main job should run on a bundled example"
    for path in paths:
        assert (ROOT / path).is_file(), f"the README's main job reads {path}, which is missing"
