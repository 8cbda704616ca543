"""Traces: reading public formats, shaping, synthetic workloads, statistics, native writing."""

from prefill_tuner.trace.model import Adjustment, Request, Trace, TraceSource
from prefill_tuner.trace.readers import FORMAT_ALIASES, detect_format, read_trace
from prefill_tuner.trace.shaping import ShapeOptions, shape

__all__ = [
    "FORMAT_ALIASES",
    "Adjustment",
    "Request",
    "ShapeOptions",
    "Trace",
    "TraceSource",
    "detect_format",
    "read_trace",
    "shape",
]


def load_trace(
    path: str, format: str | None = None, *, sort: bool = False, options: ShapeOptions | None = None
) -> Trace:
    """Read a trace file and shape it: what every command that replays a trace starts with.

    A closed-loop replay (``options.max_concurrency``) may read a file without arrival times."""
    closed_loop = options is not None and options.max_concurrency is not None
    trace = read_trace(path, format, sort=sort, closed_loop=closed_loop)
    return shape(trace, options) if options is not None else trace


__all__ += ["load_trace"]
