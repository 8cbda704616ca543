"""``tune report``: one self-contained HTML file explaining a study's recommendation.

It works offline (plotly.js is embedded once, no CDN, no request to any server) and leads with
the answer (the serve line to deploy, what it changes against the engine's defaults, its load
headroom: :mod:`prefill_tuner.output.html.answer`), then holds: the study's definition, every
trial on the Pareto plot, Optuna's history and importance plots, the baseline against the
recommended setting (latency CDFs, the step and inter-token timeline around the longest
prompt's arrival, the load over the run), the sortable trial table, and the recommended serve
line and ``--config`` YAML, copyable. The timeline is also written as a PNG beside the page
(:mod:`prefill_tuner.output.html.image`), for a ticket.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import plotly.graph_objects as go
import plotly.offline

from prefill_tuner.diagnosis import Finding, diagnose
from prefill_tuner.diagnosis.runs import trial_view
from prefill_tuner.engines.timeline import build_timeline
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_bytes, atomic_text, check_output
from prefill_tuner.objectives.slo import Slo, format_seconds, parse_slos
from prefill_tuner.output.html.answer import answer_section
from prefill_tuner.output.html.figures import cdf_figure, load_figure, optuna_figures, pareto_figure
from prefill_tuner.output.html.image import timeline_png
from prefill_tuner.output.html.timeline import timeline_figure
from prefill_tuner.search_spaces.render import command_yaml
from prefill_tuner.storage.batched import optuna_storage
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.recommend import RULE
from prefill_tuner.study.summary import (
    StudySummary,
    headroom_lines,
    knob_cells,
    require_finished,
    study_trace,
    summarize_stored,
    window_lines,
)
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.stats import trace_stats

SECTIONS = (
    ("answer", "Recommendation"),
    ("definition", "Study"),
    ("pareto", "Trials and Pareto front"),
    ("history", "History and importance"),
    ("comparison", "Baseline vs recommended"),
    ("trials", "All trials"),
    ("serve", "Serve it"),
)


@dataclass(frozen=True)
class Compared:
    """The two trials the comparison section draws, with their timelines (or why not)."""

    runs: list[tuple[str, dict[str, Any]]]
    note: str | None
    findings: list[tuple[str, list[Finding], str | None]]
    """Per trial: what ``tune diagnose`` finds in its run (or why it could not)."""


@dataclass(frozen=True)
class Report:
    """A rendered report: the page, and its timeline as a PNG (``None``: no timeline)."""

    page: str
    image: bytes | None


@dataclass(frozen=True)
class ReportFiles:
    """Where a report was written."""

    page: Path
    image: Path | None
    """The timeline's PNG beside the page (:func:`image_path`); ``None``: nothing to draw."""

    def words(self) -> str:
        """``s-report.html (its timeline as a picture: s-report.png)``."""
        image = f" (its timeline as a picture: {self.image})" if self.image else ""
        return f"{self.page}{image}"


def image_path(page: Path) -> Path:
    """Where the timeline's PNG goes: beside the page, ``REPORT.png`` for ``REPORT.html``."""
    image = page.with_suffix(".png")
    return image if image != page else page.with_name(f"{page.name}.png")


def write_report(store: TunerStore, study_name: str, path: Path) -> ReportFiles:
    """Write study ``study_name``'s report to ``path`` and its timeline's PNG beside it
    (:func:`image_path`), each atomically; both paths are checked before the work."""
    image = image_path(path)
    check_output(path)
    check_output(image)
    report = render_report(store, study_name)
    with atomic_text(path) as stream:
        stream.write(report.page)
    if report.image is None:
        return ReportFiles(path, None)
    atomic_bytes(image, report.image)
    return ReportFiles(path, image)


def render_report(store: TunerStore, study_name: str) -> Report:
    """The report's HTML, and its timeline as a PNG."""
    summary = require_finished(summarize_stored(store, study_name))  # no plot has a point
    record = summary.study
    trials = sorted(store.trials(record), key=lambda t: t.trial_number)
    try:
        study = optuna.load_study(study_name=record.name, storage=optuna_storage(store.url))
    except KeyError:
        raise TunerError(f"study {record.name}: no Optuna study of that name") from None
    slos = parse_slos(list(record.slos))
    limits = {slo.name: slo.limit_s for slo in slos}
    trace, trace_note = study_trace(record)
    compared = comparison(summary, trace)
    figures: dict[str, Any] = {
        "pareto": pareto_figure(
            trials, summary.objectives, summary.pareto, limits, summary.recommended
        )
    }
    body = [
        _nav(),
        _section("answer", answer_section(summary)),
        _section("definition", _definition(record, summary, trials, trace, trace_note)),
        _section("pareto", _figure("fig-pareto", figures["pareto"])),
        _section("history", _optuna_section(study, summary.objectives)),
        _section("comparison", _comparison_section(compared, slos)),
        _section("trials", _trial_table(trials, summary)),
        _section("serve", _serve_section(summary)),
    ]
    title = f"tune report: {record.name}"
    page = PAGE.format(
        title=html.escape(title),
        style=STYLE,
        plotly=plotly.offline.get_plotlyjs(),
        body="\n".join(body),
        script=SCRIPT,
    )
    return Report(page, timeline_png(compared.runs, slos) if compared.runs else None)


