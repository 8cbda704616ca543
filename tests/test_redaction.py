"""Secrets are hidden in one place (``prefill_tuner.redaction``), and whatever reaches the
storage goes through it; serve lines keep the user's own arguments, their secrets redacted."""

from __future__ import annotations

import json
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
            serve_command="vllm serve m --api-key sk-store-canary --kv-transfer-config "
            '\'{"kv_connector_extra_config": {"password": "json-store-canary"}}\'',
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
    for canary in (b"sk-store-canary", b"hf-store-canary", b"json-store-canary"):
        assert canary not in data
    (trial,) = TunerStore(f"sqlite:///{database}").trials(study)
    assert trial.serve_command == (
        f"vllm serve m --api-key {REDACTED} --kv-transfer-config "
        f'\'{{"kv_connector_extra_config": {{"password": "{REDACTED}"}}}}\''
    )


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


KV_CONFIG = (
    '{"kv_connector":"X","kv_connector_extra_config":'
    '{"password":"json-canary-1","nested":[{"apiKey":"json-canary-2"}],"port":5}}'
)


def test_secrets_inside_argument_values_are_hidden() -> None:
    """A URL's password, a JSON field, a ``key=value`` pair named like a secret, inside any
    server argument's value: hidden in the arguments, found by :func:`secret_values`."""
    args = [
        "--otlp-traces-endpoint",
        "http://u:url-canary-1@host:4317",
        f"--kv-transfer-config={KV_CONFIG}",
        "--kv-transfer-config",
        KV_CONFIG,
        "--hf-overrides",
        "user=bob,password=kv-canary-1",
    ]
    hidden = redact_args(args)
    assert hidden[1] == "http://u:***@host:4317"
    flag, _, value = hidden[2].partition("=")
    assert flag == "--kv-transfer-config" and value == hidden[4]
    assert json.loads(hidden[4]) == {
        "kv_connector": "X",
        "kv_connector_extra_config": {
            "password": REDACTED,
            "nested": [{"apiKey": REDACTED}],
            "port": 5,
        },
    }
    assert hidden[6] == f"user=bob,password={REDACTED}"
    assert set(secret_values(args)) == {
        "url-canary-1",
        "json-canary-1",
        "json-canary-2",
        "kv-canary-1",
    }
    # Nothing else is touched: a JSON value without secrets keeps its bytes.
    plain = ['{"max_tokens":5, "key_size": 3}', "http://host:4317", "max_num_batched_tokens=2048"]
    assert redact_args(plain) == plain and secret_values(plain) == []


def test_secrets_inside_free_text_are_hidden() -> None:
    """Text that is not whole JSON (a log line, a config's repr, an error): JSON and Python
    fields, ``key=value`` pairs and URLs' passwords are hidden, and hiding twice changes
    nothing."""
    lines = {
        'non-default args: {"password": "c-1", "kv_role": "kv_both", "pwd": 12345}': (
            f'non-default args: {{"password": "{REDACTED}", "kv_role": "kv_both", '
            f'"pwd": "{REDACTED}"}}'
        ),
        # A number under a name that also counts or sizes things is no secret.
        '{"kv_bytes_per_token": 4096, "prefill_token": 0.5} kv_bytes_per_token=4096': (
            '{"kv_bytes_per_token": 4096, "prefill_token": 0.5} kv_bytes_per_token=4096'
        ),
        "KVTransferConfig(kv_connector='X', kv_connector_extra_config={'secret': 'c-2'}, "
        "api_key='c-3', engine_id=None)": (
            f"KVTransferConfig(kv_connector='X', kv_connector_extra_config={{'secret': "
            f"'{REDACTED}'}}, api_key='{REDACTED}', engine_id=None)"
        ),
        "{'api_key': ['c-4', 'c-5'], 'max_num_seqs': 8}": (
            f"{{'api_key': ['{REDACTED}', '{REDACTED}'], 'max_num_seqs': 8}}"
        ),
        'Exporting to grpc://:c-6@collector:4317 failed; "pw\\"x"': (
            'Exporting to grpc://:***@collector:4317 failed; "pw\\"x"'
        ),
        "GET /v1?model=m&access_token=c-7&n=1": f"GET /v1?model=m&access_token={REDACTED}&n=1",
        '{"dbPassword": "a\\"b c"}': f'{{"dbPassword": "{REDACTED}"}}',
        "tokenizer=gpt2 max_num_batched_tokens=2048 key_size=3": (
            "tokenizer=gpt2 max_num_batched_tokens=2048 key_size=3"
        ),
    }
    for text, hidden in lines.items():
        assert redact_text(text) == hidden, text
        assert redact_text(hidden) == hidden, hidden
    assert redact({"DbPassword": 42, "enabled": True, "apiKey": False, "per_token": 4}) == {
        "DbPassword": REDACTED,
        "enabled": True,
        "apiKey": False,
        "per_token": 4,
    }


def test_serve_lines_hide_secrets_inside_values() -> None:
    user = redact_args(
        [
            "--otlp-traces-endpoint",
            "http://u:url-canary-2@h:4317",
            "--kv-transfer-config",
            KV_CONFIG,
        ]
    )
    line = serve_command("m", {"max_num_seqs": 8}, None, user)
    assert "canary" not in line and redact_text(line) == line
    config = yaml.safe_load(command_yaml(line))
    assert config["otlp-traces-endpoint"] == "http://u:***@h:4317"
    assert json.loads(config["kv-transfer-config"])["kv_connector_extra_config"]["password"] == (
        REDACTED
    )
