"""Real trials that restart the server only when they must (issue 45): the knobs vLLM reads
every step reach a running server through ``tuner/engines/real/live_scheduler.py`` (vLLM's
scheduler, given ``--scheduler-cls``); a start-up knob starts a new server."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import pytest

from prefill_tuner.engines.real.cpu_recipe import write_tiny_model
from prefill_tuner.engines.real.engine import VllmEngine
from prefill_tuner.engines.real.live import LIVE_KNOBS, live_knobs, live_values
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import vllm_python
from tests.test_real_engine_study import KV_BYTES, SERVER_ARGS, processes_using

SCHEDULER = Path(__file__).parents[1] / "tuner" / "engines" / "real" / "live_scheduler.py"


def test_the_live_scheduler_sets_exactly_the_knobs_declared_to_need_no_restart() -> None:
    """Declared once (``Searched.restart``); the scheduler's setters must match that list,
    read from its source (it imports vLLM, which is not installed beside the tuner)."""
    tree = ast.parse(SCHEDULER.read_text())
    setters = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "SETTERS"
    )
    assert isinstance(setters, ast.Dict)
    names = [key.value for key in setters.keys if isinstance(key, ast.Constant)]
    assert sorted(names) == sorted(LIVE_KNOBS)
    assert {"max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill"}.isdisjoint(
        LIVE_KNOBS
    )
    # Only where the server accepts --scheduler-cls and the knob's own flag.
    flags = frozenset({"--scheduler-cls", KNOBS["watermark"].flag})
    assert live_knobs(flags) == ("watermark",)
    assert live_knobs(frozenset({KNOBS["watermark"].flag})) == ()
    # A knob a trial leaves unset goes back to vLLM's default on a kept server.
    assert live_values({}, ("watermark", "max_num_active_seqs")) == {
        "watermark": 0.0,
        "max_num_active_seqs": None,
    }


def test_a_killed_runs_settings_folder_is_removed_by_the_next_one(tmp_path: Path) -> None:
    """SIGKILL leaves no server (the kernel stops it) but the settings folder: the next run
    removes those whose process is gone, and nobody else's."""
    import subprocess
    import sys
    import tempfile

    from prefill_tuner.engines.real.live import FOLDER_PREFIX, LiveSettings

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    root = Path(tempfile.gettempdir())
    orphan = root / f"{FOLDER_PREFIX}{gone.stdout.strip()}-test"
    alive = root / f"{FOLDER_PREFIX}1-test"  # pid 1 always runs
    for folder in (orphan, alive):
        folder.mkdir(exist_ok=True)
    live = LiveSettings()
    try:
        assert not orphan.exists() and alive.exists()
        assert (live.folder / "prefill_tuner_live.py").is_file()
    finally:
        live.close()
        alive.rmdir()
    assert not live.folder.exists()


@pytest.mark.real_engine
def test_a_server_is_kept_while_only_per_step_knobs_change(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "tiny-llama"
    write_tiny_model(model)
    trace = Trace(tuple(Request(f"r{i}", 0.01 * i, 48 + 8 * i, 16) for i in range(12)))
    engine = VllmEngine(
        str(model),
        python=str(vllm_python()),
        server_args=[*SERVER_ARGS.split(), *KV_BYTES.split()],
        env={"HF_HUB_OFFLINE": "1"},
        log_dir=tmp_path / "logs",
        reuse_servers=True,
    )
    with contextlib.closing(engine):
        base = {**engine.default_settings(), "max_model_len": 2048}
        first = engine.run(trace, base, label="first")
        one_at_a_time = {**base, "max_num_active_seqs": 1, "long_prefill_token_threshold": 32}
        kept = engine.run(trace, one_at_a_time, label="kept")
        again = engine.run(trace, base, label="again")
        shedding = {**base, "max_num_queued_reqs": 2}  # a start-up knob (the API server's)
        fresh = engine.run(trace, shedding, label="fresh")
    for run in (first, kept, again):
        assert run.failure is None and run.metrics is not None, run.failure
        assert run.metrics.completed == len(trace.requests)
        assert not run.details["config_mismatches"], run.details["config_mismatches"]
        # Its part of the log holds all its steps, a kept server's too (read while it runs).
        steps = run.details["server_steps"]
        assert steps["decode_tokens"] + len(trace.requests) == 16 * len(trace.requests), steps
    servers = [run.details["server"] for run in (first, kept, again, fresh)]
    assert [server["reused"] for server in servers] == [False, True, True, False]
    assert kept.startup_s == 0.0 < first.startup_s  # type: ignore[operator]
    assert servers[1]["live"]["max_num_active_seqs"] == 1
    assert servers[1]["live"]["long_prefill_token_threshold"] == 32
    assert servers[2]["live"]["max_num_active_seqs"] is None  # back to vLLM's default

    # The scheduler ran the kept server's replay one request at a time, the others not; each
    # trial's step log is its own part of the server's log.
    def most_in_a_step(run) -> int:  # type: ignore[no-untyped-def]
        lines = run.details["server_steps"]["trace"]
        import json

        steps = [json.loads(line) for line in Path(lines).read_text().splitlines()]
        assert steps, lines
        return max(s["prefill_requests"] + s["decode_requests"] for s in steps)

    assert most_in_a_step(kept) == 1 < most_in_a_step(first)
    assert most_in_a_step(again) > 1
    # The queue limit is the API server's: HTTP 503 beyond two unfinished requests.
    assert fresh.metrics is not None and fresh.metrics.failed > 0
    assert all(reason.startswith("HTTP 503") for reason in fresh.metrics.failure_reasons), (
        fresh.metrics.failure_reasons
    )
    assert processes_using(model) == []  # closing the engine stopped the kept server
