"""Machine-readable output: the JSON documents ``tune run --json``, ``tune pareto --json``,
``tune studies --json``, ``tune trials --json``, ``tune plan --json`` and ``tune export
--format json`` print.

Each is a pydantic model, so that what is printed is validated against its own schema, and
the schema (``docs/summary.schema.json``, generated from these models and checked by the
tests) documents every field. ``schema_version`` changes whenever a field is removed,
renamed or changes meaning; fields may be added without a change.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

import optuna
from pydantic import BaseModel, ConfigDict, Field

from prefill_tuner.storage.batched import optuna_storage
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.headroom import HEADROOM_RULE, Check, HeadroomReport
from prefill_tuner.study.recommend import RULE
from prefill_tuner.study.replica_count import ReplicaPlan, replica_details
from prefill_tuner.study.summary import StudySummary, predicted, summarize_stored

SCHEMA_VERSION: Literal[1] = 1


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="null")


class TrialDocument(_Document):
    """One trial, as stored."""

    number: int = Field(description="The trial's number in its Optuna study.")
    baseline: bool = Field(description="Whether it ran the engine's defaults.")
    state: str = Field(
        description="Optuna's state: COMPLETE, RUNNING, WAITING or FAIL (a trial whose "
        "process died or was interrupted; it runs again)."
    )
    status: Literal["complete", "failed"] | None = Field(
        description="The run: complete (measured) or failed (the engine failed; see "
        "failure_reason); null while it has no record (running, waiting, interrupted)."
    )
    feasible: bool | None = Field(description="Whether it met every SLO.")
    settings: dict[str, Any] = Field(description="The engine settings it ran.")
    objectives: dict[str, float | None] = Field(
        description="Objective name → value in seconds (rate_multiplier: a factor); a failed "
        "trial carries penalty values."
    )
    slacks: dict[str, float | None] = Field(
        description="SLO → (limit − value) / limit: positive inside the SLO."
    )
    serve_command: str | None = Field(description="Its `vllm serve` line.")
    failure_reason: str | None = Field(description="Why the run failed, if it did.")
    cut_short: str | None = Field(
        description="Why early abort stopped its replay (its values are lower bounds)."
    )
    predicted: dict[str, float] | None = Field(
        description="Screened studies: the simulator's predicted objectives for it."
    )
    engine_version: str | None = Field(description="`vllm --version` or the simulator's.")
    wall_s: float | None = Field(description="Seconds the trial took.")


class StudyDocument(_Document):
    """A study's definition and progress."""

    name: str
    engine: str
    model: str = Field(description="The model named in serve lines.")
    objective: str = Field(description="latency or capacity.")
    objectives: list[str] = Field(description="What the study minimises (or maximises).")
    slos: list[str] = Field(description="As given, e.g. p99_tpot=50ms.")
    error_budget: float
    trace_path: str
    trace_sha256: str
    shaping: dict[str, Any] = Field(description="How the trace was shaped before replay.")
    space: dict[str, Any] = Field(description="Searched ranges, fixed settings, dropped knobs.")
    target_trials: int | None = Field(description="Trials the study should have.")
    created_at: datetime
    trials: dict[str, int] = Field(
        description="Trials by state: complete, feasible, failed (engine failures), running, "
        "waiting, interrupted (FAIL in Optuna)."
    )
    status: Literal["done", "in progress", "not started"] = Field(
        description="done: it has its target of complete trials."
    )


class HeadroomCheckDocument(_Document):
    """One run of a candidate's settings, changed (a neighbour, or more load)."""

    what: str = Field(description="`max_num_batched_tokens ×1.25`, `load ×1.5`, ...")
    settings: dict[str, Any] = Field(description="The settings it ran (repaired by vLLM's rules).")
    rate: float = Field(description="Multiple of the trace's request rate it ran at.")
    meets: bool = Field(description="Whether it met every SLO (and every judge window's).")
    worst: float | None = Field(
        description="The worst SLO's value over its limit (over 1: missed); null when the run "
        "failed or lost requests beyond the error budget."
    )
    binding: str = Field(description="That SLO (`p99_tpot`, `p99_tpot@busiest:300`, `errors`).")


