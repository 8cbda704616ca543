"""The terminal's tables of a study's result (``tune run``, ``tune pareto``, ``tune
trials``): rich renderings of :class:`~prefill_tuner.study.summary.StudySummary`, which is the
data; the output wing draws the JSON documents and the HTML report from the same."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from prefill_tuner.objectives.scoring import ERRORS
from prefill_tuner.objectives.slo import format_seconds
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.space import BASELINE_OUTSIDE
from prefill_tuner.storage.models import TrialRecord
from prefill_tuner.study.recommend import RULE
from prefill_tuner.study.summary import (
    COLUMNS,
    StudySummary,
    cut_short_record,
    headroom_lines,
    knob_cells,
    knob_legend,
    predicted,
    window_lines,
)


def _fmt(name: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if name == "rate_multiplier":
        return f"{value:.3g}×"
    return format_seconds(value)


def objective_header(name: str) -> Text:
    """A column header for an objective: a class's statistic on two lines (``p99_ttft`` over
    ``[interactive]``), so the table stays narrow; never read as markup."""
    statistic, bracket, rest = name.partition("[")
    return Text(f"{statistic}\n{bracket}{rest}" if bracket else name)


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
        parts += [Text(line) for line in headroom_lines(summary)]
        parts += [Text(line) for line in window_lines(recommended)]
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
            cut = cut_short_record(trial)
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
