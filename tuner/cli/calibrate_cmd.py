"""``tune calibrate``: fit the simulator's step-time profile to a real vLLM server."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from prefill_tuner import defaults
from prefill_tuner.calibration.calibrate import Calibration
from prefill_tuner.calibration.session import (
    Design,
    calibrate_server,
    calibrate_study,
    designed_settings,
    kernels_to_refit,
)
from prefill_tuner.cli.assignments import parse_assignments, parse_value
from prefill_tuner.cli.declared_options import group
from prefill_tuner.cli.display import error_console, json_safe, output_console
from prefill_tuner.cli.options import (
    HARDWARE,
    HARDWARE_PANEL,
    REAL_SERVER,
    JsonOpt,
    ModelOpt,
    OptionGroup,
    StorageOpt,
    with_options,
)
from prefill_tuner.engines.factory import EngineOptions, build_engine
from prefill_tuner.engines.sim.cost_model import FittedProfile
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.engines.sim.profile_base import check_profile_name
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_text, check_output
from prefill_tuner.storage.store import inputs_of
from prefill_tuner.study.plan import check_study_name

if TYPE_CHECKING:
    from prefill_tuner.calibration.refit import Refit

DESIGN = group(Design, ("max_num_batched_tokens", "max_num_seqs", "spacing"), panel="Workload")
"""The designed workload's options (:class:`Design`'s fields)."""

REFIT_HELP = (
    "A kernels profile (name or file) to refit: keep its measured kernels, refit only its time "
    "outside kernels (device, host, front end) to the server (default: fit a profile from "
    "scratch). --gpu etc. build one instead."
)


def _refit_option(param: inspect.Parameter) -> inspect.Parameter:
    """The hardware group's ``--profile``, with what it means here."""
    if param.name != "profile":
        return param
    option = typer.Option("--profile", help=REFIT_HELP, rich_help_panel=HARDWARE_PANEL)
    return param.replace(annotation=Annotated[str | None, option])


REFIT = OptionGroup(
    params=tuple(_refit_option(param) for param in HARDWARE.params), build=HARDWARE.build
)
"""The simulated-hardware options (``--profile``, or ``--gpu`` and the rest): a kernels
profile whose time outside kernels the calibration refits."""


