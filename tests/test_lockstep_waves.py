"""Lockstep waves (issue 42): a closed loop of identical requests that the simulator runs in
waves is said to, beside its TTFT, and nothing else is."""

from __future__ import annotations

import json
from pathlib import Path

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.engines.sim.replicas import simulate_replicas
from prefill_tuner.engines.sim.waves import LOCKSTEP_GROUP, lockstep
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.trace.model import Request, Trace

H100 = load_profile("llama-3.1-8b-h100")
CONFIG = SimConfig(max_num_batched_tokens=8192, max_num_seqs=256, async_scheduling=False)


def fixed(count: int, prompt: int = 1024, output: int = 64) -> Trace:
    """``count`` identical requests all ready at the start, as ``vllm bench serve`` sends a
    fixed-length benchmark."""
    return Trace(tuple(Request(f"r{i}", 0.0, prompt, output) for i in range(count)))


def test_a_closed_loop_of_identical_requests_runs_in_waves_and_says_so() -> None:
    trace = fixed(64)
    result = simulate(trace, CONFIG, H100, max_concurrency=8)
    waves = lockstep(trace, 8, result.admitted_together)
    assert waves is not None and waves.concurrency == 8
    assert waves.together == 8.0  # eight 1,024-token prompts fit the budget: whole waves
    assert result.admitted_together == (8,) * 8  # the first wave, then seven resent alike
    assert "admitted 8.0 at a time in this closed loop of 8" in waves.line()
    assert result.summary(trace)["lockstep_waves"] == waves.line()


def test_the_admissions_are_counted_per_step_as_the_steps_show() -> None:
    trace = fixed(40, prompt=3000)
    steps: list[int] = []
    result = simulate(
        trace,
        CONFIG,
        H100,
        max_concurrency=8,
        on_step=lambda step: steps.append(len(step.admitted_cached_tokens)),
    )
    assert result.admitted_together == tuple(count for count in steps if count)
    assert sum(result.admitted_together) == len(trace)


def test_waves_a_budget_breaks_up_are_not_flagged() -> None:
    trace = fixed(64, prompt=4096)  # two prompts a step at most: admissions stay small
    result = simulate(trace, CONFIG, H100, max_concurrency=8)
    later = result.admitted_together[1:]
    assert max(later) < LOCKSTEP_GROUP
    assert lockstep(trace, 8, result.admitted_together) is None
    assert result.summary(trace)["lockstep_waves"] is None


def test_varied_lengths_an_open_loop_or_one_wave_are_not_flagged() -> None:
    varied = Trace(
        tuple(Request(f"r{i}", 0.0, 1024 + (i % 3), 64) for i in range(64))
    )  # three prompt lengths: not a fixed-length benchmark, whatever the grouping
    result = simulate(varied, CONFIG, H100, max_concurrency=8)
    assert max(result.admitted_together) >= LOCKSTEP_GROUP
    assert lockstep(varied, 8, result.admitted_together) is None
    trace = fixed(64)
    open_loop = simulate(trace, CONFIG, H100)  # one burst, never resent
    assert lockstep(trace, None, open_loop.admitted_together) is None
    one_wave = fixed(12)  # not two whole waves: nothing was resent in step
    once = simulate(one_wave, CONFIG, H100, max_concurrency=8)
    assert lockstep(one_wave, 8, once.admitted_together) is None


def test_replicas_count_every_replicas_admissions() -> None:
    trace = fixed(64)
    two = simulate_replicas(
        trace, CONFIG, H100, replicas=2, router="round-robin", max_concurrency=8
    ).result
    assert sum(two.admitted_together) == len(trace)
    alone = simulate(trace, CONFIG, H100, max_concurrency=8)
    one = simulate_replicas(
        trace, CONFIG, H100, replicas=1, router="round-robin", max_concurrency=8
    ).result
    assert one.admitted_together == alone.admitted_together


def test_tune_simulate_prints_the_caveat_beside_ttft(tune, tmp_path: Path) -> None:
    path = tmp_path / "fixed.jsonl"
    line = json.dumps({"timestamp": 0.0, "input_length": 1024, "output_length": 64})
    path.write_text((line + "\n") * 48)
    code, out, err = tune("simulate", "--trace", str(path), "--max-concurrency", "8")
    assert code == 0, err
    assert "TTFT caveat" in out and "lockstep" in out
    assert out.index("TTFT caveat") > out.index("TTFT ")
    code, out, err = tune("simulate", "--trace", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["lockstep_waves"] is None  # open loop
    code, out, err = tune("simulate", "--trace", str(path), "--max-concurrency", "8", "--json")
    assert code == 0, err
    assert "lockstep waves" in json.loads(out)["lockstep_waves"]


def test_tune_run_says_when_its_recommendation_ran_in_waves(tune, tmp_path: Path) -> None:
    def study(name: str, lengths: list[int]) -> str:
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(
                json.dumps({"timestamp": 0.0, "input_length": n, "output_length": 16}) + "\n"
                for n in lengths
            )
        )
        code, out, err = tune(
            "run", "--trace", str(path), "--max-concurrency", "4", "--slo", "p99_tpot=50ms",
            "--trials", "3", "--storage", f"sqlite:///{tmp_path / name}.db", "--no-report",
        )  # fmt: skip
        assert code == 0, err
        assert "TTFT caveat" not in out  # the answer on stdout stays as it was
        return err

    err = study("fixed", [32] * 40)  # four 32-token prompts fit every budget: whole waves
    assert "TTFT caveat (trial " in err and "admitted 4.0 at a time" in err
    store = TunerStore(f"sqlite:///{tmp_path / 'fixed'}.db")
    record = store.get_study("fixed-latency")
    assert record is not None
    trials = store.trials(record)
    assert len(trials) == 3
    assert all((t.metrics or {})["details"]["lockstep_waves"] == 4.0 for t in trials)
    varied = study("varied", [32 + i % 5 for i in range(40)])
    assert "TTFT caveat" not in varied
