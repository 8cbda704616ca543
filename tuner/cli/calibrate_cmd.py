"""``tune calibrate``: fit the simulator's step-time profile to a real vLLM server."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from prefill_tuner import defaults
from prefill_tuner.calibration.calibrate import Calibration
from prefill_tuner.cli.assignments import parse_assignments, parse_value
from prefill_tuner.cli.display import error_console, json_safe, output_console
from prefill_tuner.cli.options import (
    REAL_SERVER,
    JsonOpt,
    ModelOpt,
    StorageOpt,
    with_options,
)
from prefill_tuner.engines.factory import EngineOptions, build_engine
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_text, check_output
from prefill_tuner.storage.store import inputs_of
from prefill_tuner.study.plan import check_study_name

CALIBRATION_SEQS = 128
"""Largest decode batch of the designed workload unless ``--max-num-seqs`` says otherwise."""


@with_options(engine=REAL_SERVER)
def calibrate_command(
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Write the fitted profile (YAML) here.")
    ],
    engine_name: Annotated[
        str | None,
        typer.Option("--engine", help="vllm: start a server and replay a designed workload on it."),
    ] = None,
    model: ModelOpt = defaults.MODEL,
    from_study: Annotated[
        str | None,
        typer.Option(
            "--from-study",
            help="Fit to the step logs a study's real trials kept, instead of starting a server.",
        ),
    ] = None,
    storage: StorageOpt = defaults.STORAGE,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-num-batched-tokens",
            min=1,
            help="The calibration server's step budget: the largest prefill chunk it sees "
            "(default: the server's own default).",
        ),
    ] = None,
    max_num_seqs: Annotated[
        int,
        typer.Option(
            "--max-num-seqs", min=1, help="Largest decode batch the designed workload builds."
        ),
    ] = CALIBRATION_SEQS,
    spacing: Annotated[
        float,
        typer.Option(
            "--spacing",
            min=0.01,
            max=100.0,
            help="Stretch the workload's gaps (1: a small model on a CPU; more where one "
            "max_model_len prompt takes over a second).",
        ),
    ] = 1.0,
    set_values: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Fixed engine setting of the calibration server, as tune run takes it, e.g. "
            "max_model_len=2048 (repeatable).",
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="The profile's name (default: calibrated-MODEL, MODEL the one calibrated: "
            "--model, or the study's).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    *,
    engine: EngineOptions,
) -> None:
    """Fit the simulator's step-time profile to a real vLLM server: replay a designed
    workload on one server (--engine vllm), or reuse a study's real trials (--from-study);
    print the fit's held-out error and write the profile for --profile."""
    check_output(output, inputs_of(storage))
    err = error_console()
    if from_study is not None:
        check_study_name(from_study, "--from-study")
        if engine_name is not None:
            raise TunerError("--from-study: give it alone; it starts no server (drop --engine)")
        if set_values:
            raise TunerError("--set: only with --engine vllm (--from-study starts no server)")
        from prefill_tuner.calibration.observations import calibrate_from_study
        from prefill_tuner.storage.store import TunerStore

        store = TunerStore(storage, create=False)
        record = store.get_study(from_study)  # calibrate_from_study says when there is none
        calibration = calibrate_from_study(
            store,
            from_study,
            name=name or profile_name(record.model if record else model),
            on_start=lambda line: err.print(line, markup=False),
        )
    else:
        if engine_name != "vllm":
            raise TunerError(
                "tune calibrate: give --engine vllm (start a server and replay a designed "
                "workload) or --from-study NAME (reuse a study's real trials)"
            )
        from prefill_tuner.calibration.observations import calibrate_on_server

        fixed = _fixed_settings(set_values)
        trial_engine = build_engine(dataclasses.replace(engine, model=model))
        fixed = trial_engine.validate_fixed(fixed)  # vLLM's parser, before a server starts
        settings = {**trial_engine.default_settings(), **fixed, "max_num_seqs": max_num_seqs}
        if max_num_batched_tokens is not None:
            settings["max_num_batched_tokens"] = max_num_batched_tokens
        settings["max_num_batched_tokens"] = max(
            settings.get("max_num_batched_tokens") or max_num_seqs, max_num_seqs
        )
        err.print(
            f"calibrating {model} on {trial_engine.version}: one server "
            f"(budget {settings['max_num_batched_tokens']}, up to {max_num_seqs} sequences), "
            f"the designed workload (about {60 * spacing:.0f} s)…",
            markup=False,
        )
        calibration = calibrate_on_server(
            trial_engine, settings, model=model, name=name or profile_name(model), spacing=spacing
        )
    with atomic_text(output) as stream:
        yaml.safe_dump(
            calibration.profile.model_dump(mode="json"), stream, sort_keys=False, width=88
        )
    if as_json:
        typer.echo(json.dumps(json_safe(report_data(calibration, output)), indent=1))
    else:
        output_console().print(
            "\n".join(report_lines(calibration, output)), crop=False, markup=False
        )


