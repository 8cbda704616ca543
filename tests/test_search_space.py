"""Search space: version awareness, overrides, validity by construction, rendering to flags
that vLLM's own parser accepts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefill_tuner.cli.assignments import parse_assignments, parse_value
from prefill_tuner.engines.real.resolver import VLLM_ARGS
from prefill_tuner.engines.sim import SimConfig
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.render import serve_args, serve_command, serve_yaml
from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import (
    EngineCapabilities,
    KnobRange,
    build_space,
    load_space_file,
    share_of_budget,
)
from tests.conftest import vllm_python

SIM = EngineCapabilities(engine="sim", version="test")


def test_default_space_drops_v0_knobs_with_a_reason() -> None:
    space = build_space(SIM)
    assert set(space.ranges) == {
        "max_num_batched_tokens",
        "max_num_seqs",
        "enable_chunked_prefill",
        "long_prefill_token_threshold",
        "scheduler_reserve_full_isl",
    }
    assert {d.knob for d in space.dropped} == {
        "max_num_partial_prefills",
        "max_long_partial_prefills",
    }
    assert all("V1" in d.reason for d in space.dropped)
    v0 = build_space(EngineCapabilities("vllm", "0.6.0", honours_v0_partial_prefill=True))
    assert "max_num_partial_prefills" in v0.ranges


def test_async_scheduling_is_searched_only_when_asked_and_where_it_can_run() -> None:
    """Measured (benchmarks/async_scheduling.py): it trades a step of TTFT for the host's
    share of TPOT, so it is a choice the user asks for, not part of the default search."""
    assert "async_scheduling" not in build_space(SIM).ranges
    asked = build_space(SIM, {"async_scheduling": "true,false"})
    assert asked.ranges["async_scheduling"].choices == (True, False)
    cpu = EngineCapabilities("vllm", "0.32.0", honours_async_scheduling=False)
    assert "async_scheduling" in {d.knob for d in build_space(cpu).dropped}
    for bad in (
        {"overrides": {"async_scheduling": "true,false"}},
        {"fixed": {"async_scheduling": True}},
    ):
        with pytest.raises(TunerError, match=r"async_scheduling: cannot be tuned or set here.*CPU"):
            build_space(cpu, **bad)


def test_flags_a_version_does_not_accept_are_never_searched_or_emitted() -> None:
    old = EngineCapabilities(
        "vllm",
        "0.9.0",
        accepted_flags=frozenset(
            {
                "--max-num-batched-tokens",
                "--max-num-seqs",
                "--enable-chunked-prefill",
                "--no-enable-chunked-prefill",
                "--long-prefill-token-threshold",
            }
        ),
    )
    space = build_space(old)
    assert "scheduler_reserve_full_isl" not in space.ranges
    assert any(
        d.knob == "scheduler_reserve_full_isl" and "does not accept" in d.reason
        for d in space.dropped
    )
    args = serve_args({"max_num_seqs": 8, "scheduler_reserve_full_isl": False}, old)
    assert args == ["--max-num-seqs", "8"]
    with pytest.raises(TunerError, match="cannot be tuned"):
        build_space(old, {"scheduler_reserve_full_isl": "true,false"})


def test_overrides_fixed_values_and_files(tmp_path: Path) -> None:
    space = build_space(
        SIM,
        {
            "max_num_batched_tokens": "512..4096",
            "long_prefill_token_threshold": "256..1024",
            "enable_chunked_prefill": "true",
        },
        {"max_num_seqs": 64, "max_model_len": 8192},
    )
    distributions = space.distributions()
    assert (
        distributions["max_num_batched_tokens"].low,
        distributions["max_num_batched_tokens"].high,
    ) == (512, 4096)
    assert (
        distributions["long_prefill_token_threshold_log2"].low,
        distributions["long_prefill_token_threshold_log2"].high,
    ) == (8, 10)  # no "off"
    # As a share of the budget: halved 1..4 times (4096 / 2**4 = 256, the range's lowest),
    # clipped to 256..1024; no "off" is asked for.
    shares = share_of_budget(space).distributions()
    assert (
        shares["long_prefill_token_threshold_halvings"].low,
        shares["long_prefill_token_threshold_halvings"].high,
    ) == (1, 4)
    threshold = share_of_budget(space).ranges["long_prefill_token_threshold"]
    assert [threshold.value(k, 4096) for k in (1, 2, 3, 4)] == [1024, 1024, 512, 256]
    assert [threshold.value(k, 512) for k in (1, 2, 3, 4)] == [256, 256, 256, 256]
    assert distributions["enable_chunked_prefill"].choices == (True,)
    assert "max_num_seqs" not in space.ranges and space.fixed["max_num_seqs"] == 64
    path = tmp_path / "space.yaml"
    path.write_text(
        "max_num_batched_tokens: 256..2048\nmax_num_seqs: [16, 128]\n"
        "scheduler_reserve_full_isl: [true]\n"
    )
    assert load_space_file(path) == {
        "max_num_batched_tokens": "256..2048",
        "max_num_seqs": "16..128",
        "scheduler_reserve_full_isl": "true",
    }
    for bad, words in [
        ({"max_num_seqs": "64..8"}, "LOW"),
        ({"max_num_seqs": "x"}, "LOW..HIGH"),
        ({"warp_speed": "1..2"}, "unknown knob"),
        ({"enable_chunked_prefill": "maybe"}, "true or false"),
    ]:
        with pytest.raises(TunerError, match=words):
            build_space(SIM, bad)
    assert parse_assignments(["max-model-len=4096"], "--set") == {"max_model_len": "4096"}
    assert [parse_value(v) for v in ("4096", "0.1", "off", "x")] == [4096, 0.1, False, "x"]
    with pytest.raises(TunerError, match="NAME=VALUE"):
        parse_assignments(["oops"], "--set")


@settings(max_examples=200)
@given(st.integers(0, 2**31), st.sampled_from([2048, 8192, 32768, 131072]))
def test_every_point_of_the_space_is_a_config_vllm_accepts(seed: int, max_model_len: int) -> None:
    """Sample the default space at random: after the repair, vLLM's rules always hold."""
    space = build_space(SIM)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    trial = study.ask()
    sampled = space.suggest(trial)
    settings_, _ = effective_settings(sampled, {}, max_model_len)
    SimConfig(**settings_, max_model_len=max_model_len)  # raises if vLLM would refuse it
    assert space.settings_from_params(trial.params) == sampled