def comparison(summary: StudySummary, trace: Trace | None) -> Compared:
    """Baseline and recommended (or, when nothing met the SLOs, the closest trial) with
    their timelines: stored with a real trial, simulated again for a simulated one."""
    other = summary.recommended or (summary.closest[0] if summary.closest else None)
    label = "recommended" if summary.recommended is not None else "closest to the SLOs"
    chosen = [
        (f"baseline (trial {t.trial_number})", t) for t in [summary.baseline] if t is not None
    ]
    notes = []
    if other is not None and other is not summary.baseline:
        chosen.append((f"{label} (trial {other.trial_number})", other))
    elif other is not None:
        notes.append(f"the {label} setting is the baseline itself (the engine's defaults)")
    runs, findings = [], []
    for who, trial in chosen:
        timeline, found, note = trial_run(summary.study, trial, trace)
        if timeline is not None:
            runs.append((who, timeline))
        if note:
            notes.append(f"{who}: {note}")
        findings.append((who, found, note if timeline is None else None))
    return Compared(runs, "; ".join(notes) or None, findings)


def trial_run(
    record: StudyRecord, trial: TrialRecord, trace: Trace | None
) -> tuple[dict[str, Any] | None, list[Finding], str | None]:
    """A trial's timeline and findings (or why not): a real trial's timeline is stored with
    it; a simulated one is simulated again, once for both."""
    if trial.status == "failed":
        return None, [], f"failed ({trial.failure_reason}): nothing to draw"
    stored = ((trial.metrics or {}).get("details") or {}).get("timeline")
    try:
        view = trial_view(record, trial, trace)
    except TunerError as exc:
        return stored, [], None if stored is not None else str(exc)
    served = view.share or trace  # a tune plan trial: its busiest replica's requests
    if stored is None and view.records and served is not None:
        stored = build_timeline(served, view.records, view.steps)
    note = None if stored is not None else "this trial kept no timeline"
    if view.share is not None:
        note = f"drawn from {view.source}"
    return stored, diagnose(view), note


def _nav() -> str:
    links = " · ".join(f'<a href="#{key}">{html.escape(title)}</a>' for key, title in SECTIONS)
    return f"<nav>{links}</nav>"


def _section(key: str, content: str) -> str:
    title = dict(SECTIONS)[key]
    return f'<section id="{key}"><h2>{html.escape(title)}</h2>\n{content}\n</section>'


def _figure(div_id: str, figure: go.Figure) -> str:
    return figure.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="definition">{cells}</table>'


