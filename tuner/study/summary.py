"""What a study found: the Pareto-optimal feasible settings, the recommended one and why, its
gain over the engine's defaults, ready serve lines; or, when nothing met the SLOs, the closest
trials and which SLO binds. Shared by ``tune run``, ``tune pareto`` and ``tune export``."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from prefill_tuner.errors import TunerError
from prefill_tuner.files import read_input
from prefill_tuner.objectives.scoring import ERRORS
from prefill_tuner.objectives.slo import format_seconds, parse_slos
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.render import command_yaml
from prefill_tuner.search_spaces.space import BASELINE_OUTSIDE
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TunerStore, redact_url
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
    closest: list[TrialRecord] = []
    if not pareto:
        # Failed trials last: their numbers are penalties, not measurements.
        closest = sorted(trials, key=lambda t: (t.status == "failed", max(t.constraints.values())))[
            :3
        ]
    cuts = [_cut_short(trial) for trial in trials]
    cuts = [cut for cut in cuts if cut]
    errors = _prediction_errors(trials, objectives)
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
        knobs=tuple(
            knob
            for knob in KNOBS
            if any(knob in t.params or f"{knob}_log2" in t.params for t in trials)
        ),
        prediction_error={name: float(np.median(values)) for name, values in errors.items()},
        predicted_trials=max((len(values) for values in errors.values()), default=0),
    )


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
        if trial.status != "complete" or not guess or _cut_short(trial):
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
            raise TunerError(f"--study: name the study (studies in {where}: {listing})")
        return own[0]
    if name not in names:
        raise TunerError(
            f"--study {name}: no such study in {where} (studies: {', '.join(names) or 'none'})"
        )
    return name


def study_trace(record: StudyRecord) -> tuple[Trace | None, str | None]:
    """The study's trace, shaped as the study shaped it, when this machine still has it
    unchanged (else ``None`` and why)."""
    path = Path(record.trace_path)
    try:
        data = read_input(path)
    except OSError as exc:
        return None, f"the study's trace {path} cannot be read here ({exc.strerror or exc})"
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
        raise TunerError(f"--study {name}: no such study in {redact_url(store.url)}")
    study = optuna.load_study(study_name=name, storage=store.url)
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


def _cut_short(trial: TrialRecord) -> dict[str, Any]:
    """The early-abort record of a trial (empty when it ran to the end)."""
    return dict(((trial.metrics or {}).get("details") or {}).get("cut_short") or {})


def _fmt(name: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if name == "rate_multiplier":
        return f"{value:.3g}×"
    return format_seconds(value)


COLUMNS = {
    "max_num_batched_tokens": "tokens",
    "max_num_seqs": "seqs",
    "enable_chunked_prefill": "chunked",
    "long_prefill_token_threshold": "thresh.",
    "scheduler_reserve_full_isl": "reserve",
    "async_scheduling": "async",
    "max_num_partial_prefills": "partial",
    "max_long_partial_prefills": "long p.",
}
"""Short column names, so the table fits 80 columns; a legend under it gives the flags."""


def knob_cells(settings: dict[str, Any], knobs: Sequence[str]) -> list[str]:
    """Table cells of ``settings`` for ``knobs``: on/off, off for a zero threshold."""
    cells = []
    for knob in knobs:
        value = settings.get(knob, "")
        if isinstance(value, bool):
            cells.append("on" if value else "off")
        elif knob == "long_prefill_token_threshold" and value == 0:
            cells.append("off")
        else:
            cells.append(str(value))
    return cells


def objective_header(name: str) -> Text:
    """A column header for an objective: a class's statistic on two lines (``p99_ttft`` over
    ``[interactive]``), so the table stays narrow; never read as markup."""
    statistic, bracket, rest = name.partition("[")
    return Text(f"{statistic}\n{bracket}{rest}" if bracket else name)


def knob_legend(knobs: Sequence[str]) -> str:
    """The caption naming the flags behind :data:`COLUMNS`' short names."""
    return "; ".join(f"{COLUMNS.get(knob, knob)}: {knob}" for knob in knobs)


def render_summary(summary: StudySummary) -> Group:
    """Tables and text for the terminal."""
    knobs = summary.knobs or tuple(KNOBS)
    parts: list[Any] = []
    study = summary.study
    parts.append(
        Text(
            f"study {study.name}: {summary.finished} trials; SLOs "
            f"{', '.join(study.slos)}; objective {study.objective_mode}"
        )
    )
    if summary.baseline is not None:
        parts += [
            Text(f"note: {note}")
            for note in summary.baseline.repairs or ()
            if note.startswith(BASELINE_OUTSIDE)
        ]
    if summary.cut_short:
        parts.append(
            Text(
                f"early abort: {summary.cut_short} trials cut short once their SLOs were "
                f"certainly missed, saving at least {summary.saved_s:.0f} s of replay"
            )
        )
    if summary.pareto:
        parts.append(_pareto_table(summary, knobs))
        if any("[" in name for name in summary.objectives):
            parts.append(_class_table(summary))
        recommended = summary.recommended
        assert recommended is not None
        parts.append(
            Text(
                f"\nrecommended: trial {recommended.trial_number}, chosen by the {RULE}",
                style="bold",
            )
        )
        if summary.baseline is not None:
            parts.append(Text(_improvement(summary, recommended, summary.baseline)))
        guess = predicted(recommended)
        if guess:
            shown = "; ".join(
                f"{name} {_fmt(name, guess.get(name))} (measured "
                f"{_fmt(name, recommended.objectives.get(name))})"
                for name in summary.objectives
            )
            parts.append(Text(f"the simulator predicted for it: {shown}"))
        if summary.prediction_error:
            shown = ", ".join(
                f"{name} {error:.0%}" for name, error in summary.prediction_error.items()
            )
            parts.append(
                Text(
                    f"prediction error over {summary.predicted_trials} real trials (median "
                    f"|predicted / measured − 1|): {shown}"
                )
            )
        parts.append(Text("\nserve lines (recommended first):", style="bold"))
        ordered = [recommended] + [t for t in summary.pareto if t is not recommended]
        for trial in ordered:  # never wrapped: a pasted line must run as printed
            parts.append(Text(trial.serve_command, no_wrap=True, overflow="ignore"))
    else:
        parts.append(Text("\nNo trial met the SLOs.", style="bold red"))
        for trial in summary.closest:
            if trial.status == "failed":
                parts.append(Text(failed_text(trial)))
                parts.append(Text(f"  {trial.serve_command}", no_wrap=True, overflow="ignore"))
                continue
            binding = max(trial.constraints, key=lambda name: trial.constraints[name])
            cut = _cut_short(trial)
            if binding == ERRORS and trial.failure_reason:
                detail = trial.failure_reason
            elif cut:
                detail = f"cut short: {cut['reason']}"
            else:
                detail = _binding_text(trial, binding)
            parts.append(Text(f"trial {trial.trial_number}: binding {binding}: {detail}"))
            # never wrapped: a pasted line must run as printed
            parts.append(Text(f"  {trial.serve_command}", no_wrap=True, overflow="ignore"))
    return Group(*parts)