def test_as_a_share_of_the_budget_the_threshold_is_never_at_or_above_it() -> None:
    space = share_of_budget(build_space(SIM))
    knob = space.ranges["long_prefill_token_threshold"]
    assert knob.param == "long_prefill_token_threshold_halvings"
    distribution = space.distributions()[knob.param]
    assert (distribution.low, distribution.high) == (0, 8)  # off, then 16384 / 2**8 = 64
    assert knob.value(0, 906) == 0
    assert [knob.value(k, 906) for k in (1, 2, 3, 4, 8)] == [453, 226, 113, 64, 64]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(300):
        sampled = space.suggest(study.ask())
        threshold, budget = (
            sampled["long_prefill_token_threshold"],
            sampled["max_num_batched_tokens"],
        )
        assert threshold == 0 or 64 <= threshold < budget
    # The engine's defaults (threshold off) lie inside; a point maps back to its parameters.
    defaults = {
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 1024,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "scheduler_reserve_full_isl": True,
    }
    assert space.outside(defaults) == {}
    assert space.params_for(defaults)[knob.param] == 0
    capped = {**defaults, "long_prefill_token_threshold": 1024}
    assert space.params_for(capped)[knob.param] == 3
    assert space.settings_from_params(space.params_for(capped)) == capped
    # A threshold at or above the budget is off, wherever it comes from.
    assert space.params_for({**defaults, "long_prefill_token_threshold": 8192})[knob.param] == 0
    # A fixed budget is the reference too; without a known budget the space is unchanged.
    fixed = share_of_budget(build_space(SIM, fixed={"max_num_batched_tokens": 2048}))
    assert fixed.ranges["long_prefill_token_threshold"].halvings == 5
    old = EngineCapabilities("vllm", "0.9.0", accepted_flags=frozenset({"--max-num-seqs",
                             "--long-prefill-token-threshold"}))  # fmt: skip
    unknown = build_space(old)
    assert "max_num_batched_tokens" not in unknown.ranges
    assert share_of_budget(unknown) == unknown
    assert fixed.settings_from_params({knob.param: 1}) == {"long_prefill_token_threshold": 1024}


def test_by_default_the_threshold_is_an_absolute_power_of_two() -> None:
    """Measured (benchmarks/RESULTS.md, issue 29): the tuner's TPE finds the best settings
    sooner with the cap in tokens than as a share of the budget."""
    assert build_space(SIM).ranges["long_prefill_token_threshold"].halvings == 0
    knob = KnobRange(KNOBS["long_prefill_token_threshold"], 64, 8192)
    assert knob.param == "long_prefill_token_threshold_log2"
    assert knob.value(5) == 0 and knob.value(6) == 64 and knob.value(13) == 8192
    assert knob.param_for(0) == 5


def test_the_kv_watermark_is_searched_as_a_share_off_or_doubling_when_asked() -> None:
    """vLLM's ``--watermark`` is a float share of the KV pool: searched as off or a share each
    twice the last (thousandths, on a log scale), only when ``--space`` names it."""
    assert "watermark" not in build_space(SIM).ranges
    space = build_space(SIM, {"watermark": "0..0.05"})
    knob = space.ranges["watermark"]
    assert knob.param == "watermark_permille_log2"
    distribution = space.distributions()[knob.param]
    assert (distribution.low, distribution.high) == (-1, 5)
    values = [knob.value(e) for e in range(distribution.low, distribution.high + 1)]
    assert values == [0.0, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032]
    assert all(knob.contains(v) for v in values) and not knob.contains(0.2)
    assert knob.param_for(0.0) == -1 and knob.param_for(0.016) == 4
    assert space.settings_from_params({knob.param: 3}) == {"watermark": 0.008}
    assert serve_args({"watermark": 0.008}) == ["--watermark", "0.008"]
    assert "watermark: 0 (off) or 0.001..0.05, each twice the last" in space.describe()
    assert not build_space(SIM, {"watermark": "0.01..0.1"}).ranges["watermark"].allow_off
    SimConfig(watermark=knob.value(distribution.high))  # every point is a valid setting
    for bad, words in [
        ("0..1", "< 1"),
        ("nan..0.1", "0 ≤ LOW"),
        ("-0.1..0.1", "0 ≤ LOW"),
        ("0..inf", "0 ≤ LOW"),
        ("0..0.0001", "at least 0.001"),
        ("a..b", "LOW..HIGH"),
    ]:
        with pytest.raises(TunerError, match=words):
            build_space(SIM, {"watermark": bad})


