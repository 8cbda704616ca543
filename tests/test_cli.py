"""The ``tune`` command line: every command works, has help, and bad input is one line + exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefill_tuner.entry import YOUNG_COLLECTION_EVERY
from prefill_tuner.trace import read_trace
from tests.conftest import AZURE, BURSTGPT, MOONCAKE


@pytest.mark.parametrize(
    "args", [(), ("trace",), ("trace", "stats"), ("trace", "convert"), ("trace", "synth")]
)
def test_every_command_has_help(tune, args: tuple[str, ...]) -> None:
    code, out, _ = tune(*args, "--help")
    assert code == 0 and "Usage" in out


def test_stats_json_is_machine_readable(tune) -> None:
    code, out, _ = tune("trace", "stats", str(BURSTGPT), "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["requests"] == 383 and payload["prefix_reuse"] is None
    assert payload["adjustments"] == [
        {"action": "dropped", "reason": "failed requests (0 response tokens)", "count": 17}
    ]
    assert payload["source"]["format"] == "burstgpt"


def test_stats_shows_shaping_notes(tune) -> None:
    code, out, _ = tune(
        "trace",
        "stats",
        str(MOONCAKE),
        "--max-model-len",
        "32768",
        "--over-length",
        "drop",
        "--duration",
        "600",
    )
    assert code == 0
    assert "note" in out and "outside the time window" in out and "max_model_len 32768" in out


def test_convert_writes_native_and_reports(tune, tmp_path: Path) -> None:
    target = tmp_path / "azure.jsonl"
    code, _, err = tune(
        "trace", "convert", str(AZURE), str(target), "--rate-scale", "2", "--max-requests", "100"
    )
    assert code == 0
    assert "wrote 100 requests" in err and "beyond the first 100" in err
    converted = read_trace(target)
    original = read_trace(AZURE).requests[:100]
    assert [r.id for r in converted.requests] == [r.id for r in original]
    assert converted.requests[-1].arrival_s == pytest.approx(original[-1].arrival_s / 2, abs=1e-6)


def test_convert_to_stdout(tune) -> None:
    code, out, _ = tune("trace", "convert", str(BURSTGPT), "-", "--max-requests", "2")
    assert code == 0
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["0", "1"]


def test_synth_is_reproducible(tune, tmp_path: Path) -> None:
    args = [
        "--mix",
        "decode=0.9,longdoc-16k=0.1",
        "--rate",
        "3",
        "--duration",
        "30",
        "--arrivals",
        "gamma",
        "--cv",
        "2",
        "--seed",
        "5",
        "--burst",
        "longdoc-32k@10*2",
    ]
    assert tune("trace", "synth", str(tmp_path / "a.jsonl"), *args)[0] == 0
    assert tune("trace", "synth", str(tmp_path / "b.jsonl"), *args)[0] == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    prompts = [r.prompt_tokens for r in read_trace(tmp_path / "a.jsonl").requests]
    assert prompts.count(32768) == 2 and 16 in prompts


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("trace", "stats", "{missing}"), "cannot read the file"),
        (("trace", "stats", "{bad}"), "{bad}:2: field 'input_length': must not be negative"),
        (("trace", "stats", str(MOONCAKE), "--rate-scale", "0"), "--rate-scale"),
        (("trace", "stats", str(MOONCAKE), "--dequantize", "soon"), "--dequantize"),
        (("trace", "stats", str(MOONCAKE), "--over-length", "trim"), "--over-length"),
        (("trace", "stats", str(MOONCAKE), "--start", "99999"), "no requests"),
        (("trace", "stats", str(MOONCAKE), "--format", "parquet"), "unknown trace format"),
        (("trace", "synth", "{out}", "--mix", "bogus"), "unknown request class"),
        (("trace", "synth", "{out}", "--arrivals", "weibull"), "--arrivals"),
        (("trace", "synth", "{out}", "--burst", "decode"), "burst"),
        (("trace", "convert", str(AZURE), "{nodir}"), "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tune, tmp_path: Path, args, words: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
        '{"timestamp": 1, "input_length": -5, "output_length": 1}\n'
    )
    names = {
        "missing": tmp_path / "nope.csv",
        "bad": bad,
        "out": tmp_path / "out.jsonl",
        "nodir": tmp_path / "no" / "such" / "dir.jsonl",
    }
    args = tuple(a.format(**names) for a in args)
    words = words.format(**names)
    code, out, err = tune(*args)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err
    assert "Traceback" not in err + out
    assert not (tmp_path / "out.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"], "nothing half-written"


def test_usage_errors_also_exit_2(tune) -> None:
    assert tune("trace", "stats")[0] == 2
    assert tune("trace", "stats", str(MOONCAKE), "--max-requests", "0")[0] == 2


def test_installed_console_script(tmp_path: Path) -> None:
    """The real ``tune`` executable (not just the function) maps bad input to exit code 2."""
    script = Path(sys.executable).parent / "tune"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tuner"]
    bad = tmp_path / "x.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:40,7,x\n")
    result = subprocess.run(
        [*command, "trace", "stats", str(bad)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    assert result.returncode == 2
    assert (
        result.stderr == f"error: {bad}:2: field 'GeneratedTokens': expected a whole number, "
        "got 'x'\n"
    )


def test_the_entry_point_leaves_the_collector_on_and_the_loaded_modules_frozen() -> None:
    """The console script loads the command line with the garbage collector off: it must be
    on again when the command runs (a command left without it would leak every cycle), the
    loaded modules frozen and the young generation's threshold raised (``entry``)."""
    program = (
        "import gc, sys\n"
        "from prefill_tuner import entry\n"
        "sys.argv = ['tune', '--version']\n"
        "try:\n"
        "    entry.main()\n"
        "except SystemExit as done:\n"
        "    assert done.code in (0, None), done.code\n"
        "print(gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()[0])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    version, state = result.stdout.splitlines()
    enabled, frozen, young = state.split()
    assert version.startswith("tune ")
    assert enabled == "True" and int(frozen) > 50_000 and int(young) == YOUNG_COLLECTION_EVERY
