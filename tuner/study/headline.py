"""The answer of a study in a line: the setting to deploy, what it changes against the engine's
defaults ("p99 TPOT 100 → 38.2 ms, p99 TTFT 2.21 → 2.58 s") and how much more load it carries
("meets the SLOs up to 1.25× this trace's rate"); or, when nothing met the SLOs, the closest
trial and the SLO it misses. As data, for whatever leads with it (the HTML report's summary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefill_tuner.objectives.slo import parse_slos, split_name
from prefill_tuner.storage.models import TrialRecord
from prefill_tuner.study.plan import RATE_MULTIPLIER
from prefill_tuner.study.summary import StudySummary


@dataclass(frozen=True)
class Change:
    """One objective, at the engine's defaults and at the chosen setting."""

    name: str
    """The objective's key (``p99_tpot``, ``p99_ttft[interactive]``)."""
    before: float
    after: float
    better: bool
    """Whether the change is for the better (lower latency, higher load)."""

    def words(self) -> str:
        """``p99 TPOT 100 → 38.2 ms``: both values in one unit, the larger one's."""
        label = objective_label(self.name)
        if self.name == RATE_MULTIPLIER:
            return f"{label} {self.before:.3g} → {self.after:.3g}×"
        unit, scale = _unit(max(abs(self.before), abs(self.after)))
        return f"{label} {self.before * scale:.3g} → {self.after * scale:.3g} {unit}"


@dataclass(frozen=True)
class Headline:
    """What a report leads with."""

    trial: TrialRecord
    """The recommended trial, or (``met`` false) the one closest to the SLOs."""
    met: bool
    """Whether any setting met the SLOs (``trial`` is then the recommendation)."""
    changes: list[Change]
    """Against the engine's defaults (empty: no baseline measured, or ``trial`` is it)."""
    baseline: TrialRecord | None
    headroom: str | None
    """``meets the SLOs up to 1.25× this trace's rate (not at 1.5×)``; ``None``: not checked."""
    missed: list[str]
    """When nothing met them: ``p99 TPOT 62.1 ms against its 50 ms limit``, per SLO missed."""

    @property
    def serve_command(self) -> str:
        return self.trial.serve_command


def headline(summary: StudySummary) -> Headline | None:
    """The study's answer (``None`` before any trial finished, or when every trial failed)."""
    trial = summary.recommended or summary.closest_measured
    if trial is None:
        return None
    baseline = summary.baseline
    measured = baseline is not None and baseline.status != "failed"
    changes = changes_against(summary, trial, baseline) if measured and baseline else []
    headroom = None
    if summary.recommended is not None and summary.headroom is not None:
        headroom = summary.headroom.chosen.load_words()
    return Headline(
        trial=trial,
        met=summary.recommended is not None,
        changes=changes,
        baseline=baseline if measured else None,
        headroom=headroom,
        missed=[] if summary.recommended is not None else _missed(summary, trial),
    )


def changes_against(
    summary: StudySummary, trial: TrialRecord, baseline: TrialRecord
) -> list[Change]:
    """``trial``'s objectives against the baseline's, the SLO'd ones first (none when
    ``trial`` is the baseline)."""
    if trial is baseline:
        return []
    limited = {slo.name for slo in parse_slos(list(summary.study.slos))}
    directions = dict(zip(summary.objectives, summary.directions, strict=False))
    order = sorted(summary.objectives, key=lambda name: name not in limited)  # stable
    changes = []
    for name in order:
        before, after = baseline.objectives.get(name), trial.objectives.get(name)
        if before is None or after is None or not math.isfinite(before * after):
            continue
        lower = directions.get(name, "minimize") == "minimize"
        better = after < before if lower else after > before
        changes.append(Change(name, before, after, better))
    return changes


def _missed(summary: StudySummary, trial: TrialRecord) -> list[str]:
    words = []
    for slo in parse_slos(list(summary.study.slos)):
        value = trial.objectives.get(slo.name)
        if value is None or not math.isfinite(value) or value <= slo.limit_s:
            continue
        unit, scale = _unit(max(value, slo.limit_s))
        words.append(
            f"{objective_label(slo.name)} {value * scale:.3g} {unit} against its "
            f"{slo.limit_s * scale:.3g} {unit} limit"
        )
    return words


def objective_label(name: str) -> str:
    """``p99_tpot`` → ``p99 TPOT``; ``p99_ttft[interactive]`` → ``p99 TTFT (interactive)``;
    anything else as it is named."""
    try:
        statistic, metric, traffic_class = split_name(name)
    except ValueError:
        return name.replace("_", " ")
    label = f"{statistic} {metric.upper()}"
    return label if traffic_class is None else f"{label} ({traffic_class})"


def _unit(seconds: float) -> tuple[str, float]:
    """The unit to show ``seconds`` in, and its scale."""
    if seconds >= 1:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e3
    return "us", 1e6
