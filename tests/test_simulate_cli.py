"""``tune simulate``: vLLM-named flags, summary, per-step JSON lines, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import AZURE, MOONCAKE


def test_simulate_prints_a_summary(tune) -> None:
    code, out, err = tune("simulate", "--trace", str(AZURE), "--max-requests", "300")
    assert code == 0, err
    for text in (
        "300 completed, 0 failed",
        "TTFT",
        "TPOT",
        "ITL",
        "E2E",
        "p99",
        "peak KV",
        "preemptions",
        "llama-3.1-8b-h100",
    ):
        assert text in out, text


def test_steps_out_and_json(tune, tmp_path: Path) -> None:
    steps_file = tmp_path / "steps.jsonl"
    code, out, err = tune(
        "simulate",
        "--trace",
        str(MOONCAKE),
        "--rate-scale",
        "0.1",
        "--max-requests",
        "40",
        "--max-model-len",
        "32768",
        "--over-length",
        "clip",
        "--max-num-batched-tokens",
        "2048",
        "--max-num-seqs",
        "64",
        "--long-prefill-token-threshold",
        "512",
        "--no-scheduler-reserve-full-isl",
        "--steps-out",
        str(steps_file),
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["config"]["max_num_batched_tokens"] == 2048
    assert summary["config"]["scheduler_reserve_full_isl"] is False
    assert summary["metrics"]["completed"] == 40
    steps = [json.loads(line) for line in steps_file.read_text().splitlines()]
    assert len(steps) == summary["steps"]
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert all(sum(s["scheduled"].values()) <= 2048 for s in steps)
    first = steps[0]
    assert set(first) == {
        "step",
        "start_s",
        "duration_s",
        "scheduled",
        "admitted_cached_tokens",
        "prefill_tokens",
        "decode_tokens",
        "preempted",
        "finished",
        "running_after",
        "waiting_after",
        "kv_blocks_in_use",
    }
    assert first["scheduled"] == {"0": 512, "1": 512, "2": 512, "3": 512}  # ids from the trace
    assert sum(1 for s in steps for _ in s["finished"]) == 40


def test_kv_memory_bytes_derives_blocks(tune) -> None:
    # 1 GiB of KV at 131,072 B/token and 16-token blocks: 512 blocks (511 usable: 8,176
    # tokens, so max_model_len may be at most that, or vLLM would refuse to start).
    code, out, _ = tune(
        "simulate",
        "--trace",
        str(AZURE),
        "--max-requests",
        "20",
        "--kv-cache-memory-bytes",
        str(2**30),
        "--max-model-len",
        "8176",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["config"]["num_gpu_blocks"] == 512


def test_bad_engine_flags_are_one_line_errors(tune, tmp_path: Path) -> None:
    cases = [
        (("--max-num-batched-tokens", "64", "--max-num-seqs", "128"), "max_num_seqs"),
        (("--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048"), "chunked"),
        (("--profile", "nope"), "no shipped profile"),
        (("--num-gpu-blocks", "100", "--kv-cache-memory-bytes", "1000"), "not both"),
        (
            ("--num-gpu-blocks", "256", "--block-size", "16", "--max-model-len", "4096"),
            "vLLM refuses to start",
        ),
        (("--over-length", "squash"), "--over-length"),
        (("--steps-out", str(tmp_path / "no" / "dir.jsonl")), "does not exist"),
    ]
    for args, words in cases:
        code, _, err = tune("simulate", "--trace", str(AZURE), "--max-requests", "5", *args)
        assert code == 2, args
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert list(tmp_path.iterdir()) == []


def test_requests_over_max_model_len_fail_unless_clipped(tune) -> None:
    code, out, _ = tune(
        "simulate",
        "--trace",
        str(MOONCAKE),
        "--max-requests",
        "30",
        "--rate-scale",
        "0.1",
        "--max-model-len",
        "8192",
        "--json",
    )
    assert code == 0
    metrics = json.loads(out)["metrics"]
    assert metrics["failed"] > 0
    assert any("max_model_len" in reason for reason in metrics["failure_reasons"])
