"""``tune trace``: inspect, convert and synthesise request traces."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from tuner.errors import TunerError
from tuner.trace import ShapeOptions, Trace, load_trace
from tuner.trace.native import write_native
from tuner.trace.stats import TraceStats, trace_stats
from tuner.trace.synth import Arrivals, parse_burst, parse_mix, synthesize

trace_app = typer.Typer(
    help="Inspect, convert and synthesise request traces.", no_args_is_help=True
)

# Options shared by every command that reads a trace -------------------------------------------
FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        "-f",
        help="jsonl (= mooncake, native), azure or burstgpt. Default: detected from the content.",
    ),
]
SortOpt = Annotated[
    bool, typer.Option("--sort", help="Sort out-of-order arrivals instead of refusing the file.")
]
StartOpt = Annotated[
    float, typer.Option("--start", min=0, help="Window start, seconds from trace start.")
]
DurationOpt = Annotated[
    float | None, typer.Option("--duration", min=0, help="Window length in seconds.")
]
RateScaleOpt = Annotated[
    float, typer.Option("--rate-scale", min=0, help="Multiply the arrival rate (0.1 = 10× slower).")
]
MaxModelLenOpt = Annotated[
    int | None,
    typer.Option(
        "--max-model-len", min=2, help="Clip or drop requests whose prompt + output exceed this."
    ),
]
OverLengthOpt = Annotated[
    str, typer.Option("--over-length", help="clip or drop requests longer than --max-model-len.")
]
MaxRequestsOpt = Annotated[
    int | None, typer.Option("--max-requests", min=1, help="Keep only the first N requests.")
]
DequantizeOpt = Annotated[
    str | None,
    typer.Option(
        "--dequantize",
        help="Spread coarse timestamps with uniform jitter "
        "over a quantum: seconds, or 'auto' (median gap between timestamps).",
    ),
]
JitterSeedOpt = Annotated[int, typer.Option("--jitter-seed", help="Seed for --dequantize.")]


def shape_options(
    start: float,
    duration: float | None,
    rate_scale: float,
    max_model_len: int | None,
    over_length: str,
    max_requests: int | None,
    dequantize: str | None,
    jitter_seed: int,
) -> ShapeOptions:
    """Build :class:`ShapeOptions` from CLI values, as a one-line error when they are wrong."""
    quantum: float | str | None = dequantize
    if dequantize is not None and dequantize != "auto":
        try:
            quantum = float(dequantize)
        except ValueError:
            raise TunerError(
                f"--dequantize: expected seconds or 'auto', got {dequantize!r}"
            ) from None
    try:
        return ShapeOptions(
            start_s=start,
            duration_s=duration,
            rate_scale=rate_scale,
            max_model_len=max_model_len,
            over_length=over_length,  # type: ignore[arg-type]
            max_requests=max_requests,
            dequantize_s=quantum,  # type: ignore[arg-type]
            jitter_seed=jitter_seed,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        raise TunerError(f"{_FLAGS.get(field, field)}: {first['msg']}") from None


_FLAGS = {
    "start_s": "--start",
    "duration_s": "--duration",
    "rate_scale": "--rate-scale",
    "max_model_len": "--max-model-len",
    "over_length": "--over-length",
    "max_requests": "--max-requests",
    "dequantize_s": "--dequantize",
    "jitter_seed": "--jitter-seed",
}
"""The CLI flag of each :class:`ShapeOptions` field, for error messages."""


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
        typer.echo(json.dumps(_finite(payload), indent=2))
        return
    output_console().print(render_stats(trace, stats))


def output_console() -> Console:
    """Rich console for results: a terminal's own width, or wide lines when piped (for grep)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


def _finite(value: object) -> object:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


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
