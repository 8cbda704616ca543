"""The terminal's tables of a study's result (``tune run``, ``tune pareto``, ``tune
trials``): rich renderings of :class:`~prefill_tuner.study.summary.StudySummary`, which is the
data; the output wing draws the JSON documents and the HTML report from the same."""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from prefill_tuner import defaults
from prefill_tuner.objectives.scoring import ERRORS
from prefill_tuner.objectives.slo import format_seconds
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.space import BASELINE_OUTSIDE
from prefill_tuner.storage.models import TrialRecord
from prefill_tuner.storage.store import redact_url
from prefill_tuner.study.headline import headline
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


ExplainOpt = Annotated[
    bool,
    typer.Option(
        "--explain",
        help="Also print why this setting: the recommendation rule, the headroom checks and "
        "their rule, the judge windows, the full change against the engine defaults, the "
        "simulator's predictions.",
    ),
]
AllOpt = Annotated[
    bool,
    typer.Option(
        "--all",
        help="Print every Pareto-optimal setting's serve line (by default: the recommended "
        "one and the two nearest alternatives).",
    ),
]
ALTERNATIVES = 2
"""Alternatives whose serve lines are printed without ``--all``."""


def render_summary(
    summary: StudySummary,
    *,
    explain: bool = False,
    every: bool = False,
    warnings: Sequence[str] = (),
) -> Group:
    """Tables and text for the terminal, the answer first: the recommended setting (what it
    changes against the engine defaults, its load headroom) and its serve line, ``warnings``
    (:mod:`prefill_tuner.study.saturation`), the Pareto table, the nearest alternatives'
    serve lines (every one with ``every``); the rules and their reasoning with ``explain``.
    When nothing met the SLOs: the closest trials and what binds them."""
    knobs = summary.knobs or tuple(KNOBS)
    parts: list[Any] = []
    recommended = summary.recommended
    if recommended is None:
        parts += _closest(summary)
    else:
        parts.append(Text(answer_line(summary, recommended), style="bold"))
        parts.append(_serve(recommended))  # never wrapped: a pasted line must run as printed
        parts += [Text(f"note: {note}") for note in _outside_notes(recommended)]
        parts += [Text(line) for line in _margin_lines(summary)]
        parts += [Text(line, style="yellow") for line in warnings]
        parts.append(Text(""))
        parts.append(_pareto_table(summary, knobs))
        if any("[" in name for name in summary.objectives):
            parts.append(_class_table(summary))
        parts += _alternatives(summary, recommended, every)
    if explain:
        parts += [Text("\nwhy:", style="bold"), *(Text(line) for line in explanation(summary))]
    return Group(*parts)


def answer_line(summary: StudySummary, recommended: TrialRecord) -> str:
    """The recommendation in a line: what it changes against the engine defaults and how
    much more load it carries (:mod:`prefill_tuner.study.headline`)."""
    answer = headline(summary)
    words = [f"recommended: trial {recommended.trial_number}"]
    if answer is not None and answer.baseline is recommended:
        words.append("the engine defaults: already the best choice")
    elif answer is not None and answer.changes:
        changes = ", ".join(change.words() for change in answer.changes)
        words.append(f"against the engine defaults: {changes}")
    if summary.headroom is None:
        words.append("headroom: not checked")
    else:
        chosen = summary.headroom.chosen
        words.append(chosen.load_words())
        if not chosen.neighbours_meet:
            words.append(chosen.neighbour_words())
    return "; ".join(words)


def _serve(trial: TrialRecord) -> Text:
    return Text(trial.serve_command, no_wrap=True, overflow="ignore")


def _outside_notes(trial: TrialRecord) -> list[str]:
    """A baseline's settings outside the searched space (a recommended one's serve line holds
    values no other trial could: said beside it)."""
    return [note for note in trial.repairs or () if note.startswith(BASELINE_OUTSIDE)]


def _margin_lines(summary: StudySummary) -> list[str]:
    """The required load margin and whether it is carried (the exit code follows it)."""
    if summary.headroom is None or summary.headroom.margin is None:
        return []
    return [line for line in summary.headroom.lines() if line.startswith("required load margin")]


def alternatives(summary: StudySummary, recommended: TrialRecord) -> list[TrialRecord]:
    """The other Pareto-optimal settings, nearest to the recommendation in the table's order
    first (its neighbours on the front: the smallest trade each way)."""
    front = summary.pareto
    at = front.index(recommended)
    others = [index for index in range(len(front)) if index != at]
    return [front[index] for index in sorted(others, key=lambda index: (abs(index - at), index))]


def _alternatives(summary: StudySummary, recommended: TrialRecord, every: bool) -> list[Text]:
    others = alternatives(summary, recommended)
    if not others:
        return []
    shown = others if every else others[:ALTERNATIVES]
    if every:
        title = "every alternative on the Pareto front:"
    else:
        hidden = len(others) - len(shown)
        rest = f"; --all prints all {len(others)}" if hidden else ""
        title = f"alternatives (its neighbours on the front{rest}):"
    parts = [Text(f"\n{title}", style="bold")]
    for trial in sorted(shown, key=summary.pareto.index):
        measured = ", ".join(
            f"{name} {_fmt(name, trial.objectives.get(name))}" for name in summary.objectives
        )
        parts.append(Text(f"trial {trial.trial_number} ({measured}):"))
        parts.append(_serve(trial))
    return parts