def profile_name(model: str) -> str:
    """A calibrated profile's default name: the model's, as a file name may hold it."""
    return "calibrated-" + (
        re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model).name).strip("-") or "model"
    )


def _fixed_settings(assignments: list[str] | None) -> dict[str, Any]:
    """``--set`` values; the two knobs the designed workload is built to have their own
    options."""
    fixed = {
        knob: parse_value(value)
        for knob, value in parse_assignments(list(assignments or []), "--set").items()
    }
    for knob in ("max_num_seqs", "max_num_batched_tokens"):
        if knob in fixed:
            flag = "--" + knob.replace("_", "-")
            raise TunerError(f"--set {knob}: give {flag} (the designed workload is built to it)")
    return fixed


def report_data(calibration: Calibration, output: Path) -> dict[str, object]:
    """The report as JSON: the fit's errors, the step counts, the replays compared."""
    fit = calibration.fit
    return {
        "profile": str(output),
        "name": calibration.profile.name,
        "steps": calibration.steps,
        "rebuilt": calibration.aligned,
        "cycle_steps": calibration.cycle_steps,
        "held_out": fit.held_out.as_dict(),
        "held_out_by_kind": {kind: error.as_dict() for kind, error in fit.by_kind.items()},
        "cycle_held_out": fit.cycle_held_out.as_dict() if fit.cycle_held_out else None,
        "ttft_error": calibration.ttft_error,
        "replays": calibration.replays,
    }


def report_lines(calibration: Calibration, output: Path) -> list[str]:
    """What the fit found, and how far to trust it (80 columns)."""
    fit, profile = calibration.fit, calibration.profile
    share = calibration.aligned / calibration.steps if calibration.steps else 0.0
    lines = [
        f"profile {profile.name} written to {output}",
        f"  steps: {calibration.steps} logged, {calibration.aligned} rebuilt ({share:.0%}), "
        f"{calibration.cycle_steps} timed line to line",
        f"  held-out step time vs vLLM's step timer ({fit.held_out.steps} steps): "
        f"median {fit.held_out.median:.0%}, p90 {fit.held_out.p90:.0%}",
    ]
    for kind, error in fit.by_kind.items():
        lines.append(
            f"    {kind:8} {error.steps:5} steps: median {error.median:.0%}, "
            f"p90 {error.p90:.0%}, bias {error.bias:+.0%}"
        )
    if fit.cycle_held_out is not None:
        lines.append(
            f"  whole step with host time vs log-line gaps: median "
            f"{fit.cycle_held_out.median:.0%}, p90 {fit.cycle_held_out.p90:.0%}"
        )
        lines.append(
            f"  host time: {profile.host_ms:.2f} ms a step + "
            f"{profile.host_request_ms:.3f} ms a request"
        )
    lines.append(f"  front end: {profile.request_latency_ms:.1f} ms from a send to the scheduler")
    lines.append(f"  simulated TTFT vs real: median error {calibration.ttft_error:.0%}")
    for replay in calibration.replays:
        lines.append(
            f"  replayed: real {replay['real_steps']} steps, p50 TTFT "
            f"{replay['real_p50_ttft_s'] * 1000:.1f} ms, p50 TPOT "
            f"{replay['real_p50_tpot_s'] * 1000:.2f} ms"
        )
        lines.append(
            f"  simulated: {replay['sim_steps']} steps, p50 TTFT "
            f"{replay['sim_p50_ttft_s'] * 1000:.1f} ms, p50 TPOT "
            f"{replay['sim_p50_tpot_s'] * 1000:.2f} ms"
        )
    lines.append(f"use it: tune run --profile {output} …")
    return lines