def _definition(
    record: StudyRecord,
    summary: StudySummary,
    trials: list[TrialRecord],
    trace: Trace | None,
    trace_note: str | None,
) -> str:
    versions = sorted({t.engine_version.version for t in trials})
    profile = next(
        (t.resolved_config["profile"] for t in trials if "profile" in t.resolved_config), None
    )
    if profile is not None:
        provenance = profile.get("provenance") or {}
        kind = provenance.get("kind", "estimated")
        profile_text = f"{profile.get('name')} ({kind}: {profile.get('description', '')})"
    else:
        profile_text = "none (a real engine)"
    counts = {
        "meet the SLOs": sum(t.feasible and t.status != "failed" for t in trials),
        "miss them": sum(not t.feasible and t.status != "failed" for t in trials),
        "failed": sum(t.status == "failed" for t in trials),
        "cut short": summary.cut_short,
    }
    if trace is not None and trace.requests:
        stats = trace_stats(trace)
        trace_text = (
            f"{stats.requests:,} requests over {stats.duration_s:,.0f} s "
            f"({stats.mean_rate:.2f}/s, index of dispersion {stats.index_of_dispersion:.1f}, "
            f"up to {stats.max_per_second} in one second); prompts p50 "
            f"{stats.prompt_tokens['p50']:,.0f} / p99 {stats.prompt_tokens['p99']:,.0f} "
            f"tokens; outputs p50 {stats.output_tokens['p50']:,.0f} tokens"
        )
        if stats.classes:
            classes = ", ".join(f"{name} {count:,}" for name, count in stats.classes.items())
            trace_text += f"; traffic classes: {classes}"
    else:
        trace_text = trace_note or "no requests"
    rows = [
        ("study", record.name),
        ("trace", f"{record.trace_path} (sha256 {record.trace_sha256[:12]}…)"),
        ("traffic", trace_text),
        ("SLOs", ", ".join(record.slos) + f"; error budget {record.error_budget:g}"),
        ("objective", f"{record.objective_mode}: {', '.join(summary.objectives)}"),
        ("engine", f"{record.engine}: {', '.join(versions) or 'no trial yet'}"),
        ("model", record.model),
        ("profile", profile_text),
        ("space", "; ".join(record.space.get("searched", []))),
        ("trials", ", ".join(f"{n} {what}" for what, n in counts.items())),
        ("recommendation rule", RULE),
    ]
    if record.space.get("dropped"):
        rows.insert(9, ("dropped knobs", "; ".join(record.space["dropped"])))
    limit = (record.shaping or {}).get("max_concurrency")
    if limit is not None:
        load = (
            f"closed loop: at most {limit:,} requests in flight; a request "
            "waits for a slot, and its latencies count from its send"
        )
        rows.insert(3, ("load", load))
    return _table(rows)


def _optuna_section(study: optuna.Study, objectives: list[str]) -> str:
    parts = []
    for key, figure in optuna_figures(study, objectives):
        if isinstance(figure, str):
            parts.append(f'<p class="note">{html.escape(figure)}</p>')
        else:
            parts.append(_figure(f"fig-{key}", figure))
    return "\n".join(parts)


def _comparison_section(compared: Compared, slos: Sequence[Slo]) -> str:
    parts = []
    if compared.note:
        parts.append(f'<p class="note">{html.escape(compared.note)}</p>')
    if not compared.runs:
        return "\n".join(parts) or '<p class="note">no trial to draw</p>'
    sources = {timeline["load"].get("source") for _, timeline in compared.runs}
    parts += [
        _figure("fig-cdf", cdf_figure(compared.runs)),
        _figure("fig-timeline", timeline_figure(compared.runs, slos)),
        _figure("fig-load", load_figure(compared.runs)),
        f'<script type="application/json" id="timeline-data">'
        f"{_json_script({who: t for who, t in compared.runs})}</script>",
    ]
    parts.append(_findings(compared.findings))
    if "requests" in sources:
        parts.append(
            '<p class="note">Where the engine does not report its queues per step (a real '
            "server's log), running means decoding (first token seen, last not yet) and "
            "waiting means not yet at its first token (queued or in prefill).</p>"
        )
    return "\n".join(parts)


def _findings(findings: list[tuple[str, list[Finding], str | None]]) -> str:
    """What ``tune diagnose`` finds in each compared run, judged against the study's SLOs
    (one within them is greyed: no action needed)."""
    blocks = []
    for who, found, why in findings:
        if why:
            items = f'<li class="note">not diagnosed: {html.escape(why)}</li>'
        elif not found:
            items = "<li>no symptom: no spikes, starved prefill, thrashing, stall or fragments</li>"
        else:
            items = "".join(
                ('<li class="note">' if f.within_slo else "<li>")
                + f"<b>{html.escape(f.symptom)}</b>{' (within SLO)' * f.within_slo}: "
                f"{html.escape(f.summary)}<br>→ {html.escape(f.knob)}</li>"
                for f in found
            )
        blocks.append(f"<h3>What {html.escape(who)} shows</h3><ul>{items}</ul>")
    return '<div id="findings">' + "".join(blocks) + "</div>"


def _json_script(value: Any) -> str:
    """JSON safe inside a ``<script>`` element."""
    return json.dumps(value).replace("</", "<\\/")


def _cell(value: float | None, unit_seconds: bool) -> tuple[str, str]:
    """(text, sort key) of a number."""
    if value is None or not math.isfinite(value):
        return "", ""
    return (format_seconds(value) if unit_seconds else f"{value:g}"), repr(value)


