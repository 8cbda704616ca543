"""``tune trace``: inspect, convert and synthesise request traces."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tuner.cli.options import (
    DequantizeOpt,
    DurationOpt,
    FormatOpt,
    JitterSeedOpt,
    MaxModelLenOpt,
    MaxRequestsOpt,
    OverLengthOpt,
    RateScaleOpt,
    SortOpt,
    StartOpt,
    json_safe,
    output_console,
    shape_options,
)
from tuner.errors import TunerError
from tuner.trace import Trace, load_trace
from tuner.trace.native import write_native
from tuner.trace.stats import TraceStats, trace_stats
from tuner.trace.synth import Arrivals, parse_burst, parse_mix, synthesize

trace_app = typer.Typer(
    help="Inspect, convert and synthesise request traces.", no_args_is_help=True
)


@trace_app.command("stats")
def stats_command(
    file: Annotated[Path, typer.Argument(help="Trace file (JSONL, Azure or BurstGPT CSV).")],
    format: FormatOpt = None,
    sort: SortOpt = False,
    start: StartOpt = 0.0,
    duration: DurationOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    max_model_len: MaxModelLenOpt = None,
    over_length: OverLengthOpt = "clip",
    max_requests: MaxRequestsOpt = None,
    dequantize: DequantizeOpt = None,
    jitter_seed: JitterSeedOpt = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Print what a trace asks of a server: rate, burstiness, lengths, load, prefix reuse."""
    options = shape_options(
        start,
        duration,
        rate_scale,
        max_model_len,
        over_length,
        max_requests,
        dequantize,
        jitter_seed,
    )
    trace = load_trace(str(file), format, sort=sort, options=options)
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


def render_stats(trace: Trace, stats: TraceStats) -> Table:
    """The stats as a two-column table (a token sub-table inside)."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    if trace.source is not None:
        digest = f", sha256 {trace.source.sha256[:12]}…" if trace.source.sha256 else ""
        table.add_row("trace", f"{trace.source.path} ({trace.source.format}{digest})")
    table.add_row("requests", f"{stats.requests:,}")
    table.add_row("duration", f"{stats.duration_s:,.1f} s ({stats.duration_s / 60:,.1f} min)")
    table.add_row("mean rate", f"{stats.mean_rate:.2f} req/s")
    table.add_row(
        "burstiness",
        f"index of dispersion {stats.index_of_dispersion:.2f} (1 = Poisson); "
        f"at most {stats.max_per_second} requests in one second",
    )
    tokens = Table(box=None, pad_edge=False)
    tokens.add_column("tokens")
    for key in ("p50", "p90", "p99", "max", "mean"):
        tokens.add_column(key, justify="right")
    for name, summary in (("prompt", stats.prompt_tokens), ("output", stats.output_tokens)):
        tokens.add_row(name, *(f"{summary[k]:,.0f}" for k in ("p50", "p90", "p99", "max", "mean")))
    table.add_row("lengths", tokens)
    table.add_row(
        "offered load",
        f"{_si(stats.prompt_tokens_per_s)} prompt tok/s, {_si(stats.output_tokens_per_s)} "
        "output tok/s",
    )
    if stats.prefix_reuse is None:
        table.add_row("prefix reuse", "no prefix-block ids in this trace")
    else:
        table.add_row(
            "prefix reuse",
            f"{stats.prefix_reuse:.1%} of {stats.prefix_blocks:,} prefix blocks were seen "
            "before (upper bound on the prefix-cache hit rate)",
        )
    for note in trace.adjustments:
        table.add_row("note", str(note))
    return table


def _si(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value / 1000:.3g}k" if abs(value) >= 1000 else f"{value:.3g}"


@trace_app.command("convert")
def convert_command(
    source: Annotated[Path, typer.Argument(help="Trace file to read.")],
    target: Annotated[Path, typer.Argument(help="Native JSONL file to write ('-': stdout).")],
    format: FormatOpt = None,
    sort: SortOpt = False,
    start: StartOpt = 0.0,
    duration: DurationOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    max_model_len: MaxModelLenOpt = None,
    over_length: OverLengthOpt = "clip",
    max_requests: MaxRequestsOpt = None,
    dequantize: DequantizeOpt = None,
    jitter_seed: JitterSeedOpt = 0,
) -> None:
    """Write a trace in the native format (Mooncake-style JSONL), shaped as asked."""
    options = shape_options(
        start,
        duration,
        rate_scale,
        max_model_len,
        over_length,
        max_requests,
        dequantize,
        jitter_seed,
    )
    trace = load_trace(str(source), format, sort=sort, options=options)
    write_native(trace.requests, target)
    _report(trace, target)


def _report(trace: Trace, target: Path) -> None:
    """Say what was written, and every adjustment, on stderr (stdout may hold the trace)."""
    err = Console(stderr=True, highlight=False)
    where = "standard output" if str(target) == "-" else str(target)
    err.print(f"wrote {len(trace):,} requests to {where}")
    for note in trace.adjustments:
        err.print(f"note: {note}")


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
            "--cv", help="Coefficient of variation of gamma interarrivals (>1: burstier)."
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
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
) -> None:
    """Write a seeded synthetic workload in the native format."""
    if arrivals not in ("poisson", "gamma", "uniform"):
        raise TunerError(f"--arrivals: expected poisson, gamma or uniform, got {arrivals!r}")
    kind: Arrivals = arrivals  # type: ignore[assignment]
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
