"""The quick start's numbers, as the README, the timeline image's alt text and the sample's
README state them, are the main job's as it runs now (issue 41 item 15): the quick-start
command is run, the recommendation and the report's timeline windows are read back, and each
number the texts give is looked for in them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from prefill_tuner.output.html.page import trial_run
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.summary import study_trace, summarize_stored

ROOT = Path(__file__).resolve().parents[1]
STUDY = "sample_trace-latency"


def _window(timeline: dict[str, Any]) -> dict[str, Any]:
    """What the texts say of one run's timeline window: the streams, their slowest and
    fastest token gaps, and the steps that prefilled while the longest prompt waited for its
    first token."""
    window = timeline["window"]
    gaps = [gap for stream in window["streams"] for gap in stream["itl_s"]]
    prompt = window["long_prompt"]
    steps = window["steps"]
    prefills = [
        start
        for start, tokens in zip(steps["start_s"], steps["prefill_tokens"], strict=True)
        if tokens > 0 and prompt["arrival_s"] <= start < prompt["first_token_s"]
    ]
    return {
        "streams": len(window["streams"]),
        "slowest_ms": f"{max(gaps) * 1000:.0f} ms",
        "fastest_ms": f"{min(gaps) * 1000:.1f}",
        "prefill_steps": len(prefills),
    }


@pytest.mark.slow
def test_the_texts_give_the_quick_starts_numbers(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = tune("run", "--slo", "p99_tpot=50ms", "--no-report")
    assert code == 0, err
    answer = out.splitlines()[0]
    store = TunerStore("sqlite:///tune.db")
    summary = summarize_stored(store, STUDY)
    assert summary.recommended is not None and summary.baseline is not None
    trace, _ = study_trace(summary.study)
    runs = {}
    for who, trial in (("defaults", summary.baseline), ("recommended", summary.recommended)):
        timeline, _, note = trial_run(summary.study, trial, trace)
        assert timeline is not None, note
        runs[who] = _window(timeline)
    defaults, chosen = runs["defaults"], runs["recommended"]
    budget = f"{summary.recommended.settings['max_num_batched_tokens']:,}"

    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```", 1)[0]
    quick = " ".join(quick.split())
    for change in re.findall(r"p99 \w+ [\d.]+ → [\d.]+ m?s", answer):  # the answer line's
        assert change in quick, change
    assert re.search(r"up to [\d.]+×", answer)[0] in quick  # type: ignore[index]
    assert f"{defaults['streams']} streams waiting up to {defaults['slowest_ms']} a token" in quick
    assert f"at most {chosen['slowest_ms']} with the recommended {budget}-token budget" in quick

    alt = re.search(r"!\[([^]]*)\]\(docs/images/report-timeline\.png\)", readme)
    assert alt is not None
    assert alt[1] == (
        f"The report's timeline: the defaults stall {defaults['streams']} streams up to "
        f"{defaults['slowest_ms']} a token in {defaults['prefill_steps']} whole-budget prefill "
        f"steps; the recommended {budget}-token budget spreads that prompt over "
        f"{chosen['prefill_steps']} steps of at most {chosen['slowest_ms']}"
    )

    sample = " ".join((ROOT / "tuner" / "data" / "README.md").read_text().split())
    assert (
        f"{defaults['streams']} streams are decoding when the engine's defaults" in sample
        and f"up to {defaults['slowest_ms']} a token through its "
        f"{defaults['prefill_steps']} whole-budget steps"
        in sample
        and f"(a budget of {budget} tokens) spreads the prompt over "
        f"{chosen['prefill_steps']} steps of at most {chosen['slowest_ms']}"
        in sample
        and f"between {chosen['fastest_ms']} and {chosen['slowest_ms']}" in sample
    ), "tuner/data/README.md"
