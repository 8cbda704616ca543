"""The bundled sample shows, in the quick start's first report, what chunked prefill is for:
streams decoding when the longest prompt arrives, stalled by the defaults' whole-budget
prefill steps; and it is the file its README's command makes."""

from __future__ import annotations

import re
from pathlib import Path

from prefill_tuner import defaults
from prefill_tuner.diagnosis import simulated_view
from prefill_tuner.engines.sim import SimConfig, load_profile
from prefill_tuner.engines.timeline import build_timeline
from prefill_tuner.trace import load_trace
from tests.conftest import ROOT


def test_streams_are_decoding_when_the_longest_prompt_is_first_scheduled() -> None:
    profile = load_profile(defaults.PROFILE)
    trace = load_trace(str(defaults.SAMPLE_TRACE))
    baseline = SimConfig(**profile.engine_defaults)  # what tune run's trial 0 runs
    view = simulated_view(trace, baseline, profile)
    longest = max(trace.requests, key=lambda r: r.prompt_tokens)  # the first of the longest
    first = next(s for s in view.steps if longest.id in (s.prefill_chunks or {}))
    assert first.decode_tokens >= 1, "nobody is decoding when the longest prompt is scheduled"
    # ...and the report's ITL panel shows them stall: the gaps around it are no flat line.
    window = build_timeline(trace, view.records, view.steps)["window"]
    assert window["long_prompt"]["id"] == longest.id
    gaps = [gap for stream in window["streams"] for gap in stream["itl_s"]]
    assert len(window["streams"]) >= 2 and max(gaps) > 10 * min(gaps)


def test_the_readme_command_makes_the_sample(tune, tmp_path: Path, monkeypatch) -> None:
    readme = (ROOT / "tuner" / "data" / "README.md").read_text()
    [command] = re.findall(r"```bash\n(tune trace convert .*?)\n```", readme, re.S)
    args = command.replace("\\\n", " ").split()[1:]
    assert args[:3] == ["trace", "convert", "examples/traces/mooncake_conversation_head.jsonl"]
    assert args[3] == "tuner/data/sample_trace.jsonl"
    monkeypatch.chdir(ROOT)
    made = tmp_path / "sample.jsonl"
    code, _, err = tune(*args[:3], str(made), *args[4:])
    assert code == 0, err
    assert made.read_bytes() == defaults.SAMPLE_TRACE.read_bytes()
