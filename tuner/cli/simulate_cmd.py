"""``tune simulate``: replay a trace through the simulated vLLM scheduler and summarise it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Annotated

import typer

from prefill_tuner import defaults
from prefill_tuner.cli.display import json_safe, output_console, render_sim_result
from prefill_tuner.cli.options import (
    HARDWARE,
    SIM_CONFIG,
    TRACE,
    JsonOpt,
    ModelOpt,
    SimSettings,
    TraceChoice,
    with_options,
)
from prefill_tuner.engines.sim import simulate
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_text, check_output
from prefill_tuner.trace import load_trace


@with_options(engine=SIM_CONFIG, trace=TRACE, hardware=HARDWARE)
def simulate_command(
    trace_file: Annotated[Path, typer.Option("--trace", help="Trace file to replay.")],
    model: ModelOpt = defaults.MODEL,
    over_length: Annotated[
        str | None,
        typer.Option(
            "--over-length",
            help="clip or drop requests longer than max_model_len "
            "before replay (default: send them; the engine rejects them as vLLM does).",
        ),
    ] = None,
    steps_out: Annotated[
        Path | None, typer.Option("--steps-out", help="Write every step as a JSON line here.")
    ] = None,
    as_json: JsonOpt = False,
    *,
    engine: SimSettings,
    trace: TraceChoice,
    hardware: ProfileSpec,
) -> None:
    """Replay a trace through the simulated vLLM V1 scheduler and print its latency summary."""
    if steps_out is not None:
        check_output(steps_out, [trace_file])
    engine_profile = hardware.step_model(model, engine.settings.get("max_model_len"))
    config = engine.config(engine_profile)
    if over_length is not None and over_length not in ("clip", "drop"):
        raise TunerError(f"--over-length: expected clip or drop, got {over_length!r}")
    shaping = trace.shaping
    if over_length is not None:
        shaping = shaping.model_copy(
            update={"max_model_len": config.max_model_len, "over_length": over_length}
        )
    requests = load_trace(str(trace_file), trace.format, sort=trace.sort, options=shaping)
    limit = shaping.max_concurrency
    if steps_out is None:
        result = simulate(requests, config, engine_profile, max_concurrency=limit)
    else:
        with atomic_text(steps_out, [trace_file]) as stream:
            result = simulate(
                requests,
                config,
                engine_profile,
                on_step=lambda step: _write_line(stream, step.as_dict()),
                max_concurrency=limit,
            )
    if as_json:
        typer.echo(
            json.dumps(
                json_safe(
                    {
                        **result.summary(requests),
                        "provenance": engine_profile.provenance.model_dump(),
                    }
                ),
                indent=2,
            )
        )
    else:
        output_console().print(
            render_sim_result(requests, result, engine_profile.provenance.summary())
        )


def _write_line(stream: IO[str], record: dict[str, object]) -> None:
    """One JSON line of ``--steps-out``."""
    stream.write(json.dumps(record, separators=(",", ":")) + "\n")
