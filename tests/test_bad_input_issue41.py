"""Bad input found by issue 41 is refused before any work: one line on stderr naming what is
wrong and where, exit code 2, no traceback, nothing stored (items 3, 4, 7 and 9)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_bad_input import SMALL, one_line_error

PROFILE = Path(__file__).parents[1] / "tuner/engines/sim/profiles/llama-3.1-8b-h100.yaml"
RUN = ["run", *SMALL, "--trials", "2", "--no-report"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _nothing_stored(tmp_path: Path) -> None:
    assert not (tmp_path / "x.db").exists()


# Item 4: every option bounded, before any trial ---------------------------------------------
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--dequantize", "1e20"], "--dequantize"),
        (["--rate-scale", "1e20"], "--rate-scale"),
        (["--capacity-tolerance", "1e20", "--objective", "capacity"], "--capacity-tolerance"),
        (["--judge-window", "busiest:1e20"], "longer than the trace"),
        (["--judge-window", "busiest:10", "--judge-window", "busiest:10.0"], "given twice"),
        (["--timeout", "0"], "--timeout"),
    ],
    ids=[
        "dequantize",
        "rate-scale",
        "capacity-tolerance",
        "window-long",
        "window-twice",
        "timeout",
    ],
)
def test_run_options_are_bounded(tune, tmp_path: Path, extra: list[str], named: str) -> None:
    err = one_line_error(*tune(*RUN, "--storage", "sqlite:///x.db", *extra))
    assert named in err
    _nothing_stored(tmp_path)


def test_sqlite_url_options_are_refused_not_ignored(tune, tmp_path: Path) -> None:
    err = one_line_error(*tune(*RUN, "--storage", "sqlite:///x.db?mode=ro"))
    assert "SQLite takes no URL options here (mode)" in err
    _nothing_stored(tmp_path)


def test_a_space_file_with_a_key_twice_is_refused(tune, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("max_num_batched_tokens: 512..8192\nmax_num_batched_tokens: 256..1024\n")
    err = one_line_error(*tune(*RUN, "--storage", "sqlite:///x.db", "--space-file", str(space)))
    assert "space.yaml" in err and "given twice" in err and "line 2" in err
    _nothing_stored(tmp_path)


@pytest.mark.parametrize("name", ["", "../../x", "a b", "-x"])
def test_a_profile_name_is_a_name(tune, tmp_path: Path, name: str) -> None:
    err = one_line_error(*tune("profile", "--gpu", "h100_sxm", "--name", name, "-o", "p.yaml"))
    assert "--name" in err and "a profile name is" in err
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["worker", "--study", "s", "--seed", "100000000000000000000"],
        ["worker", "--study", "s", "--heartbeat", "100000000000000000000"],
        ["worker", "--study", "s", "--grace", "100000000000000000000"],
        ["nightly", "--study", "n", *SMALL, "--repeats", "100000000000000000000"],
        ["trace", "synth", "s.jsonl", "--count", "10", "--cv", "1e300"],
    ],
    ids=["worker-seed", "heartbeat", "grace", "repeats", "cv"],
)
def test_other_commands_options_are_bounded(tune, tmp_path: Path, command: list[str]) -> None:
    err = one_line_error(*tune(*command))
    assert command[-2] in err, err
    assert sorted(os.listdir(tmp_path)) == []


# Item 7: a profile's numbers are finite and bounded -------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("overhead_ms", "1e308"),
        ("memory_bandwidth_gbps", ".inf"),
        ("kv_bytes_per_token", "1e300"),
        ("host_ms", ".nan"),
    ],
)
def test_profile_fields_are_finite_and_bounded(
    tune, tmp_path: Path, field: str, value: str
) -> None:
    lines = PROFILE.read_text().splitlines()
    edited = [f"{field}: {value}" if line.startswith(f"{field}:") else line for line in lines]
    assert edited != lines
    profile = tmp_path / "p.yaml"
    profile.write_text("\n".join(edited) + "\n")
    err = one_line_error(*tune(*RUN, "--storage", "sqlite:///x.db", "--profile", str(profile)))
    assert "p.yaml" in err and field in err
    _nothing_stored(tmp_path)


# Item 3: inputs are read bounded; special files refused -------------------------------------
def test_a_verify_reference_is_read_bounded(tune, tmp_path: Path) -> None:
    base = ["verify", "--model", "m", "--set", "max_num_batched_tokens=512", "--reference"]
    err = one_line_error(*tune(*base, "/dev/zero"))
    assert "/dev/zero" in err and "not a regular file" in err
    huge = tmp_path / "ref.json"
    with open(huge, "wb") as stream:  # sparse: a gibibyte on paper, nothing on disk
        stream.truncate(2**30)
    err = one_line_error(*tune(*base, str(huge)))
    assert "ref.json" in err and "1 GiB" in err


# Item 9: the rest of the newcomer's list ------------------------------------------------------
def test_a_profile_setting_is_named_as_the_profile_writes_it(tune, tmp_path: Path) -> None:
    profile = tmp_path / "c.yaml"
    profile.write_text(
        "kind: constant\nname: c\nstep_ms: 10\nengine_defaults: {max_model_len: 1}\n"
    )
    err = one_line_error(*tune("simulate", *SMALL[:4], "--profile", str(profile)))
    assert "c.yaml: field 'engine_defaults.max_model_len'" in err
    assert "--max-model-len" not in err


@pytest.mark.parametrize(
    "content", ["max_num_batched_tokens: 0..10\n", "bogus_knob: 1..2\n", "max_num_seqs: [a, b]\n"]
)
def test_a_space_file_error_names_the_file(tune, tmp_path: Path, content: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(content)
    err = one_line_error(*tune(*RUN, "--storage", "sqlite:///x.db", "--space-file", str(space)))
    assert err.startswith(f"error: {space}: ") and "--space" not in err
    _nothing_stored(tmp_path)


def test_a_report_folder_that_cannot_be_written_is_refused_first(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/sys refuses new files even to root (whom permission bits never stop): tried, not
    read from the bits."""
    monkeypatch.delenv("TUNE_NO_REPORT", raising=False)  # the suite's default (conftest.py)
    err = one_line_error(
        *tune(
            "run", *SMALL, "--trials", "2", "--storage", "sqlite:///x.db", "--report", "/sys/r.html"
        )
    )
    assert "cannot write in the folder '/sys'" in err
    _nothing_stored(tmp_path)


def test_a_dash_is_standard_output_for_export_and_report(tune, tmp_path: Path) -> None:
    code, _, err = tune(
        "run", *SMALL, "--trials", "3", "--storage", "sqlite:///x.db", "--no-report"
    )
    assert code == 0, err
    code, out, err = tune("export", "--storage", "sqlite:///x.db", "--format", "yaml", "-o", "-")
    assert code == 0 and "max-num-batched-tokens" in out, err
    code, out, err = tune("report", "--storage", "sqlite:///x.db", "-o", "-")
    assert code == 0 and out.lstrip().lower().startswith("<!doctype html"), err
    assert not (tmp_path / "-").exists()


def test_every_request_failing_says_so_not_nan(tune) -> None:
    code, out, err = tune("simulate", *SMALL[:4], "--max-model-len", "16")
    assert code == 0, err
    assert "nan" not in out and "no request completed" in out
