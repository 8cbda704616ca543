"""The floor plan holds: every import runs down the layers of ``docs/architecture.md`` (or
stays on its floor), the engines know nothing of the study that runs them, and nothing but the
command line imports the command line."""

from __future__ import annotations

import ast
import functools

import pytest

from tests.test_packaging import ROOT_PACKAGE, _imports, _modules

LAYERS: tuple[tuple[str, int], ...] = (
    # 0: the ground floor, which imports nothing of the package above it
    ("version", 0),
    ("errors", 0),
    ("exit_codes", 0),
    ("defaults", 0),
    ("files", 0),
    ("redaction", 0),
    ("stopping", 0),
    ("yaml_input", 0),
    ("names", 0),
    ("declared", 0),
    ("data", 0),
    # 1: the vocabulary: SLOs and metrics, vLLM's knobs, the database
    ("objectives", 1),
    ("search_spaces", 1),
    ("storage", 1),
    # 2: traces (their classes are named as SLOs name them)
    ("trace", 2),
    # 3: the engines a trial runs on (simulated or real) and their step timelines
    ("engines", 3),
    # 4: fitting the simulator to a real engine
    ("calibration", 4),
    # 5: a study: its plan, trials, evaluation, recommendation, screening, summary
    ("study", 5),
    # 6: what reads a study: diagnosis, workers that join it, its documents and report
    ("diagnosis", 6),
    ("worker", 6),
    ("output", 6),
    # 7: whole jobs: `tune run`'s session and the nightly retune
    ("study.session", 7),
    ("nightly", 7),
    # 8: the command line, the console script and the public API's facade
    ("cli", 8),
    ("entry", 8),
    ("__main__", 8),
    ("", 8),
)
"""Each module's floor, by the longest matching prefix of its name under the root."""


def floor(module: str) -> int:
    name = module.removeprefix(ROOT_PACKAGE).removeprefix(".")
    matches = [
        (len(prefix), level)
        for prefix, level in LAYERS
        if name == prefix or name.startswith(prefix + ".") or prefix == ""
    ]
    return max(matches)[1]


@functools.cache
def _edges() -> list[tuple[str, str]]:
    """Every import between the package's modules (``from pkg import mod`` counts as an import
    of ``pkg.mod``, not of the package whose namespace it goes through)."""
    modules = _modules()
    edges = []
    for name, path in modules.items():
        for target in _imports(path, name):
            while target not in modules and "." in target:  # `from pkg import name`
                target = target.rsplit(".", 1)[0]
            if target in modules and target not in (name, ROOT_PACKAGE):
                edges.append((name, target))
    return edges


def test_every_module_has_a_floor_of_its_own() -> None:
    """A new wing is placed on purpose: only the root package itself falls to the top floor
    by default."""
    for name in _modules():
        short = name.removeprefix(ROOT_PACKAGE).removeprefix(".")
        if short:
            assert any(
                short == prefix or short.startswith(prefix + ".") for prefix, _ in LAYERS[:-1]
            ), f"{name} has no floor in tests/test_layers.py's LAYERS"


def test_no_import_runs_upward() -> None:
    upward = [
        f"{source} (floor {floor(source)}) imports {target} (floor {floor(target)})"
        for source, target in _edges()
        if floor(target) > floor(source)
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    "wing", ["study", "nightly", "worker", "output", "diagnosis", "calibration", "cli"]
)
def test_the_engines_import_nothing_of_what_runs_them(wing: str) -> None:
    above = f"{ROOT_PACKAGE}.{wing}"
    found = [
        f"{source} imports {target}"
        for source, target in _edges()
        if source.startswith(f"{ROOT_PACKAGE}.engines")
        and (target == above or target.startswith(above + "."))
    ]
    assert not found, "\n".join(found)


def test_the_library_imports_nothing_of_the_command_line() -> None:
    """Only the command line, and the console script that starts it, import it: the library
    takes values and speaks no flags."""
    cli = f"{ROOT_PACKAGE}.cli"
    outside = {cli, f"{ROOT_PACKAGE}.entry", f"{ROOT_PACKAGE}.__main__"}
    found = [
        f"{source} imports {target}"
        for source, target in _edges()
        if (target == cli or target.startswith(cli + "."))
        and not any(source == o or source.startswith(o + ".") for o in outside)
    ]
    assert not found, "\n".join(found)


COMMAND_LINES = 60
"""The most lines a command's body may have (its parameters and docstring aside): parsing and
display, around one call of the library that does the work."""


def test_every_command_is_thin() -> None:
    long = []
    for name, path in _modules().items():
        if not name.startswith(f"{ROOT_PACKAGE}.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_command"):
                body = node.body
                if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    body = body[1:]  # the docstring
                lines = (node.end_lineno or 0) - body[0].lineno + 1
                if lines > COMMAND_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, "\n".join(long)