def explanation(summary: StudySummary) -> list[str]:
    """Why the recommendation is what it is (``--explain``; the report states the same): the
    study, the rule that chose, the headroom checks and their rule, the judge windows, the
    change against the engine defaults, the simulator's predictions; or, when nothing met
    the SLOs, the study."""
    study = summary.study
    lines = [
        f"study {study.name}: {summary.finished} trials; SLOs {', '.join(study.slos)}; "
        f"objective {study.objective_mode}"
    ]
    if summary.baseline is not None:
        lines += [f"note: {note}" for note in _outside_notes(summary.baseline)]
    if summary.cut_short:
        lines.append(
            f"early abort: {summary.cut_short} trials cut short once their SLOs were "
            f"certainly missed, saving at least {summary.saved_s:.0f} s of replay"
        )
    recommended = summary.recommended
    if recommended is None:
        return lines
    lines.append(f"recommended: trial {recommended.trial_number}, chosen by the {RULE}")
    lines += headroom_lines(summary)
    lines += window_lines(recommended)
    if summary.baseline is not None:
        lines.append(_improvement(summary, recommended, summary.baseline))
    guess = predicted(recommended)
    if guess:
        shown = "; ".join(
            f"{name} {_fmt(name, guess.get(name))} (measured "
            f"{_fmt(name, recommended.objectives.get(name))})"
            for name in summary.objectives
        )
        lines.append(f"the simulator predicted for it: {shown}")
    if summary.prediction_error:
        shown = ", ".join(f"{name} {error:.0%}" for name, error in summary.prediction_error.items())
        lines.append(
            f"prediction error over {summary.predicted_trials} real trials (median "
            f"|predicted / measured − 1|): {shown}"
        )
    return lines


def _closest(summary: StudySummary) -> list[Text]:
    """When nothing met the SLOs: the closest trials, what binds each, and its serve line."""
    parts = [Text("No trial met the SLOs.", style="bold red")]
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
    return parts


def render_next(summary: StudySummary, storage: str, *, report: bool) -> Text:
    """Where the study is kept and the commands that go on from here, as they run (each one
    checked by a test): export the recommended setting's YAML, diagnose it, write the report
    (``report``: none was written), see why it was chosen."""
    name = summary.study.name
    hidden = redact_url(storage) != storage
    study = ["--study", name]
    if storage != defaults.STORAGE and not hidden:
        study += ["--storage", storage]
    chosen = summary.recommended or summary.closest_measured
    commands: list[tuple[list[str], str]] = []
    if summary.recommended is not None:
        export = ["tune", "export", *study, "--format", "yaml", "-o", f"{name}.yaml"]
        commands.append((export, "the setting as a vllm serve --config file"))
    if chosen is not None:
        diagnose = ["tune", "diagnose", *study, "--trial", str(chosen.trial_number)]
        commands.append((diagnose, "what its run shows, and the knob to move"))
    if report:
        commands.append((["tune", "report", *study], "the HTML report"))
    if summary.recommended is not None:
        commands.append((["tune", "pareto", *study, "--explain"], "why this setting"))
    where = f"study {name} ({summary.finished} trials; SLOs {', '.join(summary.study.slos)})"
    lines = [f"\n{where} is stored in {redact_url(storage)}; next:"]
    lines += [f"  {shlex.join(command)}  # {why}" for command, why in commands]
    if hidden:
        lines.append("  (with TUNE_STORAGE set to the database URL: its password is not printed)")
    return Text("\n".join(lines), no_wrap=True, overflow="ignore")


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
    a value too wide for the terminal folds onto a second line). A measured column that says
    nothing (the same in every row: the output rate of an open-loop replay the server keeps
    up with) is left out."""
    table = narrow_table(
        knob_legend(knobs), title="Pareto-optimal settings that meet every SLO (* recommended)"
    )
    shown = [name for name in summary.objectives if "[" not in name]
    rows = []
    for trial in summary.pareto:
        throughput = (trial.metrics or {}).get("output_throughput")
        slack = min(trial.slacks.values(), default=None)
        rows.append(
            [
                *(_fmt(name, trial.objectives.get(name)) for name in shown),
                "n/a" if throughput is None else f"{throughput:,.0f}",
                "n/a" if slack is None else f"{slack:.0%}",
            ]
        )
    measured = [*shown, "tok/s", "slack"]
    kept = [
        index
        for index in range(len(measured))
        if len(rows) < 2 or len({row[index] for row in rows}) > 1
    ]
    table.add_column("trial", justify="right", overflow="fold")
    for knob in knobs:
        table.add_column(COLUMNS.get(knob, knob), justify="right", overflow="fold")
    for index in kept:
        table.add_column(measured[index], justify="right", overflow="fold")
    for trial, row in zip(summary.pareto, rows, strict=True):
        mark = "*" if trial is summary.recommended else ""
        table.add_row(
            f"{trial.trial_number}{mark}",
            *knob_cells(trial.settings, knobs),
            *(row[index] for index in kept),
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
