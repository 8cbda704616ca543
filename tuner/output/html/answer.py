"""The report's first section: the answer, before any figure. The serve line to deploy (with a
copy button), what it changes against the engine's defaults, and how much more load it
carries; or, when nothing met the SLOs, the closest trial and what it misses
(:mod:`prefill_tuner.study.headline`)."""

from __future__ import annotations

import html

from prefill_tuner.study.headline import Headline, headline
from prefill_tuner.study.summary import StudySummary


def answer_section(summary: StudySummary) -> str:
    """The section's HTML (its ``<h2>`` is the page's)."""
    answer = headline(summary)
    if answer is None:
        return '<p class="lead">Every trial failed: there is nothing to deploy (see the table).</p>'
    trial = answer.trial.trial_number
    if not answer.met:
        lead = (
            f"<b>No setting met the SLOs.</b> The closest is trial {trial}: "
            + html.escape("; ".join(answer.missed) or "it misses them")
            + ". Its serve line, which does <b>not</b> meet them:"
        )
        return _lead(lead) + _serve_line(answer) + _against(answer)
    if answer.baseline is not None and answer.trial is answer.baseline:
        lead = (
            f"<b>Keep the engine's defaults</b> (trial {trial}, the baseline): no setting tried "
            "does better"
        )
    else:
        lead = f"<b>Deploy trial {trial}</b>" + (": " + _changes(answer) if answer.changes else "")
    lead += "; " + html.escape(answer.headroom or "its load headroom was not checked") + "."
    if not summary.margin_met and summary.headroom is not None:
        lead += (
            f" <b>It does not carry the required load margin ({summary.headroom.margin:g}×).</b>"
        )
    return (
        _lead(lead)
        + _serve_line(answer)
        + '<p class="note">How it was chosen, the load and neighbour checks and the '
        '<code>--config</code> YAML: <a href="#serve">Serve it</a>.</p>'
    )


def _changes(answer: Headline) -> str:
    """``p99 TPOT 100 → 38.2 ms, p99 TTFT 2.21 → 2.58 s against the engine's defaults (trial
    0, which misses the SLOs)``, each change marked better or worse."""
    parts = [
        f'<span class="{"better" if change.better else "worse"}">'
        f"{html.escape(change.words())}</span>"
        for change in answer.changes
    ]
    return ", ".join(parts) + _defaults_words(answer)


def _against(answer: Headline) -> str:
    if not answer.changes:
        return ""
    return f'<p class="note">{_changes(answer)}.</p>'


def _defaults_words(answer: Headline) -> str:
    baseline = answer.baseline
    if baseline is None:
        return ""
    verdict = "meets" if baseline.feasible else "misses"
    return (
        f" against the engine's defaults (trial {baseline.trial_number}, which {verdict} the SLOs)"
    )


def _lead(text: str) -> str:
    return f'<p class="lead">{text}</p>'


def _serve_line(answer: Headline) -> str:
    return (
        f'<pre id="answer-serve-line">{html.escape(answer.serve_command)}</pre>'
        '<button data-copy="answer-serve-line">Copy the serve line</button>'
    )
