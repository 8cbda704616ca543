"""``tune trace``: inspect, convert and synthesise request traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, cast

import typer

from prefill_tuner.cli.display import error_console, json_safe, output_console, render_stats
from prefill_tuner.cli.options import (
    STDOUT,
    TRACE_WITH_LENGTH,
    JsonOpt,
    TraceChoice,
    with_options,
)
from prefill_tuner.defaults import MAX_SEED
from prefill_tuner.errors import TunerError
from prefill_tuner.files import check_output
from prefill_tuner.trace import Trace, load_trace
from prefill_tuner.trace.native import write_native
from prefill_tuner.trace.stats import trace_stats
from prefill_tuner.trace.synth import Arrivals, parse_burst, parse_mix, synthesize

trace_app = typer.Typer(
    help="Inspect, convert and synthesise request traces.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@trace_app.command("stats")
@with_options(reading=TRACE_WITH_LENGTH)
def stats_command(
    file: Annotated[Path, typer.Argument(help="Trace file (JSONL, Azure or BurstGPT CSV).")],
    as_json: JsonOpt = False,
    *,
    reading: TraceChoice,
) -> None:
    """Print what a trace asks of a server: rate, burstiness, lengths, load, prefix reuse."""
    options = reading.shaping
    trace = load_trace(str(file), reading.format, sort=reading.sort, options=options)
    stats = trace_stats(trace)
    if as_json:
        payload = {
            "source": None
            if trace.source is None
            else {
                "path": trace.source.path,
                "format": trace.source.format,
                "sha256": trace.source.sha256,
            },
            "shaping": options.model_dump(),
            "adjustments": [
                {"action": a.action, "reason": a.reason, "count": a.count}
                for a in trace.adjustments
            ],
            **stats.as_dict(),
        }
        typer.echo(json.dumps(json_safe(payload), indent=2))
        return
    output_console().print(render_stats(trace, stats))


@trace_app.command("convert")
@with_options(reading=TRACE_WITH_LENGTH)
def convert_command(
    source: Annotated[Path, typer.Argument(help="Trace file to read.")],
    target: Annotated[Path, typer.Argument(help="Native JSONL file to write ('-': stdout).")],
    *,
    reading: TraceChoice,
) -> None:
    """Write a trace in the native format (Mooncake-style JSONL), shaped as asked."""
    if target != STDOUT:
        check_output(target, [source])  # before the work: never over the source
    trace = load_trace(str(source), reading.format, sort=reading.sort, options=reading.shaping)
    write_native(trace.requests, target, [source])
    _report(trace, target)


def _report(trace: Trace, target: Path) -> None:
    """Say what was written, and every adjustment, on stderr (stdout may hold the trace)."""
    err = error_console()
    where = "standard output" if target == STDOUT else str(target)
    err.print(f"wrote {len(trace):,} requests to {where}", markup=False, soft_wrap=True)
    for note in trace.adjustments:
        err.print(f"note: {note}", markup=False, soft_wrap=True)


@trace_app.command("synth")
def synth_command(
    target: Annotated[Path, typer.Argument(help="Native JSONL file to write ('-': stdout).")],
    mix: Annotated[
        str,
        typer.Option(
            "--mix",
            help="Request classes and weights, e.g. 'decode=0.9,longdoc-16k=0.1'. Classes: "
            "decode (16/512), interactive (256/64), longdoc-16k (16384/32), "
            "longdoc-32k (32768/32), "
            "or PROMPTxOUTPUT.",
        ),
    ] = "interactive",
    rate: Annotated[float, typer.Option("--rate", min=0, help="Mean arrivals per second.")] = 1.0,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration", min=0, help="Seconds of traffic (default 60 unless --count is given)."
        ),
    ] = None,
    count: Annotated[int | None, typer.Option("--count", min=1, help="Number of requests.")] = None,
    arrivals: Annotated[
        str,
        typer.Option(
            "--arrivals", help="poisson, gamma (bursty; see --cv) or uniform (evenly spaced)."
        ),
    ] = "poisson",
    cv: Annotated[
        float,
        typer.Option(
            "--cv",
            min=0.01,
            max=100,
            help="Coefficient of variation of gamma interarrivals (>1: burstier).",
        ),
    ] = 2.0,
    burst: Annotated[
        list[str] | None,
        typer.Option(
            "--burst",
            help="Extra requests at one instant: CLASS@SECONDS[*COUNT], repeatable "
            "(e.g. longdoc-16k@30*4).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=MAX_SEED, help="Random seed.")] = 0,
) -> None:
    """Write a seeded synthetic workload in the native format."""
    if arrivals not in ("poisson", "gamma", "uniform"):
        raise TunerError(f"--arrivals: expected poisson, gamma or uniform, got {arrivals!r}")
    kind = cast(Arrivals, arrivals)  # one of its values: checked on the line above
    if target != STDOUT:
        check_output(target)
    trace = synthesize(
        parse_mix(mix),
        rate,
        bursts=tuple(parse_burst(text) for text in burst or ()),
        duration_s=duration if duration is not None or count is not None else 60.0,
        count=count,
        arrivals=kind,
        cv=cv,
        seed=seed,
    )
    write_native(trace.requests, target)
    _report(trace, target)
