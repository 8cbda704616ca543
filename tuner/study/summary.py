"""What a study found: the Pareto-optimal feasible settings, the recommended one and why, its
gain over the engine's defaults, ready serve lines; or, when nothing met the SLOs, the closest
trials and which SLO binds: as data, which the terminal's tables (``cli/tables.py``), the JSON
documents and the HTML report (``output/``) present, and ``export`` writes as serve lines."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from prefill_tuner import defaults
from prefill_tuner.engines.sim.waves import Lockstep
from prefill_tuner.errors import TunerError
from prefill_tuner.files import read_input, why_unreadable
from prefill_tuner.objectives.slo import format_seconds, parse_slos
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.render import command_yaml
from prefill_tuner.search_spaces.space import knob_of_param
from prefill_tuner.storage.batched import optuna_storage
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TunerStore, redact_url
from prefill_tuner.study.headroom import HEADROOM_RULE, HeadroomReport
from prefill_tuner.study.plan import SCREEN_SUFFIX, check_study_name
from prefill_tuner.study.recommend import RULE, recommend
from prefill_tuner.trace import ShapeOptions, load_trace
from prefill_tuner.trace.model import Trace


@dataclass(frozen=True)
class StudySummary:
    study: StudyRecord
    objectives: list[str]
    directions: list[str]
    pareto: list[TrialRecord]
    """Feasible, non-dominated trials (Optuna's ``best_trials``)."""
    recommended: TrialRecord | None
    baseline: TrialRecord | None
    closest: list[TrialRecord]
    """When nothing is feasible: the trials nearest to meeting the SLOs."""
    finished: int
    cut_short: int = 0
    """Trials whose replay the early-abort rule stopped."""
    saved_s: float = 0.0
    """Replay time those stops saved, at least."""
    knobs: tuple[str, ...] = ()
    """The knobs the study searched (the columns worth showing)."""
    prediction_error: dict[str, float] = dataclasses.field(default_factory=dict)
    """Screened studies: objective → median |predicted / measured − 1| over the real trials
    the simulator predicted."""
    predicted_trials: int = 0
    headroom: HeadroomReport | None = None
    """The headroom checks of the best settings (:mod:`prefill_tuner.study.headroom`), when
    they ran on the study as it is (none since: a trial finished after them makes them stale);
    the recommendation is then theirs."""

    @property
    def margin_met(self) -> bool:
        """Whether the recommendation carries the required load margin (``headroom``; true
        when none is required or it was not checked)."""
        return self.headroom is None or self.headroom.margin_met

    @property
    def closest_measured(self) -> TrialRecord | None:
        """The closest trial that ran to the end (a failed one measured nothing)."""
        return next((t for t in self.closest if t.status != "failed"), None)


def summarize_study(
    study: optuna.Study, record: StudyRecord, trials: Sequence[TrialRecord]
) -> StudySummary:
    by_number = {trial.trial_number: trial for trial in trials}
    pareto: list[TrialRecord] = []
    seen: set[tuple[float, ...]] = set()
    for frozen in sorted(study.best_trials, key=lambda t: t.number):
        values = tuple(frozen.values)
        if frozen.number in by_number and values not in seen:  # ties: keep the earliest
            seen.add(values)
            pareto.append(by_number[frozen.number])
    pareto.sort(key=lambda trial: list(trial.objectives.values()))
    baseline = next((trial for trial in trials if trial.is_baseline), None)
    objectives = list(trials[0].objectives) if trials else []
    directions = [d.name.lower() for d in study.directions]
    limits = {slo.name: slo.limit_s for slo in parse_slos(list(record.slos))}
    recommended = recommend(pareto, baseline, objectives, directions, limits)
    headroom = stored_headroom(record, len(trials), pareto)
    if headroom is not None:
        recommended = next(t for t in pareto if t.trial_number == headroom.recommended)
    closest: list[TrialRecord] = []
    if not pareto:
        # Failed trials last: their numbers are penalties, not measurements.
        closest = sorted(trials, key=lambda t: (t.status == "failed", max(t.constraints.values())))[
            :3
        ]
    cuts = [cut_short_record(trial) for trial in trials]
    cuts = [cut for cut in cuts if cut]
    errors = _prediction_errors(trials, objectives)
    searched = {knob_of_param(param) for trial in trials for param in trial.params}
    return StudySummary(
        study=record,
        objectives=objectives,
        directions=directions,
        pareto=pareto,
        recommended=recommended,
        baseline=baseline,
        closest=closest,
        finished=len(trials),
        cut_short=len(cuts),
        saved_s=sum(float(cut.get("saved_s") or 0.0) for cut in cuts),
        knobs=tuple(knob for knob in KNOBS if knob in searched),
        prediction_error={name: float(np.median(values)) for name, values in errors.items()},
        predicted_trials=max((len(values) for values in errors.values()), default=0),
        headroom=headroom,
    )


def lockstep_caveat(summary: StudySummary, limit: int | None) -> str | None:
    """A line for the recommended trial (or, with none, the closest that ran) when the
    simulator ran it in lockstep waves (its details' ``lockstep_waves``): its TTFT is the
    simulator's least sure (:mod:`prefill_tuner.engines.sim.waves`)."""
    trial = summary.recommended or summary.closest_measured
    if trial is None or limit is None:
        return None
    together = ((trial.metrics or {}).get("details") or {}).get("lockstep_waves")
    if not isinstance(together, int | float):
        return None
    waves = Lockstep(together=float(together), concurrency=limit)
    return f"TTFT caveat (trial {trial.trial_number}): {waves.line()}"


def stored_headroom(
    record: StudyRecord, finished: int, pareto: Sequence[TrialRecord]
) -> HeadroomReport | None:
    """The study's stored headroom checks, if they are of the study as it is: the same
    number of finished trials, and their recommendation on the front."""
    data = record.headroom
    if not data or data.get("finished") != finished:
        return None
    try:
        report = HeadroomReport.from_dict(data)
    except (KeyError, TypeError, ValueError):
        return None  # written by another version: as if never checked
    if all(t.trial_number != report.recommended for t in pareto):
        return None
    return report


def predicted(trial: TrialRecord) -> dict[str, float]:
    """What the simulator predicted for a real trial's objectives (screened studies)."""
    details = (trial.metrics or {}).get("details") or {}
    return dict((details.get("predicted") or {}).get("objectives") or {})


def _prediction_errors(
    trials: Sequence[TrialRecord], objectives: Sequence[str]
) -> dict[str, list[float]]:
    """Objective → |predicted / measured − 1| of every completed trial with a prediction."""
    errors: dict[str, list[float]] = {}
    for trial in trials:
        guess = predicted(trial)
        if trial.status != "complete" or not guess or cut_short_record(trial):
            continue
        for name in objectives:
            value, expected = trial.objectives.get(name), guess.get(name)
            if value and expected is not None and math.isfinite(value) and math.isfinite(expected):
                errors.setdefault(name, []).append(abs(expected / value - 1))
    return errors


def find_study(store: TunerStore, name: str | None) -> str:
    """The study named, or the only one in the storage; a one-line error otherwise."""
    if name is not None:
        check_study_name(name)
    names = store.study_names()
    where = redact_url(store.url)
    if name is None:
        # A screened study's simulated one is never the one meant.
        own = [
            n
            for n in names
            if not (n.endswith(SCREEN_SUFFIX) and n[: -len(SCREEN_SUFFIX)] in names)
        ]
        if len(own) != 1:
            listing = ", ".join(names) if names else "none"
            raise TunerError(f"`name`: name the study (studies in {where}: {listing})")
        return own[0]
    if name not in names:
        raise TunerError(
            f"`name` {name}: no such study in {where} (studies: {', '.join(names) or 'none'})"
        )
    return name


def trace_location(record: StudyRecord) -> Path:
    """Where the study's trace is on this machine: the path recorded with it, or, when that
    file is gone and the bundled sample is the study's trace byte for byte, the sample (it
    ships by hash: a reinstall moves it). :func:`repoint_trace` records a moved trace's path."""
    path = Path(record.trace_path)
    if not path.exists() and record.trace_sha256 == _sample_sha256():
        return defaults.SAMPLE_TRACE
    return path


@functools.cache
def _sample_sha256() -> str:
    return hashlib.sha256(defaults.SAMPLE_TRACE.read_bytes()).hexdigest()


def repoint_trace(store: TunerStore, record: StudyRecord, path: Path) -> None:
    """Record that the study's trace is now at ``path`` (a trace moved, a machine changed),
    once its bytes are checked to be the study's (sha256); a one-line error otherwise."""
    try:
        data = read_input(path)
    except OSError as exc:
        raise TunerError(f"{path}: cannot read the trace: {why_unreadable(exc)}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != record.trace_sha256:
        raise TunerError(
            f"{path}: not the trace of study {record.name!r} (sha256 {digest[:12]}…, the study "
            f"ran on {record.trace_sha256[:12]}…, {record.trace_path})"
        )
    store.set_trace_path(record, str(path.resolve()))


def study_trace(record: StudyRecord) -> tuple[Trace | None, str | None]:
    """The study's trace, shaped as the study shaped it, when this machine still has it
    unchanged (else ``None`` and why)."""
    path = trace_location(record)
    try:
        data = read_input(path)
    except OSError as exc:
        return None, (
            f"the study's trace {path} cannot be read here ({exc.strerror or exc}); if it "
            "moved, give its new path as `trace`"
        )
    if hashlib.sha256(data).hexdigest() != record.trace_sha256:
        return None, f"the study's trace {path} has changed since the study ran"
    try:
        shaping = ShapeOptions.model_validate(record.shaping)
        sort = bool((record.definition or {}).get("sort", False))
        return load_trace(str(path), record.trace_format or None, sort=sort, options=shaping), None
    except (TunerError, ValueError) as exc:
        return None, f"the study's trace cannot be loaded: {exc}"


def summarize_stored(store: TunerStore, name: str) -> StudySummary:
    """The summary of a study in ``store`` (it must exist: :func:`find_study`)."""
    record = store.get_study(name)
    if record is None:
        raise TunerError(f"`name` {name}: no such study in {redact_url(store.url)}")
    study = optuna.load_study(study_name=name, storage=optuna_storage(store.url))
    return summarize_study(study, record, store.trials(record))


def require_finished(summary: StudySummary) -> StudySummary:
    """``summary``, if its study has a finished trial: a study recorded with ``--create-only``
    has nothing to show (nor to call infeasible) until its workers finish one."""
    if not summary.finished:
        name = summary.study.name
        raise TunerError(
            f"study {name} has no finished trial yet; nothing to report (its trials run with "
            f"tune worker --study {name}, or tune run)"
        )
    return summary


def cut_short_record(trial: TrialRecord) -> dict[str, Any]:
    """The early-abort record of a trial (empty when it ran to the end)."""
    return dict(((trial.metrics or {}).get("details") or {}).get("cut_short") or {})


COLUMNS = {name: knob.label or name for name, knob in KNOBS.items()}
"""Short column names, so the table fits 80 columns; a legend under it gives the flags (each
knob's label is declared with it: ``search_spaces/settings.py``)."""


def knob_cells(settings: dict[str, Any], knobs: Sequence[str]) -> list[str]:
    """Table cells of ``settings`` for ``knobs``: on/off, off for a zero threshold or share."""
    cells = []
    for knob in knobs:
        value = settings.get(knob, "")
        if isinstance(value, bool):
            cells.append("on" if value else "off")
        elif knob in KNOBS and KNOBS[knob].kind in ("threshold", "share") and value == 0:
            cells.append("off")
        else:
            cells.append(str(value))
    return cells


def knob_legend(knobs: Sequence[str]) -> str:
    """The caption naming the flags behind :data:`COLUMNS`' short names."""
    return "; ".join(f"{COLUMNS.get(knob, knob)}: {knob}" for knob in knobs)


def export(summary: StudySummary, model: str, fmt: str) -> str:
    """The Pareto settings as a shell script, or a ``vllm serve --config`` YAML (recommended);
    JSON is a document (:func:`prefill_tuner.output.documents.export_document`)."""
    if summary.recommended is None:
        raise ValueError("no trial met the SLOs")
    ordered = [summary.recommended] + [t for t in summary.pareto if t is not summary.recommended]
    if fmt == "shell":
        lines = [
            "#!/bin/sh",
            f"# study {summary.study.name}: recommended ({RULE})",
            ordered[0].serve_command,
            *(f"# {line}" for line in headroom_lines(summary)),
        ]
        for trial in ordered[1:]:
            lines.append(f"# alternative on the Pareto front (trial {trial.trial_number}):")
            lines.append("# " + trial.serve_command)
        return "\n".join(lines) + "\n"
    if fmt == "yaml":  # the stored line: the user's own arguments and the repaired settings
        return command_yaml(ordered[0].serve_command)
    raise ValueError(f"no such export format: {fmt}")


NOT_CHECKED = (
    "headroom: not checked (the checks are off, the study is a capacity study, or trials "
    "finished since they ran: run `tune run` again, with the same options, to check)"
)


def headroom_lines(summary: StudySummary) -> list[str]:
    """What the headroom checks found for the recommendation, and the rule that used them
    (:mod:`prefill_tuner.study.headroom`); a line saying they did not run otherwise."""
    if summary.recommended is None:
        return []
    if summary.headroom is None:
        return [NOT_CHECKED]
    return [*summary.headroom.lines(), f"(headroom rule: {HEADROOM_RULE})"]


def window_lines(trial: TrialRecord) -> list[str]:
    """How a trial did on each judge window (:mod:`prefill_tuner.study.windows`)."""
    windows = ((trial.metrics or {}).get("details") or {}).get("windows") or {}
    lines = []
    for spec, own in windows.items():
        shown = ", ".join(
            f"{name} {format_seconds(value)}"
            for name, value in (own.get("objectives") or {}).items()
            if value is not None and math.isfinite(value)
        )
        verdict = "meets the SLOs" if own.get("feasible") else "misses the SLOs"
        lines.append(
            f"on window {spec} ({own.get('requests')} requests from {own.get('start_s', 0):g} "
            f"s): {verdict}; {shown}"
        )
    return lines
