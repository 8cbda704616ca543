"""Synthetic workloads: reproducible, at the asked rate and mix, bursty when asked."""

from __future__ import annotations

import numpy as np
import pytest

from prefill_tuner.errors import TunerError
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.stats import trace_stats
from prefill_tuner.trace.synth import PRESETS, parse_burst, parse_mix, synthesize


def test_presets_have_the_documented_shapes() -> None:
    shapes = {name: (c.prompt_tokens, c.output_tokens) for name, c in PRESETS.items()}
    assert shapes == {
        "decode": (16, 512),
        "interactive": (256, 64),
        "longdoc-16k": (16384, 32),
        "longdoc-32k": (32768, 32),
    }


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    mix = parse_mix("decode=1,interactive=3")
    one = synthesize(mix, 5.0, duration_s=100, seed=3)
    assert one == synthesize(mix, 5.0, duration_s=100, seed=3)
    assert one.requests != synthesize(mix, 5.0, duration_s=100, seed=4).requests


def test_poisson_rate_and_mix_proportions() -> None:
    trace = synthesize(parse_mix("decode=1,interactive=3"), 20.0, duration_s=500, seed=1)
    stats = trace_stats(trace)
    assert stats.mean_rate == pytest.approx(20.0, rel=0.05)
    assert stats.index_of_dispersion == pytest.approx(1.0, abs=0.2)
    share = np.mean([r.prompt_tokens == 256 for r in trace.requests])
    assert share == pytest.approx(0.75, abs=0.03)
    assert all(r.arrival_s < 500 for r in trace.requests)
    assert [r.id for r in trace.requests] == [str(i) for i in range(len(trace))]


def test_gamma_arrivals_are_burstier_than_poisson() -> None:
    mix = parse_mix("interactive")
    poisson = trace_stats(synthesize(mix, 10.0, duration_s=600, seed=2))
    bursty = trace_stats(synthesize(mix, 10.0, duration_s=600, arrivals="gamma", cv=3, seed=2))
    assert bursty.mean_rate == pytest.approx(10.0, rel=0.15)
    assert bursty.index_of_dispersion > 3 * poisson.index_of_dispersion


def test_uniform_count_and_bursts() -> None:
    trace = synthesize(
        parse_mix("decode"), 8.0, count=8, arrivals="uniform", bursts=[parse_burst("3200x1@0.5*2")]
    )
    assert len(trace) == 10
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals)
    assert arrivals[:5] == pytest.approx([0, 0.125, 0.25, 0.375, 0.5])
    long = [r for r in trace.requests if r.prompt_tokens == 3200]
    assert [r.arrival_s for r in long] == [0.5, 0.5]
    assert isinstance(trace, Trace) and trace.source.format == "synthetic"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("decode=0", "positive"),
        ("decode=x", "positive"),
        ("huge", "unknown"),
        ("0x5", "unknown"),
    ],
)
def test_bad_mixes(text: str, words: str) -> None:
    with pytest.raises(TunerError, match=words):
        parse_mix(text)


@pytest.mark.parametrize("text", ["decode", "decode@x", "nope@1", "decode@1*0"])
def test_bad_bursts(text: str) -> None:
    with pytest.raises(TunerError):
        parse_burst(text)


def test_rate_and_limits_are_checked() -> None:
    mix = parse_mix("decode")
    with pytest.raises(TunerError, match="rate"):
        synthesize(mix, 0.0, duration_s=10)
    with pytest.raises(TunerError, match="duration or a request count"):
        synthesize(mix, 1.0)
    with pytest.raises(TunerError, match="empty"):
        synthesize(mix, 0.001, duration_s=0.001, arrivals="gamma", seed=1, cv=0.5)
