"""The package as users install it: one import root, every folder and data file shipped, no
import circle, commands that never import each other; and a wheel installed into a fresh
virtual environment, beside a distribution with a top-level ``storage`` package, that runs the
README's first command from outside the checkout."""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.conftest import ROOT

ROOT_PACKAGE = "prefill_tuner"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _modules() -> dict[str, Path]:
    """Every module of the package, by its installed name, from the package-dir mapping."""
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    modules: dict[str, Path] = {}
    for package, folder in mapping.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            relative = path.relative_to(base).with_suffix("")
            parts = [part for part in relative.parts if part != "__init__"]
            name = ".".join([package, *parts])
            if name in modules and modules[name] != path:
                raise AssertionError(f"{name} maps to both {modules[name]} and {path}")
            modules[name] = path
    return modules


def _imports(path: Path, name: str) -> set[str]:
    """The package modules a module imports, type-checking imports included."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, module]) if module else ".".join(base)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {module for module in found if module.split(".")[0] == ROOT_PACKAGE}


def test_every_package_folder_is_installed() -> None:
    """A folder with an ``__init__.py`` that pyproject does not list would be left out of the
    wheel (the editable install would still find it, so only this test can tell)."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages == listed


def test_no_top_level_name_but_the_root() -> None:
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert {name.split(".")[0] for name in mapping} == {ROOT_PACKAGE}
    assert _pyproject()["project"]["scripts"]["tune"].startswith(f"{ROOT_PACKAGE}.")


def test_no_import_circle() -> None:
    modules = _modules()
    graph = {
        name: {target for target in _imports(path, name) if target in modules and target != name}
        for name, path in modules.items()
    }
    # A package's __init__ importing its own submodules is how packages re-export.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".") or t == name}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        if node in visiting:
            cycle = [*visiting[visiting.index(node) :], node]
            raise AssertionError("import circle: " + " -> ".join(cycle))
        visiting.append(node)
        for target in sorted(graph[node]):
            visit(target)
        visiting.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_commands_never_import_each_other() -> None:
    for name, path in _modules().items():
        if name.startswith(f"{ROOT_PACKAGE}.cli.") and name.endswith("_cmd"):
            others = {
                target
                for target in _imports(path, name)
                if target.startswith(f"{ROOT_PACKAGE}.cli.") and "_cmd" in target
            }
            assert not others, f"{name} imports {others}"


def test_nothing_outside_tests_imports_tests() -> None:
    for path in [*ROOT.glob("benchmarks/*.py"), *_modules().values()]:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] == "tests"], path


def test_nothing_refers_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for relative in tracked:
        path = ROOT / relative
        if path.suffix not in {".py", ".md", ".toml", ".yaml", ".sh", ""} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if relative == "tests/test_packaging.py":
            continue
        assert "DESIGN.md" not in text, f"{relative} cites DESIGN.md, which is not in the repo"
        assert "../shared" not in text, f"{relative} points outside the repository"


# --- the wheel, installed as users install it ------------------------------------------------
def _stub_wheel(folder: Path) -> Path:
    """A distribution (``stub-storage``) that installs a top-level ``storage`` package, as
    popular PyPI packages do."""
    wheel = folder / "stub_storage-1.0-py3-none-any.whl"
    files = {
        "storage/__init__.py": b"STUB = 'the other storage'\n",
        "stub_storage-1.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: stub-storage\nVersion: 1.0\n"
        ),
        "stub_storage-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("stub_storage-1.0.dist-info/RECORD,,")
    files["stub_storage-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def _run(args: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    completed = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert completed.returncode == 0, (
        f"{' '.join(args)} exited {completed.returncode}:\n{completed.stdout[-3000:]}"
        f"\n{completed.stderr[-3000:]}"
    )
    return completed


@pytest.mark.slow
def test_wheel_installs_beside_a_top_level_storage_and_runs_the_first_command(
    tmp_path: Path,
) -> None:
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        tmp_path,
    )
    [wheel] = dist.glob("vllm_prefill_tuner-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {name.split("/")[0] for name in names if not name.endswith(".dist-info/")} <= {
        ROOT_PACKAGE,
        *(n.split("/")[0] for n in names if ".dist-info/" in n),
    }
    assert f"{ROOT_PACKAGE}/engines/sim/profiles/llama-3.1-8b-h100.yaml" in names
    assert f"{ROOT_PACKAGE}/data/sample_trace.jsonl" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    _run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         str(wheel), str(_stub_wheel(tmp_path))],
        tmp_path,
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = (
        "import storage, prefill_tuner.storage.store as ours, prefill_tuner; "
        "assert storage.STUB == 'the other storage'; "
        "assert ours.TunerStore.__module__ == 'prefill_tuner.storage.store'; "
        "print(prefill_tuner.__file__)"
    )
    where = _run([str(python), "-c", probe], elsewhere).stdout.strip()
    assert str(venv) in where and str(ROOT) not in where  # the installed copy, not the checkout
    run = _run(
        [str(venv / "bin" / "tune"), "run", "--slo", "p99_tpot=50ms", "--trials", "4"], elsewhere
    )
    assert "bundled sample" in run.stderr
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-batched-tokens" in run.stdout
    assert (elsewhere / "tune.db").is_file()
