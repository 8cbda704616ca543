"""Machine-readable output: ``tune run --json``, ``tune pareto --json``, ``tune studies`` and
``tune trials`` print documents that validate against the committed, versioned schema
(``docs/summary.schema.json``), checked with an independent validator (jsonschema)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from prefill_tuner.output import documents
from tests.conftest import AZURE, ROOT

SCHEMA = ROOT / "docs" / "summary.schema.json"


def validate(document: dict, name: str) -> None:
    schemas = json.loads(SCHEMA.read_text())
    jsonschema.validate(document, schemas[name])


def test_the_committed_schema_is_the_documents_own() -> None:
    # Regenerate with: .venv/bin/python -m prefill_tuner.output.documents > docs/summary.schema.json
    assert SCHEMA.read_text() == documents.schema()
    schemas = json.loads(SCHEMA.read_text())
    summary = schemas["SummaryDocument"]
    assert summary["properties"]["schema_version"]["const"] == documents.SCHEMA_VERSION
    # Every field is documented where it is declared.
    trial = summary["$defs"]["TrialDocument"]["properties"]
    assert all("description" in field for field in trial.values())


def run_study(tune, tmp_path: Path, *slos: str) -> tuple[int, str, str, str]:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, out, err = tune(
        "run", "--trace", str(AZURE), "--max-requests", "120", "--trials", "6",
        *(arg for slo in slos for arg in ("--slo", slo)),
        "--storage", storage, "--study", "s", "--json",
    )  # fmt: skip
    return code, out, err, storage


def test_run_and_pareto_print_the_same_valid_summary(tune, tmp_path: Path) -> None:
    code, out, err, storage = run_study(tune, tmp_path, "p99_tpot=50ms", "p99_ttft=5s")
    assert code == 0, err
    document = json.loads(out)  # stdout is the document alone (progress goes to stderr)
    validate(document, "SummaryDocument")
    assert document["schema_version"] == 1
    study = document["study"]
    assert study["name"] == "s" and study["status"] == "done"
    assert study["trials"]["complete"] == 6 and study["objectives"] == ["p99_ttft", "p99_tpot"]
    recommended = document["recommended"]
    assert recommended["feasible"] and recommended["number"] in [
        t["number"] for t in document["pareto"]
    ]
    assert document["serve_lines"][0] == recommended["serve_command"]
    assert document["baseline"]["baseline"] and document["baseline"]["number"] == 0
    code, exported, _ = tune("export", "--format", "shell", "--storage", storage)
    assert code == 0 and exported.splitlines()[2] == document["serve_lines"][0]
    code, again, _ = tune("pareto", "--json", "--storage", storage)
    assert code == 0 and json.loads(again) == document


def test_nothing_feasible_is_still_a_document_with_exit_code_4(tune, tmp_path: Path) -> None:
    code, out, err, _ = run_study(tune, tmp_path, "p99_tpot=1us")
    assert code == 4, err
    document = json.loads(out)
    validate(document, "SummaryDocument")
    assert document["recommended"] is None and document["pareto"] == []
    assert document["serve_lines"] == [] and len(document["closest"]) >= 1


def test_studies_and_trials_list_what_the_storage_holds(tune, tmp_path: Path) -> None:
    code, _, err, storage = run_study(tune, tmp_path, "p99_tpot=50ms")
    assert code == 0, err
    code, out, err = tune("studies", "--storage", storage, "--json")
    assert code == 0, err
    listing = json.loads(out)
    validate(listing, "StudiesDocument")
    [study] = listing["studies"]
    assert study["name"] == "s" and study["slos"] == ["p99_tpot=50ms"]
    assert study["target_trials"] == 6 and study["status"] == "done"
    code, out, err = tune("trials", "--study", "s", "--storage", storage, "--json")
    assert code == 0, err
    trials = json.loads(out)
    validate(trials, "TrialsDocument")
    assert [t["number"] for t in trials["trials"]] == list(range(6))
    assert all(t["state"] == "COMPLETE" and t["status"] == "complete" for t in trials["trials"])
    assert trials["trials"][0]["baseline"] and trials["trials"][0]["settings"]
    # The tables: one row per study / trial.
    code, out, _ = tune("studies", "--storage", storage)
    assert code == 0 and " s " in out and "6/6" in out
    code, out, _ = tune("trials", "--study", "s", "--storage", storage)
    assert (
        code == 0 and sum(line.strip().startswith(("0*", "5 ")) for line in out.splitlines()) == 2
    )
    code, _, err = tune("trials", "--study", "nope", "--storage", storage)
    assert code == 2 and err.strip() == "error: --study nope: no such study (studies: s)"


def test_export_json_is_a_valid_versioned_document(tune, tmp_path: Path) -> None:
    code, out, err, storage = run_study(tune, tmp_path, "p99_tpot=50ms", "p99_ttft=5s")
    assert code == 0, err
    summary = json.loads(out)
    code, exported, err = tune("export", "--format", "json", "--storage", storage)
    assert code == 0, err
    document = json.loads(exported)
    validate(document, "ExportDocument")
    assert document["schema_version"] == documents.SCHEMA_VERSION
    assert document["study"] == "s" and document["rule"] == summary["rule"]
    assert [entry["serve_command"] for entry in document["pareto"]] == summary["serve_lines"]
    assert document["pareto"][0]["recommended"]