@with_options(design=DESIGN, engine=REAL_SERVER, hardware=REFIT)
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
    design: Design,
    engine: EngineOptions,
    hardware: ProfileSpec,
) -> None:
    """Fit the simulator's step-time profile to a real vLLM server: replay a designed
    workload on one server (--engine vllm), or reuse a study's real trials (--from-study);
    print the fit's held-out error and write the profile for --profile. With --profile (or
    --gpu ...) a kernels profile keeps its measured kernels and only its time outside kernels
    is refitted."""
    if name is not None:
        check_profile_name(name, "--name")
    check_output(output, inputs_of(storage))
    err = error_console()

    def say(line: str) -> None:
        err.print(line, markup=False)

    calibration: Calibration | Refit
    if from_study is not None:
        check_study_name(from_study, "--from-study")
        if engine_name is not None:
            raise TunerError("--from-study: give it alone; it starts no server (drop --engine)")
        if set_values:
            raise TunerError("--set: only with --engine vllm (--from-study starts no server)")
        calibration = calibrate_study(
            storage, from_study, hardware=hardware, model=model, name=name, on_start=say
        )
    else:
        if engine_name != "vllm":
            raise TunerError(
                "tune calibrate: give --engine vllm (start a server and replay a designed "
                "workload) or --from-study NAME (reuse a study's real trials)"
            )
        fixed = _fixed_settings(set_values)
        base = kernels_to_refit(hardware, model, fixed.get("max_model_len"))  # before vLLM
        trial_engine = build_engine(dataclasses.replace(engine, model=model))
        with contextlib.closing(trial_engine):  # its kept server and helper stop here
            fixed = trial_engine.validate_fixed(fixed)  # vLLM's parser, before a server starts
            settings = designed_settings(
                trial_engine.default_settings(),
                fixed,
                design.max_num_seqs,
                design.max_num_batched_tokens,
            )
            calibration = calibrate_server(
                trial_engine,
                settings,
                model=model,
                base=base,
                name=name,
                spacing=design.spacing,
                on_start=say,
            )
    with atomic_text(output) as stream:
        if isinstance(calibration.profile, FittedProfile):
            yaml.safe_dump(
                calibration.profile.model_dump(mode="json"), stream, sort_keys=False, width=88
            )
        else:
            stream.write(calibration.profile.yaml_text())
    if as_json:
        typer.echo(json.dumps(json_safe(report_data(calibration, output)), indent=1))
    else:
        output_console().print(
            "\n".join(report_lines(calibration, output)), crop=False, markup=False
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


def report_data(calibration: Calibration | Refit, output: Path) -> dict[str, object]:
    """The report as JSON: the fit's errors, the step counts, the replays compared; for a
    refit, what the kernels profile was before (``refit``)."""
    fit = calibration.fit
    data: dict[str, object] = {
        "profile": str(output),
        "name": calibration.profile.name,
        "kind": calibration.profile.kind,
        "steps": calibration.steps,
        "rebuilt": calibration.aligned,
        "cycle_steps": calibration.cycle_steps,
        "held_out": fit.held_out.as_dict(),
        "held_out_by_kind": {kind: error.as_dict() for kind, error in fit.by_kind.items()},
        "cycle_held_out": fit.cycle_held_out.as_dict() if fit.cycle_held_out else None,
        "ttft_error": calibration.ttft_error,
        "replays": calibration.replays,
    }
    if not isinstance(calibration, Calibration):
        from prefill_tuner.calibration.refit import REFITTED_TERMS

        given, profile = calibration.given, calibration.profile
        data["refit"] = {
            "given": given.name,
            "terms": {
                term: {"before": getattr(given, term), "after": getattr(profile, term)}
                for term in REFITTED_TERMS
            },
            "host_refitted": calibration.fit.host_fitted,
            "overlapped_steps": calibration.fit.overlapped_steps,
            "before": calibration.fit.before.as_dict(),
            "ttft_error_before": calibration.ttft_error_before,
            "server_pool": calibration.server_pool,
            "warnings": list(calibration.warnings),
        }
    return data


def report_lines(calibration: Calibration | Refit, output: Path) -> list[str]:
    """What the fit found, and how far to trust it (80 columns)."""
    if not isinstance(calibration, Calibration):
        return refit_lines(calibration, output)
    fit, profile = calibration.fit, calibration.profile
    lines = [f"profile {profile.name} written to {output}", _steps_line(calibration)]
    lines.append(
        f"  held-out step time vs vLLM's step timer ({fit.held_out.steps} steps): "
        f"median {fit.held_out.median:.0%}, p90 {fit.held_out.p90:.0%}"
    )
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
    lines.append(
        f"  way back: {profile.response_output_us:.0f} µs per output the server streams "
        "before a request's in its step"
    )
    if profile.resend_ms:
        lines.append(
            f"  client: {profile.resend_ms:.1f} ms from a response's end to its next send "
            "(closed loop)"
        )
    lines.append(f"  simulated TTFT vs real: median error {calibration.ttft_error:.0%}")
    return [*lines, *_replay_lines(calibration), f"use it: tune run --profile {output} …"]


def refit_lines(refit: Refit, output: Path) -> list[str]:
    """A refit's report: each error and term before and after (80 columns)."""
    fit, given, profile = refit.fit, refit.given, refit.profile
    before, after = fit.before, fit.after
    lines = [
        f"profile {profile.name} written to {output}",
        f"  {given.name}'s measured kernels kept, its time outside kernels refitted",
        _steps_line(refit),
        f"  held-out step time vs vLLM's step timer ({after.held_out.steps} steps), before → "
        f"after: median {before.held_out.median:.0%} → {after.held_out.median:.0%}, p90 "
        f"{before.held_out.p90:.0%} → {after.held_out.p90:.0%}",
    ]
    if fit.overlapped_steps:
        lines.append(
            f"    ({fit.overlapped_steps} steps scheduled asynchronously: their timer plus the "
            "host's share it starts after)"
        )
    for kind, error in after.by_kind.items():
        was = before.by_kind[kind]
        lines.append(
            f"    {kind:8} {error.steps:5} steps: median {was.median:.0%} → {error.median:.0%}, "
            f"bias {was.bias:+.0%} → {error.bias:+.0%}"
        )
    if before.cycle_held_out is not None and after.cycle_held_out is not None:
        lines.append(
            f"  whole step with host time vs log-line gaps: median "
            f"{before.cycle_held_out.median:.0%} → {after.cycle_held_out.median:.0%}, p90 "
            f"{before.cycle_held_out.p90:.0%} → {after.cycle_held_out.p90:.0%}"
        )
    lines.append(
        f"  device, outside kernels: {given.overhead_ms:.2f} ms + {given.per_request_us:.1f} µs "
        f"a request → {profile.overhead_ms:.2f} ms + {profile.per_request_us:.1f} µs"
    )
    host = (
        f"{given.host_ms:.2f} ms + {given.host_request_us:.1f} µs a request → "
        f"{profile.host_ms:.2f} ms + {profile.host_request_us:.1f} µs"
        if fit.host_fitted
        else f"{profile.host_ms:.2f} ms + {profile.host_request_us:.1f} µs a request, kept "
        "(the log has no line times)"
    )
    lines.append(f"  host: {host}")
    lines.append(
        f"  front end: {given.request_latency_ms:.1f} → {profile.request_latency_ms:.1f} ms "
        "from a send to the scheduler"
    )
    lines.append(
        f"  way back: {given.response_output_us:.0f} → {profile.response_output_us:.0f} µs per "
        "output streamed before a request's"
    )
    lines.append(
        f"  simulated TTFT vs real: median error {refit.ttft_error_before:.0%} → "
        f"{refit.ttft_error:.0%}"
    )
    pool = refit.server_pool
    if pool.get("num_gpu_blocks"):
        lines.append(
            f"  KV pool: the server's {pool['num_gpu_blocks']} blocks of {pool['block_size']} "
            f"tokens; the profile keeps its estimate "
            f"({profile.engine_defaults.get('num_gpu_blocks')} blocks)"
        )
    lines += [f"  warning: {line}" for line in refit.warnings]
    return [*lines, *_replay_lines(refit), f"use it: tune run --profile {output} …"]


def _steps_line(calibration: Calibration | Refit) -> str:
    share = calibration.aligned / calibration.steps if calibration.steps else 0.0
    return (
        f"  steps: {calibration.steps} logged, {calibration.aligned} rebuilt ({share:.0%}), "
        f"{calibration.cycle_steps} timed line to line"
    )


def _replay_lines(calibration: Calibration | Refit) -> list[str]:
    lines = []
    for replay in calibration.replays:
        if replay.get("label"):
            lines.append(f"  {replay['label']}:")
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
    return lines
