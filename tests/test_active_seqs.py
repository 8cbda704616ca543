"""vLLM 0.32's ``max_num_active_seqs`` (issue 45): the scheduler admits at most that many to
run, leaving ``max_num_seqs`` (the runner's slots) alone. Step for step against vLLM's own
scheduler in ``tests/test_sim_vs_vllm.py`` (a third of its random scenarios set it); here, what
it means for the simulator and for the settings a trial runs with."""

from __future__ import annotations

import pytest

from prefill_tuner.engines.sim import SimConfig, simulate
from prefill_tuner.engines.sim.cost_model import ConstantProfile
from prefill_tuner.search_spaces.render import serve_args
from prefill_tuner.search_spaces.rules import canonical, effective_settings, first_broken
from prefill_tuner.trace import Request, Trace

PROFILE = ConstantProfile(step_ms=10.0)
TRACE = Trace(tuple(Request(f"r{i}", 0.01 * i, 64, 16) for i in range(40)))


def run(**settings: object):  # type: ignore[no-untyped-def]
    config = SimConfig(max_num_batched_tokens=512, max_model_len=4096, **settings)  # type: ignore[arg-type]
    return simulate(TRACE, config, PROFILE)


def test_it_admits_as_a_lower_max_num_seqs_would() -> None:
    """The scheduler reads the two alike: an active limit of 4 under 64 slots runs the trace
    exactly as 4 slots do, and differently from 64 slots."""
    limited, slots, unlimited = (
        run(max_num_seqs=64, max_num_active_seqs=4),
        run(max_num_seqs=4),
        run(max_num_seqs=64),
    )
    assert limited.peak_running == slots.peak_running == 4 < unlimited.peak_running
    assert [r.token_times_s for r in limited.records] == [r.token_times_s for r in slots.records]
    assert limited.metrics.ttft_s["p99"] > unlimited.metrics.ttft_s["p99"]


def test_vllm_refuses_it_above_max_num_seqs_and_a_trial_repairs_it() -> None:
    assert first_broken({"max_num_seqs": 8, "max_num_active_seqs": 9, "max_model_len": 64}) == (
        "max_num_active_seqs (9) cannot be greater than max_num_seqs (8)"
    )
    with pytest.raises(ValueError, match="cannot be greater than max_num_seqs"):
        SimConfig(max_num_seqs=8, max_num_active_seqs=9)
    settings, notes = effective_settings(
        {"max_num_batched_tokens": 32, "max_num_seqs": 64}, {"max_num_active_seqs": 48}, 4096
    )
    # The budget lowers max_num_seqs to 32; the active limit follows, and at max_num_seqs it
    # limits nothing, so the trial carries it not at all.
    assert settings == {"max_num_batched_tokens": 32, "max_num_seqs": 32}
    assert any("lowered to max_num_seqs 32" in note for note in notes)
    assert any("limits nothing: left out" in note for note in notes)


def test_its_one_form_carries_it_only_where_it_limits() -> None:
    kept, _ = canonical({"max_num_seqs": 64, "max_num_active_seqs": 16})
    assert serve_args(kept) == ["--max-num-seqs", "64", "--max-num-active-seqs", "16"]
    dropped, notes = canonical({"max_num_seqs": 64, "max_num_active_seqs": 64})
    assert dropped == {"max_num_seqs": 64} and notes
    assert serve_args({"max_num_seqs": 64, "max_num_active_seqs": None}) == ["--max-num-seqs", "64"]


def test_zero_is_refused_in_one_line(tune) -> None:  # type: ignore[no-untyped-def]
    code, _, err = tune("simulate", "--trace", "sample", "--max-num-active-seqs", "0")
    assert code == 2 and "max_num_active_seqs" in err and "greater than or equal to 1" in err
    assert len(err.strip().splitlines()) == 1


def test_both_new_knobs_search_end_to_end_when_asked(tune, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--space`` names them: trials sample them (the engine's unset active limit reads as
    the loosest), the serve lines carry them, the table shows them."""
    code, out, err = tune(
        "run", "--slo", "p99_tpot=50ms", "--space", "max_num_active_seqs=8..256",
        "--space", "prefill_schedule_interval=1..8", "--trials", "6", "--study", "new-knobs",
        "--storage", f"sqlite:///{tmp_path / 'tune.db'}", "--no-report",
    )  # fmt: skip
    assert code == 0, err
    assert "act." in out and "cad." in out
    assert "--prefill-schedule-interval" in out