def test_a_threshold_at_or_above_the_budget_is_off_in_every_trial() -> None:
    """vLLM cuts a chunk to the threshold, then to the budget left (never more than the
    budget): at or above the budget the threshold caps nothing, so the one form is off."""
    for threshold in (906, 8192):
        settings_, notes = effective_settings(
            {"max_num_batched_tokens": 906, "long_prefill_token_threshold": threshold}, {}, 32768
        )
        assert settings_["long_prefill_token_threshold"] == 0
        assert "caps nothing" in notes[-1]
    below, notes = effective_settings(
        {"max_num_batched_tokens": 906, "long_prefill_token_threshold": 905}, {}, 32768
    )
    assert below["long_prefill_token_threshold"] == 905 and notes == []
    # Chunked prefill off raises the budget to the context length: the threshold below it
    # still cuts (vLLM 0.32 splits a prompt into threshold-sized chunks even then).
    off, _ = effective_settings(
        {
            "max_num_batched_tokens": 512,
            "enable_chunked_prefill": False,
            "long_prefill_token_threshold": 4096,
        },
        {},
        8192,
    )
    assert off["max_num_batched_tokens"] == 8192 and off["long_prefill_token_threshold"] == 4096
    # A fixed threshold at or above the budget is off too.
    fixed, _ = effective_settings(
        {"max_num_batched_tokens": 1024}, {"long_prefill_token_threshold": 2048}, 8192
    )
    assert fixed["long_prefill_token_threshold"] == 0
    assert "--long-prefill-token-threshold 0" in serve_command("m", fixed)


def test_repairs_are_reported() -> None:
    settings_, notes = effective_settings(
        {
            "max_num_batched_tokens": 512,
            "max_num_seqs": 1024,
            "enable_chunked_prefill": False,
            "long_prefill_token_threshold": 65536,
        },
        {},
        32768,
    )
    assert settings_["max_num_batched_tokens"] == 32768
    assert settings_["max_num_seqs"] == 1024
    assert settings_["long_prefill_token_threshold"] == 0  # lowered to 32768: the budget
    assert len(notes) == 3
    settings_, notes = effective_settings(
        {"max_num_batched_tokens": 256, "max_num_seqs": 512}, {}, 4096
    )
    assert settings_["max_num_seqs"] == 256 and "lowered" in notes[0]


def test_serve_command_and_yaml() -> None:
    config = {
        "max_num_batched_tokens": 512,
        "enable_chunked_prefill": False,
        "scheduler_reserve_full_isl": True,
        "num_gpu_blocks": 100,
    }
    assert serve_command("org/model", config) == (
        "vllm serve org/model --max-num-batched-tokens 512 --no-enable-chunked-prefill "
        "--scheduler-reserve-full-isl --num-gpu-blocks-override 100"
    )
    assert "no-enable-chunked-prefill: true" in serve_yaml(config)
    assert set(KNOBS) >= {"max_num_seqs"}


def _vllm_parse(*args: str) -> dict[str, object]:
    completed = subprocess.run(
        [str(vllm_python()), VLLM_ARGS, "parse", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.real_engine
def test_exports_parse_with_vllms_own_serve_parser(tmp_path: Path) -> None:
    """The YAML and the flags mean to vLLM exactly what we meant (vLLM 0.32 ignores
    ``enable-chunked-prefill: false`` in a config file, so we must not write that)."""
    settings_ = {
        "max_num_batched_tokens": 724,
        "max_num_seqs": 11,
        "enable_chunked_prefill": False,
        "long_prefill_token_threshold": 256,
        "scheduler_reserve_full_isl": False,
        "max_model_len": 32768,
    }
    config = tmp_path / "serve.yaml"
    config.write_text(serve_yaml(settings_, "org/model"))
    from_yaml = _vllm_parse("--config", str(config))
    from_flags = _vllm_parse("org/model", *serve_args(settings_))
    for parsed in (from_yaml, from_flags):
        assert {key: parsed[key] for key in settings_} == settings_
    flags = json.loads(
        subprocess.run(
            [str(vllm_python()), VLLM_ARGS, "flags"],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert "--max-num-partial-prefills" not in flags  # removed (docs/vllm-facts.md)
    assert {knob.flag for knob in KNOBS.values() if not knob.v0_only} <= set(flags)