class HeadroomCandidateDocument(_Document):
    """One of the best settings, checked."""

    trial: int = Field(description="Its trial number.")
    score: float | None = Field(description="Its worst ratio by the recommendation rule.")
    load: float = Field(
        description="The highest multiple of the trace's rate tried that it met (1: none above)."
    )
    load_missed: float | None = Field(
        description="The lowest multiple it missed (null: it met every one tried)."
    )
    neighbours_meet: bool = Field(description="Whether every neighbour met the SLOs.")
    neighbours: list[HeadroomCheckDocument]
    refused: dict[str, str] = Field(
        description="Neighbours that could not run, with why (vLLM would refuse them)."
    )
    loads: list[HeadroomCheckDocument]


class HeadroomDocument(_Document):
    """The headroom checks of the best settings and the recommendation they chose."""

    rule: str = Field(description="How the checks change the recommendation.")
    statement: list[str] = Field(description="What they found, as the terminal says it.")
    checked_on: str = Field(description="Where the checks ran (the simulator, its profile).")
    margin: float | None = Field(description="The required load margin (`--headroom`), if any.")
    margin_met: bool = Field(description="Whether the recommendation carries it.")
    rule_pick: int = Field(description="The trial the recommendation rule alone picks.")
    recommended: int = Field(description="The trial recommended after the checks.")
    candidates: list[HeadroomCandidateDocument]
    runs: int = Field(description="Engine runs the checks took.")
    seconds: float = Field(description="Seconds they took.")
    windows: list[str] = Field(description="Judge windows each check also ran on.")


def headroom_document(report: HeadroomReport) -> HeadroomDocument:
    def check(found: Check) -> HeadroomCheckDocument:
        worst = found.worst if math.isfinite(found.worst) else None
        return HeadroomCheckDocument(**{**asdict(found), "worst": worst})

    return HeadroomDocument(
        rule=HEADROOM_RULE,
        statement=report.lines(),
        checked_on=report.checked_on,
        margin=report.margin,
        margin_met=report.margin_met,
        rule_pick=report.rule_pick,
        recommended=report.recommended,
        candidates=[
            HeadroomCandidateDocument(
                trial=c.trial_number,
                score=c.score if math.isfinite(c.score) else None,
                load=c.load,
                load_missed=c.load_missed,
                neighbours_meet=c.neighbours_meet,
                neighbours=[check(n) for n in c.neighbours],
                refused=c.refused,
                loads=[check(n) for n in c.loads],
            )
            for c in report.candidates
        ],
        runs=report.runs,
        seconds=report.seconds,
        windows=report.windows,
    )


