"""``tune tiny-model DIR``: the tiny CPU model from the command line, refusing to write into a
directory that holds anything."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from prefill_tuner.engines.real.cpu_recipe import TINY_LLAMA


def test_tiny_model_writes_the_config_and_says_how_to_serve_it(tune, tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    code, out, err = tune("tiny-model", str(folder))
    assert code == 0, err
    assert json.loads((folder / "config.json").read_text()) == TINY_LLAMA
    assert [path.name for path in folder.iterdir()] == ["config.json"]
    words = shlex.split(out.splitlines()[1])
    assert words[:2] == ["--model", str(folder)]
    assert "--load-format dummy --skip-tokenizer-init --enforce-eager --dtype float32" in words
    assert "HF_HUB_OFFLINE=1" in words


def test_tiny_model_with_weights_is_served_from_safetensors(tune, tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()  # an empty directory is fine
    code, out, err = tune("tiny-model", str(folder), "--weights")
    assert code == 0, err
    assert (folder / "model.safetensors").stat().st_size > 5_000_000
    assert "--load-format safetensors" in out


def test_tiny_model_refuses_a_directory_that_holds_anything(tune, tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    code, out, err = tune("tiny-model", str(folder))
    assert code == 2 and out == ""
    assert err == f"error: {folder}: already exists and is not an empty directory\n"
    assert (folder / "config.json").read_text() == "{}"
