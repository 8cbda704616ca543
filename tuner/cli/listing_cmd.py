"""``tune studies`` and ``tune trials``: what a storage holds, as tables or JSON."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from prefill_tuner import defaults
from prefill_tuner.cli.display import output_console, print_document, quiet_optuna
from prefill_tuner.cli.options import JsonOpt, StorageOpt
from prefill_tuner.cli.tables import narrow_table, objective_header
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.slo import format_seconds
from prefill_tuner.output.documents import (
    TrialDocument,
    stored_studies_document,
    stored_trials_document,
)
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.storage.store import TunerStore, redact_url
from prefill_tuner.study.plan import check_study_name
from prefill_tuner.study.summary import COLUMNS, knob_cells, knob_legend


def studies_command(storage: StorageOpt = defaults.STORAGE, as_json: JsonOpt = False) -> None:
    """List the studies in a storage, with their definition and progress."""
    quiet_optuna()
    document = stored_studies_document(TunerStore(storage, create=False))
    if as_json:
        print_document(document)
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("study", "engine", "SLOs", "trials", "feasible", "status"):
        table.add_column(column, overflow="fold")
    for study in document.studies:
        done = study.trials["complete"]
        target = f"/{study.target_trials}" if study.target_trials else ""
        table.add_row(
            escape(study.name),
            escape(study.engine),
            escape(", ".join(study.slos)),
            f"{done}{target}",
            str(study.trials["feasible"]),
            study.status,
        )
    if not document.studies:
        output_console().print(f"no studies in {redact_url(storage)}", markup=False)
        return
    output_console().print(table)


def trials_command(
    study_name: Annotated[str, typer.Option("--study", help="The study.")],
    storage: StorageOpt = defaults.STORAGE,
    as_json: JsonOpt = False,
) -> None:
    """List every trial of a study: state, settings, verdict and failure reason."""
    check_study_name(study_name)
    quiet_optuna()
    store = TunerStore(storage, create=False)
    record = store.get_study(study_name)
    if record is None:
        names = ", ".join(store.study_names()) or "none"
        raise TunerError(f"--study {study_name}: no such study (studies: {names})")
    document = stored_trials_document(store, study_name)
    if as_json:
        print_document(document)
        return
    trials, unrun = _unrun_queued(document.trials, record.target_trials)
    knobs = [k for k in KNOBS if any(k in t.settings for t in trials)]
    objectives = list(dict.fromkeys(n for t in trials for n in t.objectives))
    table = narrow_table(f"* the baseline (the engine's defaults). {knob_legend(knobs)}")
    table.add_column("trial", justify="right", overflow="fold")
    table.add_column("state", overflow="fold")
    headers: list[str | Text] = [COLUMNS.get(k, k) for k in knobs]
    for column in (*headers, *map(objective_header, objectives)):
        table.add_column(column, justify="right", overflow="fold")
    table.add_column("SLOs", overflow="fold")
    notes = []
    for trial in trials:
        verdict = {None: "", True: "met", False: "missed"}[trial.feasible]
        if trial.status == "failed":
            verdict = "failed"
            notes.append(f"trial {trial.number} failed: {trial.failure_reason}")
        if trial.cut_short:
            notes.append(f"trial {trial.number} was cut short: {trial.cut_short}")
        values = [
            _value(name, trial.objectives.get(name)) if trial.status == "complete" else ""
            for name in objectives
        ]
        table.add_row(
            f"{trial.number}{'*' if trial.baseline else ''}",
            STATES.get(trial.state, trial.state.lower()),
            *map(escape, knob_cells(trial.settings, knobs)),
            *values,
            verdict,
        )
    if unrun:
        numbers = ", ".join(str(trial.number) for trial in unrun)
        notes.append(
            f"not shown: queued trial(s) {numbers}, which the study has no need of (it has "
            f"its {record.target_trials} trials); a run with more --trials runs them first"
        )
    console = output_console()
    console.print(table)
    for note in notes:
        console.print(note, markup=False, soft_wrap=True)


STATES = {"COMPLETE": "done", "RUNNING": "running", "WAITING": "queued", "FAIL": "stopped"}
"""Optuna's states in the table's words (FAIL: the trial's process died or was interrupted;
its settings run again)."""


def _value(name: str, value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.3g}×" if name == "rate_multiplier" else format_seconds(value)


def _unrun_queued(
    trials: list[TrialDocument], target: int | None
) -> tuple[list[TrialDocument], list[TrialDocument]]:
    """The trials to list, and the queued ones of a study that has its target of trials: the
    first run queues the baseline and the rule-derived trials whatever ``--trials`` says, and
    a study that stopped before running them all (fewer --trials than those, a timeout, a
    replica count met) leaves them queued for a later run with more trials."""
    complete = sum(trial.state == "COMPLETE" for trial in trials)
    if target is None or complete < target:
        return trials, []
    return (
        [trial for trial in trials if trial.state != "WAITING"],
        [trial for trial in trials if trial.state == "WAITING"],
    )