class SummaryDocument(_Document):
    """What a study found (``tune run --json``, ``tune pareto --json``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    study: StudyDocument
    rule: str = Field(description="How the recommended setting is chosen.")
    recommended: TrialDocument | None = Field(
        description="The recommended setting; null when no trial met the SLOs."
    )
    baseline: TrialDocument | None = Field(description="The engine's defaults, measured.")
    pareto: list[TrialDocument] = Field(
        description="The Pareto-optimal feasible settings (the recommended one among them)."
    )
    closest: list[TrialDocument] = Field(
        description="When nothing met the SLOs: the trials nearest to meeting them."
    )
    serve_lines: list[str] = Field(
        description="`vllm serve` lines, the recommended one first, then the rest of the front."
    )
    prediction_error: dict[str, float] = Field(
        description="Screened studies: objective → median |predicted / measured − 1|."
    )
    headroom: HeadroomDocument | None = Field(
        default=None,
        description="The load headroom and neighbour checks of the best settings, which chose "
        "the recommendation; null when they did not run (off, a capacity study, nothing met "
        "the SLOs, or trials finished since).",
    )


class StudiesDocument(_Document):
    """Every study in a storage (``tune studies --json``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    studies: list[StudyDocument]


class TrialsDocument(_Document):
    """Every trial of a study (``tune trials --json``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    study: str
    trials: list[TrialDocument]


class ExportEntry(_Document):
    """One Pareto-optimal setting, for deployment."""

    trial: int = Field(description="The trial's number in its Optuna study.")
    recommended: bool = Field(description="Whether it is the recommended setting.")
    settings: dict[str, Any] = Field(description="The engine settings it ran.")
    serve_command: str = Field(description="Its `vllm serve` line.")
    objectives: dict[str, float | None] = Field(
        description="Objective name → value in seconds (rate_multiplier: a factor)."
    )
    slacks: dict[str, float | None] = Field(
        description="SLO → (limit − value) / limit: positive inside the SLO."
    )
    engine_version: str = Field(description="`vllm --version` or the simulator's.")
    metrics: dict[str, Any] | None = Field(description="Everything the trial measured.")


class ExportDocument(_Document):
    """A study's Pareto-optimal settings, the recommended one first (``tune export --format
    json``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    study: str
    rule: str = Field(description="How the recommended setting is chosen.")
    pareto: list[ExportEntry]
    headroom: HeadroomDocument | None = Field(
        default=None,
        description="The headroom checks that chose the recommendation (null: not checked).",
    )


class ReplicaCountDocument(_Document):
    """What ``tune plan`` found at one replica count."""

    replicas: int
    study: str = Field(description="The study of this count (every trial: this many replicas).")
    met: bool = Field(description="Whether a trial met every SLO.")
    trials: int = Field(description="Trials finished.")
    closest: TrialDocument | None = Field(
        description="When not met: the trial nearest to meeting the SLOs."
    )


class PlanDocument(_Document):
    """How many replicas a trace needs behind a router (``tune plan --json``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    router: str
    max_replicas: int
    replicas: int | None = Field(
        description="The fewest replicas whose settings met every SLO; null: none up to "
        "max_replicas."
    )
    answer: SummaryDocument | None = Field(
        description="The study of that count: its recommended settings (every replica runs "
        "them) and the Pareto front."
    )
    utilisation: list[float] = Field(
        description="Per replica, under the recommended settings: the share of the run it "
        "spent computing steps."
    )
    requests_per_replica: list[int] = Field(description="Requests the router sent each one.")
    fewest_possible: int = Field(
        description="The fewest replicas whose latency floors are within the SLOs: fewer "
        "cannot meet them whatever the settings, and are not searched (max_replicas + 1: "
        "no count up to max_replicas can)."
    )
    floors_below: list[str] = Field(
        description="Why one replica fewer than fewest_possible cannot: each SLO's floor over "
        "its limit, in words."
    )
    counts: list[ReplicaCountDocument] = Field(
        description="Every count searched, in increasing order (the one below the answer among "
        "them, unless it is below fewest_possible)."
    )


def _finite(values: dict[str, Any]) -> dict[str, float | None]:
    return {
        name: (float(v) if isinstance(v, int | float) and math.isfinite(v) else None)
        for name, v in values.items()
    }


def trial_document(
    trial: TrialRecord | None, frozen: optuna.trial.FrozenTrial | None
) -> TrialDocument:
    """A trial from its record and Optuna's view of it (either may be missing: a trial has
    no record while it runs, waits or was interrupted; a record outlives a deleted study)."""
    if trial is None:
        assert frozen is not None
        attrs = frozen.user_attrs
        return TrialDocument(
            number=frozen.number,
            baseline=bool(attrs.get("baseline")),
            state=frozen.state.name,
            status=None,
            feasible=None,
            settings=dict(attrs.get("settings") or {}),
            objectives={},
            slacks={},
            serve_command=attrs.get("serve_command"),
            failure_reason=None,
            cut_short=None,
            predicted=None,
            engine_version=None,
            wall_s=None,
        )
    details = (trial.metrics or {}).get("details") or {}
    return TrialDocument(
        number=trial.trial_number,
        baseline=trial.is_baseline,
        state=frozen.state.name if frozen is not None else "COMPLETE",
        status=trial.status,  # type: ignore[arg-type]
        feasible=trial.feasible,
        settings=trial.settings,
        objectives=_finite(trial.objectives),
        slacks=_finite(trial.slacks),
        serve_command=trial.serve_command,
        failure_reason=trial.failure_reason,
        cut_short=(details.get("cut_short") or {}).get("reason"),
        predicted=predicted(trial) or None,
        engine_version=trial.engine_version.version,
        wall_s=trial.wall_s,
    )


def study_document(
    record: StudyRecord,
    objectives: list[str],
    trials: list[TrialRecord],
    frozen: list[optuna.trial.FrozenTrial],
) -> StudyDocument:
    states = [t.state for t in frozen]
    complete = states.count(optuna.trial.TrialState.COMPLETE)
    target = record.target_trials
    status: Literal["done", "in progress", "not started"]
    if complete == 0:
        status = "not started"
    elif target is not None and complete >= target:
        status = "done"
    else:
        status = "in progress"
    return StudyDocument(
        name=record.name,
        engine=record.engine,
        model=record.model,
        objective=record.objective_mode,
        objectives=objectives,
        slos=list(record.slos),
        error_budget=record.error_budget,
        trace_path=record.trace_path,
        trace_sha256=record.trace_sha256,
        shaping=record.shaping,
        space=record.space,
        target_trials=target,
        created_at=record.created_at,
        trials={
            "complete": complete,
            "feasible": sum(t.feasible and t.status == "complete" for t in trials),
            "failed": sum(t.status == "failed" for t in trials),
            "running": states.count(optuna.trial.TrialState.RUNNING),
            "waiting": states.count(optuna.trial.TrialState.WAITING),
            "interrupted": states.count(optuna.trial.TrialState.FAIL),
        },
        status=status,
    )


def summary_document(
    summary: StudySummary, frozen: list[optuna.trial.FrozenTrial], trials: list[TrialRecord]
) -> SummaryDocument:
    by_number = {t.number: t for t in frozen}

    def doc(trial: TrialRecord) -> TrialDocument:
        return trial_document(trial, by_number.get(trial.trial_number))

    ordered = []
    if summary.recommended is not None:
        ordered = [summary.recommended] + [
            t for t in summary.pareto if t is not summary.recommended
        ]
    return SummaryDocument(
        study=study_document(summary.study, summary.objectives, trials, frozen),
        rule=RULE,
        recommended=doc(summary.recommended) if summary.recommended else None,
        baseline=doc(summary.baseline) if summary.baseline else None,
        pareto=[doc(t) for t in summary.pareto],
        closest=[doc(t) for t in summary.closest],
        serve_lines=[t.serve_command for t in ordered],
        prediction_error=summary.prediction_error,
        headroom=headroom_document(summary.headroom) if summary.headroom else None,
    )


def export_document(summary: StudySummary) -> ExportDocument:
    """The Pareto-optimal settings of a study with a recommendation, that one first."""
    recommended = summary.recommended
    if recommended is None:
        raise ValueError("no trial met the SLOs")
    ordered = [recommended] + [t for t in summary.pareto if t is not recommended]
    entries = [
        ExportEntry(
            trial=trial.trial_number,
            recommended=trial is recommended,
            settings=trial.settings,
            serve_command=trial.serve_command,
            objectives=_finite(trial.objectives),
            slacks=_finite(trial.slacks),
            engine_version=trial.engine_version.version,
            metrics=trial.metrics,
        )
        for trial in ordered
    ]
    return ExportDocument(
        study=summary.study.name,
        rule=RULE,
        pareto=entries,
        headroom=headroom_document(summary.headroom) if summary.headroom else None,
    )


def trials_document(
    name: str, trials: list[TrialRecord], frozen: list[optuna.trial.FrozenTrial]
) -> TrialsDocument:
    """Every trial Optuna knows (running, waiting and interrupted ones too), with its record
    where it has one."""
    records = {t.trial_number: t for t in trials}
    numbers = sorted({t.number for t in frozen} | set(records))
    by_number = {t.number: t for t in frozen}
    return TrialsDocument(
        study=name,
        trials=[trial_document(records.get(n), by_number.get(n)) for n in numbers],
    )


def optuna_trials(store: TunerStore, name: str) -> list[optuna.trial.FrozenTrial]:
    """The Optuna study's trials (none when the study has no Optuna side)."""
    try:
        study = optuna.load_study(study_name=name, storage=optuna_storage(store.url))
    except KeyError:
        return []
    return study.get_trials(deepcopy=False)


