"""``tune simulate``: replay a trace through the simulated vLLM scheduler and summarise it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from tuner.cli.options import (
    DequantizeOpt,
    DurationOpt,
    FormatOpt,
    JitterSeedOpt,
    MaxRequestsOpt,
    RateScaleOpt,
    SortOpt,
    StartOpt,
    json_safe,
    output_console,
    shape_options,
)
from tuner.engines.sim import SimConfig, SimResult, StepRecord, load_profile, simulate
from tuner.engines.sim.cost_model import RooflineProfile
from tuner.errors import TunerError
from tuner.files import atomic_text
from tuner.trace import Trace, load_trace

DEFAULT_PROFILE = "llama-3.1-8b-h100"


def _flag(name: str, help: str, **kwargs: object) -> typer.models.OptionInfo:
    return typer.Option(name, help=help, rich_help_panel="Engine (vLLM flags)", **kwargs)


def simulate_command(
    trace_file: Annotated[Path, typer.Option("--trace", help="Trace file to replay.")],
    profile: Annotated[
        str,
        typer.Option("--profile", help="Step-time profile: a shipped name or a YAML/JSON file."),
    ] = DEFAULT_PROFILE,
    max_num_batched_tokens: Annotated[
        int | None, _flag("--max-num-batched-tokens", "Token budget per step.", min=1)
    ] = None,
    max_num_seqs: Annotated[
        int | None, _flag("--max-num-seqs", "Most running requests.", min=1)
    ] = None,
    max_model_len: Annotated[int | None, _flag("--max-model-len", "Context length.", min=2)] = None,
    enable_chunked_prefill: Annotated[
        bool | None,
        _flag("--enable-chunked-prefill/--no-enable-chunked-prefill", "Chunked prefill."),
    ] = None,
    long_prefill_token_threshold: Annotated[
        int | None,
        _flag(
            "--long-prefill-token-threshold", "Per-request per-step prefill cap (0 = off).", min=0
        ),
    ] = None,
    long_prefill_token_threshold_adaptive: Annotated[
        bool | None,
        _flag(
            "--long-prefill-token-threshold-adaptive/--no-long-prefill-token-threshold-adaptive",
            "Floor the cap at budget // (running + waiting).",
        ),
    ] = None,
    scheduler_reserve_full_isl: Annotated[
        bool | None,
        _flag(
            "--scheduler-reserve-full-isl/--no-scheduler-reserve-full-isl",
            "Admit only when the whole prompt fits in free KV blocks.",
        ),
    ] = None,
    watermark: Annotated[
        float | None, _flag("--watermark", "KV share kept free at admission.")
    ] = None,
    enable_prefix_caching: Annotated[
        bool | None,
        _flag("--enable-prefix-caching/--no-enable-prefix-caching", "Prefix caching."),
    ] = None,
    block_size: Annotated[int | None, _flag("--block-size", "Tokens per KV block.", min=1)] = None,
    num_gpu_blocks: Annotated[
        int | None,
        _flag("--num-gpu-blocks", "KV blocks in the pool (as --num-gpu-blocks-override).", min=2),
    ] = None,
    kv_cache_memory_bytes: Annotated[
        int | None,
        _flag(
            "--kv-cache-memory-bytes",
            "KV pool size in bytes; blocks derived from the profile's KV bytes per token.",
            min=1,
        ),
    ] = None,
    format: FormatOpt = None,
    sort: SortOpt = False,
    start: StartOpt = 0.0,
    duration: DurationOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    max_requests: MaxRequestsOpt = None,
    over_length: Annotated[
        str | None,
        typer.Option(
            "--over-length",
            help="clip or drop requests longer than max_model_len "
            "before replay (default: send them; the engine rejects them as vLLM does).",
        ),
    ] = None,
    dequantize: DequantizeOpt = None,
    jitter_seed: JitterSeedOpt = 0,
    steps_out: Annotated[
        Path | None, typer.Option("--steps-out", help="Write every step as a JSON line here.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Replay a trace through the simulated vLLM V1 scheduler and print its latency summary."""
    engine_profile = load_profile(profile)
    flags = {
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": enable_chunked_prefill,
        "long_prefill_token_threshold": long_prefill_token_threshold,
        "long_prefill_token_threshold_adaptive": long_prefill_token_threshold_adaptive,
        "scheduler_reserve_full_isl": scheduler_reserve_full_isl,
        "watermark": watermark,
        "enable_prefix_caching": enable_prefix_caching,
        "block_size": block_size,
        "num_gpu_blocks": num_gpu_blocks,
    }
    config = engine_config(engine_profile, flags, kv_cache_memory_bytes)
    if over_length is not None and over_length not in ("clip", "drop"):
        raise TunerError(f"--over-length: expected clip or drop, got {over_length!r}")
    options = shape_options(
        start,
        duration,
        rate_scale,
        config.max_model_len if over_length else None,
        over_length or "clip",
        max_requests,
        dequantize,
        jitter_seed,
    )
    trace = load_trace(str(trace_file), format, sort=sort, options=options)
    if steps_out is None:
        result = simulate(trace, config, engine_profile)
    else:
        with atomic_text(steps_out) as stream:
            result = simulate(
                trace, config, engine_profile, on_step=lambda step: _write_step(stream, step)
            )
    if as_json:
        typer.echo(json.dumps(json_safe(result_summary(trace, result)), indent=2))
    else:
        output_console().print(render_result(trace, result))


