"""Types are checked, as CI runs the suite: mypy on the package as it installs (the import
root ``prefill_tuner``, built from the folders ``pyproject.toml`` maps under it), with the
project's ``[tool.mypy]``, finds nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _linked_package(into: Path) -> None:
    """``into/prefill_tuner`` as setuptools installs it: the root folder's entries, and each
    mapped subpackage in its place (links: mypy reads the repository's own files)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = config["tool"]["setuptools"]["package-dir"]
    package = into / "prefill_tuner"
    package.mkdir()
    for entry in (ROOT / folders["prefill_tuner"]).iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in folders.items():
        if name != "prefill_tuner":
            (package / name.removeprefix("prefill_tuner.")).symlink_to(ROOT / folder)


@pytest.mark.slow
def test_the_package_type_checks(tmp_path: Path) -> None:
    _linked_package(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "-p",
            "prefill_tuner",
        ],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
