"""Check the simulator against vLLM's own scheduler, step for step (the harness of
tests/test_sim_vs_vllm.py).

Builds the same requests for both (prompt token ids derived from the trace's prefix blocks, so
prefix hits match), runs ``tests/support/vllm_reference.py`` in a Python that has
vLLM, and compares every step's tokens per request, preemptions and finishes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import ConstantProfile
from prefill_tuner.engines.sim.loop import StepRecord, simulate
from prefill_tuner.engines.vllm_python import run_vllm_script
from prefill_tuner.errors import TunerError
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.tokens import prompt_token_ids

REFERENCE_SCRIPT = Path(__file__).with_name("vllm_reference.py")
TOKEN_LOW, TOKEN_HIGH = 16, 4096
"""Token ids the reference model (vocabulary 4,096) accepts, clear of its special ids."""
ONE_SECOND_STEPS = ConstantProfile(name="1s", step_ms=1000.0)


def scenario(name: str, trace: Trace, config: SimConfig) -> dict[str, object]:
    """The reference driver's input for one scenario."""
    return {
        "name": name,
        "config": config.model_dump(),
        "requests": [
            {
                "id": request.id,
                "arrival_s": request.arrival_s,
                "prompt_token_ids": prompt_token_ids(request, low=TOKEN_LOW, high=TOKEN_HIGH),
                "max_tokens": request.output_tokens,
                # Distinct per request, as a real model's outputs would be.
                "output_token_ids": [TOKEN_LOW + (index * 7 + k) % 97 for k in range(5)],
            }
            for index, request in enumerate(trace.requests)
        ],
    }


def simulated_steps(trace: Trace, config: SimConfig) -> dict[str, object]:
    """The simulator's schedule in the reference driver's output format."""
    steps: list[StepRecord] = []
    result = simulate(trace, config, ONE_SECOND_STEPS, on_step=steps.append)
    return {
        "steps": [
            {
                "start_s": round(step.start_s, 6),
                "scheduled": step.scheduled,
                "preempted": sorted(step.preempted),
                "finished": sorted(step.finished),
            }
            for step in steps
        ],
        "stalled": result.stalled is not None,
    }


def run_reference(
    vllm_python: str | Path, scenarios: list[dict[str, object]], timeout_s: float = 900
) -> list[dict[str, object]]:
    """Run the scenarios through vLLM's scheduler in ``vllm_python``."""
    completed = run_vllm_script(
        vllm_python,
        REFERENCE_SCRIPT,
        stdin=json.dumps({"scenarios": scenarios}),
        timeout_s=timeout_s,
    )
    if completed.returncode != 0:
        tail = completed.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise TunerError(f"vLLM's scheduler driver failed (exit {completed.returncode}): {tail[0]}")
    schedules = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    for schedule in schedules:  # times to the microsecond, as the simulator's are compared
        for step in schedule["steps"]:
            step["start_s"] = round(step["start_s"], 6)
    return schedules


@dataclass(frozen=True)
class Mismatch:
    """The first step where the simulator and vLLM disagree."""

    scenario: str
    step: int
    simulator: object
    vllm: object

    def __str__(self) -> str:
        return (
            f"{self.scenario}: step {self.step}: simulator {self.simulator!r} vs vLLM {self.vllm!r}"
        )


def first_mismatch(name: str, simulated: dict, reference: dict) -> Mismatch | None:
    """Compare two schedules; ``None`` when identical."""
    sim_steps, ref_steps = simulated["steps"], reference["steps"]
    for index, (ours, theirs) in enumerate(zip(sim_steps, ref_steps, strict=False)):
        if ours != theirs:
            return Mismatch(name, index, ours, theirs)
    if len(sim_steps) != len(ref_steps):
        return Mismatch(
            name,
            min(len(sim_steps), len(ref_steps)),
            f"{len(sim_steps)} steps",
            f"{len(ref_steps)} steps",
        )
    if simulated["stalled"] != reference["stalled"]:
        return Mismatch(
            name,
            len(sim_steps),
            f"stalled={simulated['stalled']}",
            f"stalled={reference['stalled']}",
        )
    return None