def engine_config(
    profile: object, flags: dict[str, object], kv_cache_memory_bytes: int | None
) -> SimConfig:
    """The engine config: the user's flags over the profile's defaults over vLLM's."""
    values = dict(getattr(profile, "engine_defaults", {}))
    values.update({key: value for key, value in flags.items() if value is not None})
    if kv_cache_memory_bytes is not None:
        if flags.get("num_gpu_blocks") is not None:
            raise TunerError("give --num-gpu-blocks or --kv-cache-memory-bytes, not both")
        if not isinstance(profile, RooflineProfile):
            raise TunerError(
                "--kv-cache-memory-bytes needs a profile with kv_bytes_per_token "
                "(a roofline profile); give --num-gpu-blocks instead"
            )
        size = int(values.get("block_size", SimConfig.model_fields["block_size"].default))
        values["num_gpu_blocks"] = int(kv_cache_memory_bytes // (size * profile.kv_bytes_per_token))
    try:
        return SimConfig(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = "--" + str(first["loc"][0]).replace("_", "-") + ": " if first["loc"] else ""
        message = str(first["msg"]).removeprefix("Value error, ")
        raise TunerError(f"invalid engine config: {field}{message}") from None


def _write_step(stream: IO[str], step: StepRecord) -> None:
    stream.write(json.dumps(step.as_dict(), separators=(",", ":")) + "\n")


def result_summary(trace: Trace, result: SimResult) -> dict[str, object]:
    """Everything worth keeping from a run, JSON-ready."""
    return {
        "engine": result.engine_version,
        "profile": result.profile,
        "config": result.config.model_dump(),
        "trace": None if trace.source is None else trace.source.path,
        "adjustments": [str(note) for note in trace.adjustments],
        "metrics": result.metrics.as_dict(),
        "steps": result.steps,
        "preemptions": result.preemptions,
        "peak_kv_blocks": result.peak_kv_blocks,
        "usable_kv_blocks": result.usable_kv_blocks,
        "peak_kv_usage": result.peak_kv_usage,
        "prefix_cache_queries": result.prefix_cache_queries,
        "prefix_cache_hits": result.prefix_cache_hits,
        "stalled": result.stalled,
        "wall_s": result.wall_s,
    }


def render_result(trace: Trace, result: SimResult) -> Table:
    """The metric summary as a table."""
    metrics = result.metrics
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    config = result.config
    table.add_row("engine", f"{result.engine_version}; profile {result.profile}")
    table.add_row(
        "config",
        f"max_num_batched_tokens={config.max_num_batched_tokens} "
        f"max_num_seqs={config.max_num_seqs} chunked={config.enable_chunked_prefill} "
        f"threshold={config.long_prefill_token_threshold}"
        f"{' (adaptive)' if config.long_prefill_token_threshold_adaptive else ''} "
        f"reserve_full_isl={config.scheduler_reserve_full_isl} "
        f"blocks={config.num_gpu_blocks}x{config.block_size}",
    )
    table.add_row(
        "requests",
        f"{metrics.requests:,} ({metrics.completed:,} completed, {metrics.failed:,} failed)",
    )
    table.add_row(
        "duration",
        f"{metrics.duration_s:,.1f} s simulated; {metrics.request_throughput:.2f} req/s, "
        f"{metrics.output_throughput:,.0f} output tok/s",
    )
    latency = Table(box=None, pad_edge=False)
    latency.add_column("ms")
    for key in ("mean", "p50", "p90", "p99", "max"):
        latency.add_column(key, justify="right")
    for name, summary in (
        ("TTFT", metrics.ttft_s),
        ("TPOT", metrics.tpot_s),
        ("ITL", metrics.itl_s),
        ("E2E", metrics.e2el_s),
    ):
        latency.add_row(
            name, *(f"{summary[key] * 1000:,.1f}" for key in ("mean", "p50", "p90", "p99", "max"))
        )
    table.add_row("latency", latency)
    table.add_row(
        "engine load",
        f"{result.steps:,} steps; {result.preemptions:,} preemptions; peak KV "
        f"{result.peak_kv_usage:.1%} of {result.usable_kv_blocks:,} blocks",
    )
    if result.prefix_cache_queries:
        rate = result.prefix_cache_hits / result.prefix_cache_queries
        table.add_row(
            "prefix cache",
            f"{rate:.1%} of {result.prefix_cache_queries:,} prompt tokens looked up were hits",
        )
    if metrics.single_token_requests:
        table.add_row("note", f"{metrics.single_token_requests:,} one-token requests have no TPOT")
    for reason, count in metrics.failure_reasons.items():
        table.add_row("failed", f"{count:,}: {reason}")
    for note in trace.adjustments:
        table.add_row("note", str(note))
    table.add_row("wall time", f"{result.wall_s:.2f} s")
    return table