def failed_text(trial: TrialRecord) -> str:
    """A failed trial as people should read it: failed, why, and where its log is (never the
    penalty values the optimiser was given)."""
    log = f" (log: {trial.log_path})" if trial.log_path else ""
    return f"trial {trial.trial_number} failed: {trial.failure_reason or 'no reason recorded'}{log}"


def _binding_text(trial: TrialRecord, name: str) -> str:
    excess = trial.constraints[name]
    if name == ERRORS:
        failed = (trial.metrics or {}).get("failed")
        return f"{failed} requests failed"
    return f"{excess:+.0%} over the limit"


def narrow_table(caption: str, title: str | None = None) -> Table:
    """A table as narrow as its cells allow (for 80 columns), its caption left-aligned."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        collapse_padding=True,
        pad_edge=False,
        caption=caption,
        caption_justify="left",
    )


def _pareto_table(summary: StudySummary, knobs: Sequence[str]) -> Table:
    """One row per Pareto-optimal trial, narrow enough for 80 columns (no value is ever cut:
    a value too wide for the terminal folds onto a second line)."""
    table = narrow_table(
        knob_legend(knobs), title="Pareto-optimal settings that meet every SLO (* recommended)"
    )
    table.add_column("trial", justify="right", overflow="fold")
    for knob in knobs:
        table.add_column(COLUMNS.get(knob, knob), justify="right", overflow="fold")
    shown = [name for name in summary.objectives if "[" not in name]
    for name in shown:
        table.add_column(name, justify="right", overflow="fold")
    table.add_column("tok/s", justify="right", overflow="fold")
    table.add_column("slack", justify="right", overflow="fold")
    for trial in summary.pareto:
        mark = "*" if trial is summary.recommended else ""
        throughput = (trial.metrics or {}).get("output_throughput")
        slack = min(trial.slacks.values(), default=None)
        table.add_row(
            f"{trial.trial_number}{mark}",
            *knob_cells(trial.settings, knobs),
            *(_fmt(name, trial.objectives.get(name)) for name in shown),
            "n/a" if throughput is None else f"{throughput:,.0f}",
            "n/a" if slack is None else f"{slack:.0%}",
        )
    return table


def _class_table(summary: StudySummary) -> Table:
    """The per-class objectives of the Pareto-optimal trials, apart from the main table so
    that both fit 80 columns."""
    names = [name for name in summary.objectives if "[" in name]
    table = narrow_table("", title="Per traffic class")
    table.add_column("trial", justify="right", overflow="fold")
    for name in names:
        table.add_column(objective_header(name), justify="right", overflow="fold")
    for trial in summary.pareto:
        mark = "*" if trial is summary.recommended else ""
        table.add_row(
            f"{trial.trial_number}{mark}",
            *(_fmt(name, trial.objectives.get(name)) for name in names),
        )
    return table


def _improvement(summary: StudySummary, best: TrialRecord, baseline: TrialRecord) -> str:
    if best is baseline:
        return (
            f"the engine's default settings (the baseline, trial {baseline.trial_number}) are "
            "already the best choice"
        )
    parts = []
    for name, direction in zip(summary.objectives, summary.directions, strict=False):
        new, old = best.objectives.get(name), baseline.objectives.get(name)
        if new is None or old is None or not old:
            continue
        change = (new - old) / old
        better = change < 0 if direction == "minimize" else change > 0
        parts.append(
            f"{name} {_fmt(name, old)} → {_fmt(name, new)} "
            f"({'better' if better else 'worse'} by {abs(change):.0%})"
        )
    status = "meets" if baseline.feasible else "violates"
    return (
        f"against the engine defaults (trial {baseline.trial_number}, which {status} the "
        f"SLOs): " + "; ".join(parts)
    )


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
        ]
        for trial in ordered[1:]:
            lines.append(f"# alternative on the Pareto front (trial {trial.trial_number}):")
            lines.append("# " + trial.serve_command)
        return "\n".join(lines) + "\n"
    if fmt == "yaml":  # the stored line: the user's own arguments and the repaired settings
        return command_yaml(ordered[0].serve_command)
    raise ValueError(f"no such export format: {fmt}")