def _trial_table(trials: list[TrialRecord], summary: StudySummary) -> str:
    knobs = list(summary.knobs)
    objectives = summary.objectives
    head = ["trial", "verdict", *knobs, *objectives, "wall (s)", "note"]
    rows = []
    recommended = summary.recommended.trial_number if summary.recommended else None
    for trial in trials:
        verdict = (
            "failed"
            if trial.status == "failed"
            else ("meets SLOs" if trial.feasible else "misses SLOs")
        )
        marks = []
        if trial.is_baseline:
            marks.append("baseline")
        if trial.trial_number == recommended:
            marks.append("recommended")
        cells = [
            (str(trial.trial_number) + (f" ({', '.join(marks)})" if marks else ""),
             repr(trial.trial_number)),
            (verdict, verdict),
        ]  # fmt: skip
        for knob, text in zip(knobs, knob_cells(trial.settings, knobs), strict=True):
            value = trial.settings.get(knob)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            cells.append((text, repr(value) if number else text))
        for name in objectives:
            value = trial.objectives.get(name)
            if trial.status == "failed":
                cells.append(("", ""))
            else:
                cells.append(_cell(value, name != "rate_multiplier"))
        cells.append((f"{trial.wall_s:.1f}", repr(trial.wall_s)))
        details = (trial.metrics or {}).get("details") or {}
        note = trial.failure_reason or ""
        if details.get("cut_short"):
            note = f"cut short: {details['cut_short'].get('reason', '')}"
        cells.append((note, note))
        rows.append(
            (f'<tr class="{" ".join(marks)}">' if marks else "<tr>")
            + "".join(
                f'<td data-sort="{html.escape(key)}">{html.escape(text)}</td>'
                for text, key in cells
            )
            + "</tr>"
        )
    header = "".join(f'<th title="click to sort">{html.escape(h)}</th>' for h in head)
    return (
        '<table id="trial-table" class="sortable"><thead><tr>'
        + header
        + "</tr></thead><tbody>"
        + "\n".join(rows)
        + "</tbody></table>"
    )


def _serve_section(summary: StudySummary) -> str:
    if summary.recommended is None:
        return (
            '<p class="note">No trial met the SLOs: there is no recommendation to serve '
            "(the closest trials are in the table above).</p>"
        )
    command = summary.recommended.serve_command
    yaml_text = command_yaml(command)
    deployable = [*headroom_lines(summary), *window_lines(summary.recommended)]
    return (
        f"<p>Recommended: trial {summary.recommended.trial_number}.</p>"
        + "".join(f'<p class="headroom">{html.escape(line)}</p>' for line in deployable)
        + "<p>The serve line:</p>"
        f'<pre id="serve-line">{html.escape(command)}</pre>'
        '<button data-copy="serve-line">Copy the serve line</button>'
        "<p>Or as a <code>vllm serve MODEL --config FILE</code> YAML:</p>"
        f'<pre id="serve-yaml">{html.escape(yaml_text)}</pre>'
        '<button data-copy="serve-yaml">Copy the YAML</button>'
    )


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
<script>{plotly}</script>
</head><body>
<h1>{title}</h1>
{body}
<script>{script}</script>
</body></html>
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #1d3557; }
nav { position: sticky; top: 0; background: #fff; padding: .5em 0; border-bottom: 1px solid #ddd;
      z-index: 10; }
section { margin: 2em 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
table.sortable th { cursor: pointer; background: #f1f3f5; }
table.definition th { background: #f1f3f5; width: 12em; }
tr.recommended td { background: #fdf3d0; }
tr.baseline td { background: #e7eef0; }
pre { background: #f8f9fa; padding: .8em; white-space: pre-wrap; word-break: break-all; }
.note { color: #6c757d; }
#answer { border: 2px solid #e9c46a; border-radius: 6px; padding: 0 1em 1em; background: #fffbea; }
#answer .lead { font-size: 17px; }
.better { color: #1b7f3b; font-weight: 600; }
.worse { color: #b5451b; font-weight: 600; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 1em; }
"""

SCRIPT = """
document.querySelectorAll("table.sortable th").forEach((th, column) => {
  th.addEventListener("click", () => {
    const body = th.closest("table").tBodies[0];
    const ascending = th.dataset.order !== "asc";
    th.dataset.order = ascending ? "asc" : "desc";
    const key = row => row.cells[column].dataset.sort;
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      const nx = parseFloat(x), ny = parseFloat(y);
      const order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return ascending ? order : -order;
    });
    rows.forEach(row => body.appendChild(row));
  });
});
document.querySelectorAll("button[data-copy]").forEach(button => {
  button.addEventListener("click", () => {
    const text = document.getElementById(button.dataset.copy).textContent;
    navigator.clipboard.writeText(text).then(
      () => { button.textContent = "Copied"; },
      () => { button.textContent = "Select the text and copy it"; });
  });
});
"""
