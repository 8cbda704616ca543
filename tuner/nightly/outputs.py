"""What a night leaves behind for people and pipelines: a dated Markdown report (what changed,
incumbent against challenger, the decision and its rule) and the serve lines of the deployed
configuration (``serve.sh``, and ``serve.yaml`` for ``vllm serve --config``), replaced
atomically so a deployment never reads half a file."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from prefill_tuner.files import atomic_text
from prefill_tuner.nightly import promotion
from prefill_tuner.nightly.job import NightlyJob
from prefill_tuner.objectives.slo import format_seconds
from prefill_tuner.search_spaces.render import command_yaml
from prefill_tuner.search_spaces.space import EngineCapabilities
from prefill_tuner.storage.models import NightlyRun
from prefill_tuner.study.summary import StudySummary

TRACE_ROWS = (
    ("requests", "requests", "{:,}"),
    ("mean rate (req/s)", "mean_rate", "{:.2f}"),
    ("burstiness (index of dispersion)", "index_of_dispersion", "{:.2f}"),
    ("prompt tokens p50 / p99", "prompt_tokens", None),
    ("output tokens p50 / p99", "output_tokens", None),
    ("prefix reuse", "prefix_reuse", "{:.1%}"),
)


def write_outputs(
    nightly: NightlyJob,
    night: NightlyRun,
    previous: NightlyRun | None,
    summary: StudySummary,
    capabilities: EngineCapabilities,
) -> Path:
    """Write the report and, when something is deployed, its serve files; return the report's
    path."""
    folder = nightly.report_dir / nightly.family
    folder.mkdir(parents=True, exist_ok=True)
    date = night.started_at.strftime("%Y-%m-%d")
    report = folder / f"{date}-g{night.generation}.md"
    with atomic_text(report) as stream:
        stream.write(render(nightly, night, previous, summary))
    if night.deployed is not None and night.serve_command:
        model = nightly.plan.model
        with atomic_text(folder / "serve.sh", executable=True) as stream:
            stream.write(f"#!/bin/sh\n# {night.study_name}: {night.decision}, {date}\n")
            stream.write(f'exec {night.serve_command} "$@"\n')
        with atomic_text(folder / "serve.yaml") as stream:
            stream.write(f"# vllm serve {shlex.quote(model)} --config serve.yaml\n")
            stream.write(command_yaml(night.serve_command, with_model=False))
    return report


def render(
    nightly: NightlyJob, night: NightlyRun, previous: NightlyRun | None, summary: StudySummary
) -> str:
    lines = [
        f"# Nightly retune of {nightly.family}: generation {night.generation}, "
        f"{night.started_at:%Y-%m-%d}",
        "",
        f"**Decision: {night.decision.upper()}**: {night.reason}.",
        "",
        f"SLOs: {', '.join(str(slo) for slo in nightly.plan.slos)}; "
        f"error budget {nightly.plan.error_budget:.1%}; study `{night.study_name}`.",
        "",
        "## What changed",
        "",
        "| | previous night | tonight |",
        "|---|---|---|",
        f"| engine | {previous.engine_version if previous else '-'} | {night.engine_version} |",
        f"| trace | {_trace(previous)} | {_trace(night)} |",
    ]
    for label, key, fmt in TRACE_ROWS:
        before = _stat(previous.trace_stats if previous else {}, key, fmt)
        lines.append(f"| {label} | {before} | {_stat(night.trace_stats, key, fmt)} |")
    if previous is not None and previous.engine_version != night.engine_version:
        lines += [
            "",
            "A new engine version: the incumbent was re-measured on it, and the "
            "search space is the new version's.",
        ]
    lines += ["", "## Incumbent and challenger", ""]
    names = [slo.name for slo in nightly.plan.slos]
    lines.append("| configuration | run | meets SLOs | headroom | " + " | ".join(names) + " |")
    lines.append("|---|---|---|---|" + "---|" * len(names))
    for label, settings, runs in (
        ("incumbent", night.incumbent, night.incumbent_runs),
        ("challenger", night.challenger, night.challenger_runs),
    ):
        if settings is None:
            lines.append(f"| {label} | - | (none) | | " + " | " * len(names))
            continue
        for index, run in enumerate(runs or [{}], start=1):
            values = run.get("values", {})
            cells = [_seconds(values.get(name)) for name in names]
            met = "yes" if run.get("feasible") else (run.get("failure") or "no")
            headroom = run.get("headroom")
            shown = f"{headroom:.1%}" if isinstance(headroom, float) else "-"
            lines.append(f"| {label} | {index} | {met} | {shown} | " + " | ".join(cells) + " |")
    lines += _busiest_lines(night, names)
    for label, settings in (("incumbent", night.incumbent), ("challenger", night.challenger)):
        if settings is not None:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
            lines.append(f"\n{label}: `{shown}`")
    lines += [
        "",
        "## Search",
        "",
        f"{summary.finished} trials, {len(summary.pareto)} Pareto-optimal settings meeting the "
        f"SLOs; `tune pareto --study {night.study_name}` lists them.",
        "",
        "## Deployed next",
        "",
    ]
    if night.serve_command:
        lines += ["```sh", night.serve_command, "```"]
    else:
        lines.append("Nothing: no configuration has met the SLOs yet.")
    lines += ["", "## The promotion rule", "", _rule(), ""]
    return "\n".join(lines)


def _busiest_lines(night: NightlyRun, names: list[str]) -> list[str]:
    """The incumbent and challenger on tonight's busiest window (not part of the decision)."""
    busiest = night.busiest
    if not busiest:
        return []
    lines = [
        "",
        f"### On tonight's busiest window ({busiest['window']}: {busiest['requests']} requests "
        f"from {busiest['start_s']:g} s)",
        "",
        "The traffic that is coming may look like this stretch more than like the night's "
        "average; one run each, not part of the decision.",
        "",
        "| configuration | meets SLOs | headroom | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for label in ("incumbent", "challenger"):
        for run in busiest.get(f"{label}_runs") or []:
            values = run.get("values", {})
            met = "yes" if run.get("feasible") else (run.get("failure") or "no")
            headroom = run.get("headroom")
            shown = f"{headroom:.1%}" if isinstance(headroom, float) else "-"
            cells = [_seconds(values.get(name)) for name in names]
            lines.append(f"| {label} | {met} | {shown} | " + " | ".join(cells) + " |")
    return lines


def _rule() -> str:
    text = promotion.__doc__ or ""
    start = text.find("Each configuration")
    return text[start:].strip() if start >= 0 else text.strip()


def _trace(night: NightlyRun | None) -> str:
    if night is None:
        return "-"
    return f"`{night.trace_path}` (sha256 {night.trace_sha256[:12]})"


def _stat(stats: dict[str, Any], key: str, fmt: str | None) -> str:
    value = stats.get(key)
    if value is None:
        return "-"
    if fmt is None:
        return f"{value['p50']:,.0f} / {value['p99']:,.0f}"
    return fmt.format(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else format_seconds(value)
