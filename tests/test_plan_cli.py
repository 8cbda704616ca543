"""``tune plan`` end to end on a bursty synthetic trace: the fewest replicas that meet the
SLOs, checked by simulating the answer's settings on N and on N−1 replicas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.trial_engine import ReplicatedSimEngine
from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.evaluation import verdict_of
from prefill_tuner.trace import load_trace

SLOS = ("p99_ttft=1s", "p99_tpot=40ms")


@pytest.fixture
def bursty(tune, tmp_path: Path) -> Path:
    """Gamma arrivals (CV 3) of chats, streaming decodes and 16k-token documents."""
    path = tmp_path / "bursty.jsonl"
    code, _, err = tune(
        "trace", "synth", str(path), "--mix", "interactive=0.7,decode=0.2,longdoc-16k=0.1",
        "--rate", "6", "--duration", "40", "--arrivals", "gamma", "--cv", "3", "--seed", "5",
    )  # fmt: skip
    assert code == 0, err
    return path


def plan_args(trace: Path, storage: str, *extra: str) -> list[str]:
    args = ["plan", "--trace", str(trace), "--trials", "6", "--storage", storage]
    for slo in SLOS:
        args += ["--slo", slo]
    return [*args, *extra]


@pytest.mark.slow
def test_plan_finds_the_fewest_replicas_and_one_less_fails(tune, bursty: Path, tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'plan.db'}"
    code, out, err = tune(*plan_args(bursty, storage, "--json"))
    assert code == 0, err
    plan = json.loads(out)
    replicas = plan["replicas"]
    assert replicas >= 2, plan["counts"]  # the trace needs more than one: N−1 is checked
    counts = {c["replicas"]: c for c in plan["counts"]}
    assert counts[replicas]["met"] and all(not c["met"] for n, c in counts.items() if n < replicas)
    # N−1 was searched and none of its trials met the SLOs (on this trace; below the floors'
    # count it would be proven instead)
    assert plan["fewest_possible"] < replicas
    assert counts[replicas - 1]["trials"] == 6 and counts[replicas - 1]["closest"] is not None
    # fewer than the floors' count are not searched: they cannot meet the SLOs
    assert min(counts) == plan["fewest_possible"] and plan["floors_below"]
    assert len(plan["utilisation"]) == replicas
    assert sum(plan["requests_per_replica"]) == len(load_trace(str(bursty)).requests)
    settings = plan["answer"]["recommended"]["settings"]
    # Independently: the answer's settings meet the SLOs on N replicas and miss on N−1.
    trace = load_trace(str(bursty))
    slos = parse_slos(list(SLOS))
    profile = load_profile("llama-3.1-8b-h100")
    for count, meets in ((replicas, True), (replicas - 1, False)):
        engine = ReplicatedSimEngine(profile, replicas=count, router="least-outstanding")
        verdict = verdict_of(engine.run(trace, settings), slos, 0.0)
        assert verdict.feasible is meets, (count, verdict.constraints)
    # Every study is stored with its replica count in the engine's version.
    store = TunerStore(storage)
    study = plan["answer"]["study"]["name"]
    assert study == f"bursty-plan-least-outstanding-{replicas}x"
    record = store.get_study(study)
    assert record is not None
    trials = store.trials(record)
    assert len(trials) == 6
    assert f"{replicas} replicas behind a least-outstanding router" in (
        trials[0].engine_version.version
    )
    # Every count's study is done (a count met while searching needed no more trials), and
    # no worker can take one (its plan, N replicas behind a router, is tune plan's alone).
    code, out, err = tune("studies", "--storage", storage, "--json")
    assert code == 0, err
    assert {s["status"] for s in json.loads(out)["studies"]} == {"done"}
    code, _, err = tune("worker", "--study", study, "--storage", storage)
    assert code == 2 and "it runs in tune plan only" in err
    # Diagnosis and the report show a replica's run (the busiest), not one engine's.
    code, out, err = tune("diagnose", "--study", study, "--storage", storage)
    assert code == 0, err
    assert f"of {replicas} behind a least-outstanding router (the busiest:" in out
    page = tmp_path / "plan.html"
    code, _, err = tune("report", "--study", study, "--storage", storage, "-o", str(page))
    assert code == 0, err
    assert f"of {replicas} behind a least-outstanding router" in page.read_text()
    # The same command again resumes: nothing new runs, the same answer.
    code, out, err = tune(*plan_args(bursty, storage))
    assert code == 0, err
    assert out.startswith(f"{replicas} replicas behind a least-outstanding router meet every SLO")
    assert f"{replicas - 1} replica" in out and "none of 6 settings met the SLOs" in out
    assert "each replica: vllm serve " in out
    assert len(store.trials(store.get_study(study))) == 6


def test_plan_says_when_no_count_is_enough(tune, bursty: Path, tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'plan.db'}"
    # One replica: its bursts alone keep p99 TTFT over 1 s (a floor; nothing is searched).
    code, out, err = tune(*plan_args(bursty, storage, "--max-replicas", "1", "--json"))
    assert code == 4, err
    plan = json.loads(out)
    assert plan["replicas"] is None and plan["counts"] == [] and plan["fewest_possible"] == 2
    assert plan["floors_below"][0].startswith("p99_ttft ")
    assert "the trace's bursts" in plan["floors_below"][0]
    code, out, err = tune(*plan_args(bursty, storage, "--max-replicas", "1"))
    assert code == 4 and out.startswith("no count up to 1 replica can meet these SLOs")
    # Two: possible in principle, and none of the trials met them.
    code, out, err = tune(*plan_args(bursty, storage, "--max-replicas", "2"))
    assert code == 4, err
    assert out.startswith("no count up to 2 replicas behind a least-outstanding router met")
    assert "none of 6 settings met the SLOs (closest: trial" in out
    # An SLO below what a request alone on a replica gets: no count at all.
    code, out, err = tune("plan", "--trace", str(bursty), "--storage", storage,
                          "--slo", "p99_ttft=5ms", "--study", "hopeless")  # fmt: skip
    assert code == 4
    assert out.startswith("no count up to 16 replicas can meet these SLOs") and "limit 5ms" in out
    assert "each prompt's uncached tokens prefilled in one step" in out
    assert TunerStore(storage).get_study("hopeless-16x") is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--router", "random"], "--router 'random': expected one of round-robin"),
        (["--max-replicas", "0"], "--max-replicas"),
        (["--max-replicas", "nan"], "--max-replicas"),
        (["--trials", "-1"], "--trials"),
    ],
)
def test_plan_refuses_bad_options(tune, bursty: Path, tmp_path, args, message) -> None:
    code, _, err = tune(*plan_args(bursty, f"sqlite:///{tmp_path / 'p.db'}", *args))
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_count_below_can_be_ruled_out_by_the_floors(tune, tmp_path: Path) -> None:
    """50 prompts of 4,000 tokens at one instant: their prefill work alone keeps p99 TTFT over
    1.3 s on 3 replicas whatever the settings, and 4 meet it: only 4 is searched."""
    trace = tmp_path / "burst.jsonl"
    line = json.dumps({"timestamp": 5000, "input_length": 4000, "output_length": 10})
    trace.write_text((line + "\n") * 50)
    storage = f"sqlite:///{tmp_path / 'plan.db'}"
    args = ["plan", "--trace", str(trace), "--slo", "p99_ttft=1.3s", "--trials", "6"]
    code, out, err = tune(*args, "--storage", storage, "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["replicas"] == plan["fewest_possible"] == 4
    assert [count["replicas"] for count in plan["counts"]] == [4]
    assert plan["floors_below"][0].startswith("p99_ttft 1.35s at best (the trace's bursts")
    code, out, err = tune(*args, "--storage", storage)
    assert code == 0, err
    assert "3 replicas cannot meet them, whatever the settings:" in out
