"""Bad input (issue 11, items 9-14) is refused before any work: one line on stderr naming what
is wrong and where, exit code 2 (1 for a failing disk or pipe), no traceback, nothing
half-written."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefill_tuner.engines.real import engine as real_engine
from prefill_tuner.engines.real.engine import VllmEngine, VllmQueryError
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.space import EngineCapabilities
from prefill_tuner.storage.store import TunerStore

from tests.conftest import AZURE

SMALL = ["--trace", str(AZURE), "--max-requests", "40", "--slo", "p99_tpot=50ms"]


def stored(storage: str, name: str | None = None):
    store = TunerStore(storage)
    record = store.get_study(name or store.study_names()[0])
    assert record is not None
    return record, store.trials(record)


def one_line_error(code: int, out: str, err: str, expected_code: int = 2) -> str:
    assert code == expected_code, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in out + err
    return err


# Item 9: --set values are checked with the engine's own model, before any trial -----------
@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("max_num_seqs=0", "--set max_num_seqs=0: Input should be greater than or equal to 1"),
        ("enable_chunked_prefill=banana", "enable_chunked_prefill=banana: Input should be a valid"),
        ("block_size=0", "--set block_size=0"),
        ("watermark=2", "--set watermark=2: Input should be less than 1"),
        ("long_prefill_token_threshold=-3", "--set long_prefill_token_threshold=-3"),
        ("max_model_len=32768.5", "fractional part"),
        ("max_model_len=abc", "--set max_model_len=abc: Input should be a valid integer"),
    ],
)
def test_set_values_are_validated_before_any_trial(
    tune, tmp_path: Path, setting: str, words: str
) -> None:
    storage = tmp_path / "s.db"
    err = one_line_error(
        *tune("run", *SMALL, "--trials", "2", "--storage", f"sqlite:///{storage}", "--set", setting)
    )
    assert words in err
    assert not storage.exists(), "no study was created"


def test_valid_set_values_and_repairable_ones_still_run(tune, tmp_path: Path) -> None:
    code, _, err = tune(
        "run",
        *SMALL,
        "--trials",
        "2",
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
        "--set",
        "max_num_seqs=100000",  # lowered to each trial's budget, as before
        "--set",
        "max_model_len=8192",
    )
    assert code == 0, err


def test_real_engine_asks_vllm_about_fixed_settings_once(monkeypatch) -> None:
    """The real engine validates ``--set`` through vLLM's own parser and config classes
    (``vllm_args.py resolve``), once, before any trial; vLLM's answer names the problem."""
    engine = object.__new__(VllmEngine)
    engine.python, engine.model, engine.server_args = "python", "m", ("--dtype", "float32")
    engine.capabilities = EngineCapabilities(
        "vllm", "0.32", accepted_flags=frozenset({"--max-num-seqs", "--max-num-batched-tokens"})
    )
    engine.defaults = {
        "scheduler_config": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
        "model_config": {"max_model_len": 4096},
    }
    calls: list[tuple[str, ...]] = []

    def refuse(python: str, *args: str, **kwargs: object) -> object:
        calls.append(args)
        raise VllmQueryError("max_num_seqs: Input should be greater than 0")

    monkeypatch.setattr(real_engine, "ask_vllm", refuse)
    with pytest.raises(TunerError, match=r"--set max_num_seqs=0: vLLM refuses it: max_num_seqs"):
        engine.validate_fixed({"max_num_seqs": 0})
    server = ("--dtype", "float32", "--max-num-batched-tokens", "2048", "--max-num-seqs", "0")
    assert calls == [("resolve", "m", *server)]
    engine.validate_fixed({})  # nothing fixed: nothing to ask
    assert len(calls) == 1


# Item 10: a baseline outside the searched space runs as the baseline, said to be outside -----
@pytest.mark.parametrize(
    ("space", "note"),
    [
        (("--space", "enable_chunked_prefill=false"), "enable_chunked_prefill=true"),
        (("--space", "scheduler_reserve_full_isl=false"), "scheduler_reserve_full_isl=true"),
        (("--space-file", "{file}"), "enable_chunked_prefill=true"),
    ],
)
def test_a_baseline_outside_the_space_runs_and_is_said_to_be_outside(
    tune, tmp_path: Path, space: tuple[str, ...], note: str
) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text("enable_chunked_prefill: [false]\n")
    space = tuple(arg.format(file=space_file) for arg in space)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    code, out, err = tune("run", *SMALL, "--trials", "3", "--storage", storage, *space)
    assert code == 0, err
    assert "Traceback" not in out + err
    said = f"lies outside the searched space: {note}"
    assert said in err, "the header says so"
    assert said in out, "the summary says so"
    _, trials = stored(storage)
    assert [t.status for t in trials] == ["complete"] * 3
    baseline = next(t for t in trials if t.is_baseline)
    knob = note.split("=")[0]
    assert baseline.settings[knob] is True, "the baseline ran the engine's default"
    assert all(t.settings[knob] is False for t in trials if not t.is_baseline)
    code, out, _ = tune("pareto", "--storage", storage)
    assert code == 0 and said in out
