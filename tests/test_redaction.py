"""Secrets are hidden in one place (``prefill_tuner.redaction``), and whatever reaches the
storage goes through it; serve lines keep the user's own arguments, their secrets redacted."""

from __future__ import annotations

import shlex
from datetime import datetime, timezone
from pathlib import Path

import yaml

from prefill_tuner.redaction import (
    REDACTED,
    is_secret_env,
    is_secret_flag,
    redact,
    redact_args,
    redact_text,
    remember,
    secret_values,
)
from prefill_tuner.search_spaces.render import command_yaml, serve_command
from prefill_tuner.storage.store import TrialRow, TunerStore


def test_which_names_are_secrets() -> None:
    for flag in ("--api-key", "--hf-token", "--token", "api_key", "db_password", "--x-secret-id"):
        assert is_secret_flag(flag), flag
    for flag in (
        "--max-num-batched-tokens",
        "--long-prefill-token-threshold",
        "--tokenizer",
        "--skip-tokenizer-init",
        "--kv-cache-memory-bytes",
        "--ssl-keyfile",
        "max_num_seqs",
    ):
        assert not is_secret_flag(flag), flag
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_ACCESS_KEY_ID", "PGPASSWORD", "GH_AUTH"):
        assert is_secret_env(name), name
    for name in ("HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "VLLM_LOGGING_LEVEL"):
        assert not is_secret_env(name), name


def test_arguments_text_and_records_are_redacted() -> None:
    args = ["--dtype", "float32", "--api-key", "sk-a", "sk-b", "--hf-token=hf_x", "--hf-token"]
    assert redact_args(args) == [
        "--dtype",
        "float32",
        "--api-key",
        REDACTED,
        REDACTED,
        f"--hf-token={REDACTED}",
        "--hf-token",
    ]
    assert secret_values(args, {"HF_TOKEN": "tok-1", "HF_HUB_OFFLINE": "1"}) == [
        "sk-a",
        "sk-b",
        "hf_x",
        "tok-1",
    ]
    text = "vllm serve m --api-key 'sk 1' --max-num-batched-tokens 2048 HF_TOKEN=abc x"
    assert redact_text(text) == (
        f"vllm serve m --api-key {REDACTED} --max-num-batched-tokens 2048 HF_TOKEN={REDACTED} x"
    )
    assert redact_text("postgresql+psycopg://tuner:pw@db/tuning") == (
        "postgresql+psycopg://tuner:***@db/tuning"
    )
    remember(["canary-remembered-1"])
    assert redact_text("error: bad value 'canary-remembered-1'") == f"error: bad value '{REDACTED}'"
    record = {
        "serve_args": ["--api-key", "k-123456"],
        "model_config": {"hf_token": "hf_y", "max_model_len": 2048, "api_key": None},
        "env": {"HF_TOKEN": "z", "long_prefill_token_threshold": 64},
    }
    assert redact(record) == {
        "serve_args": ["--api-key", REDACTED],
        "model_config": {"hf_token": REDACTED, "max_model_len": 2048, "api_key": None},
        "env": {"HF_TOKEN": REDACTED, "long_prefill_token_threshold": 64},
    }
    # Idempotent: a redacted line stays as it is.
    line = serve_command("m", {}, None, redact_args(["--api-key", "sk-zz"]))
    assert redact_text(line) == line == f"vllm serve m --api-key '{REDACTED}'"


def test_the_store_never_writes_a_secret(tmp_path: Path) -> None:
    """Whatever path a value takes to the storage, the storage redacts it."""
    database = tmp_path / "t.db"
    store = TunerStore(f"sqlite:///{database}")
    remember(["sk-store-canary"])
    study = store.create_study(
        name="s",
        objective_mode="latency",
        slos=["p99_tpot=50ms"],
        error_budget=0.0,
        engine="vllm",
        model="m",
        trace_path="t.jsonl",
        trace_sha256="0" * 64,
        trace_format="jsonl",
        shaping={},
        space={"fixed": {"note": "--api-key sk-store-canary"}},
    )
    store.add_trial(
        study,
        "vllm",
        "v",
        TrialRow(
            trial_number=0,
            is_baseline=True,
            params={},
            settings={},
            repairs=[],
            serve_command="vllm serve m --api-key sk-store-canary",
            resolved_config={"serve_args": ["--hf-token", "hf-store-canary"]},
            trace_sha256="0" * 64,
            shaping={},
            metrics=None,
            objectives={},
            constraints={},
            slacks={},
            feasible=False,
            status="failed",
            failure_reason="vLLM rejected the settings: --api-key sk-store-canary",
            started_at=datetime.now(timezone.utc),
            wall_s=1.0,
        ),
    )
    store.engine.dispose()
    data = database.read_bytes()
    assert b"sk-store-canary" not in data and b"hf-store-canary" not in data
    (trial,) = TunerStore(f"sqlite:///{database}").trials(study)
    assert trial.serve_command == f"vllm serve m --api-key {REDACTED}"


def test_serve_lines_and_yaml_keep_the_users_own_arguments() -> None:
    given = "--dtype float32 --enforce-eager --kv-cache-memory-bytes 268435456 --api-key sk-1234"
    user = redact_args(shlex.split(given))
    settings = {"max_num_seqs": 64, "enable_chunked_prefill": False}
    line = serve_command("org/model", settings, None, user)
    assert line == (
        "vllm serve org/model --dtype float32 --enforce-eager --kv-cache-memory-bytes "
        f"268435456 --api-key '{REDACTED}' --max-num-seqs 64 --no-enable-chunked-prefill"
    )
    assert yaml.safe_load(command_yaml(line)) == {
        "model": "org/model",
        "dtype": "float32",
        "enforce-eager": True,
        "kv-cache-memory-bytes": 268435456,
        "api-key": REDACTED,
        "max-num-seqs": 64,
        "no-enable-chunked-prefill": True,
    }