def stored_summary_document(store: TunerStore, name: str) -> SummaryDocument:
    """The summary document of a stored study."""
    summary = summarize_stored(store, name)
    return summary_document(summary, optuna_trials(store, name), list(store.trials(summary.study)))


def stored_studies_document(store: TunerStore) -> StudiesDocument:
    documents = []
    for name in store.study_names():
        record = store.get_study(name)
        if record is None:
            continue
        trials = list(store.trials(record))
        objectives = list(trials[0].objectives) if trials else []
        documents.append(study_document(record, objectives, trials, optuna_trials(store, name)))
    return StudiesDocument(studies=documents)


def stored_trials_document(store: TunerStore, name: str) -> TrialsDocument:
    record = store.get_study(name)
    trials = list(store.trials(record)) if record is not None else []
    return trials_document(name, trials, optuna_trials(store, name))


def plan_document(store: TunerStore, plan: ReplicaPlan) -> PlanDocument:
    """The document of a replica plan, its studies read from ``store``."""
    counts = []
    for replicas, result in sorted(plan.counts.items()):
        closest = result.summary.closest_measured
        frozen = {t.number: t for t in optuna_trials(store, result.study)} if closest else {}
        counts.append(
            ReplicaCountDocument(
                replicas=replicas,
                study=result.study,
                met=result.met,
                trials=result.summary.finished,
                closest=trial_document(closest, frozen.get(closest.trial_number))
                if closest and not result.met
                else None,
            )
        )
    answer = plan.answer
    shares = replica_details(answer.summary) if answer else []
    return PlanDocument(
        router=plan.router,
        max_replicas=plan.max_replicas,
        replicas=plan.replicas,
        answer=stored_summary_document(store, answer.study) if answer else None,
        utilisation=[share["utilisation"] for share in shares],
        requests_per_replica=[int(share["requests"]) for share in shares],
        fewest_possible=plan.fewest_possible,
        floors_below=[floor.line() for floor in plan.floors_below],
        counts=counts,
    )


def schema() -> str:
    """The JSON Schema of every document, as ``docs/summary.schema.json`` holds it."""
    documents = {
        model.__name__: model.model_json_schema(mode="serialization")
        for model in (
            SummaryDocument,
            StudiesDocument,
            TrialsDocument,
            PlanDocument,
            ExportDocument,
        )
    }
    return json.dumps(documents, indent=2, sort_keys=True) + "\n"


__all__ = [
    "SCHEMA_VERSION",
    "ExportDocument",
    "StudiesDocument",
    "StudyDocument",
    "SummaryDocument",
    "TrialDocument",
    "TrialsDocument",
    "export_document",
    "optuna_trials",
    "schema",
    "stored_studies_document",
    "stored_summary_document",
    "stored_trials_document",
    "study_document",
    "summary_document",
    "trial_document",
    "trials_document",
]


if __name__ == "__main__":  # python -m prefill_tuner.output.documents > docs/summary.schema.json
    print(schema(), end="")
