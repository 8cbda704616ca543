"""Options and output helpers shared by the commands that read traces."""

from __future__ import annotations

import math
from types import FrameType
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from tuner.errors import TunerError
from tuner.trace import ShapeOptions

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


def output_console() -> Console:
    """Rich console for results: a terminal's own width, or wide lines when piped (for grep)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


def json_safe(value: object) -> object:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    return value


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler (a stopped container or service): stop as on Ctrl-C, so the running
    trial's server is stopped and finished trials are kept."""
    raise KeyboardInterrupt
