"""Lockstep waves: the case the simulator is least sure of, said where it happens.

A closed-loop replay of identical requests (``vllm bench serve --max-concurrency N`` with
fixed lengths) runs in waves on the simulator: requests admitted together finish on the same
step, are resent together and are admitted together again, cycle after cycle, for as long as
the budget lets a whole wave prefill in one step. A real server's waves break up (by a
mechanism not yet identified: issue 42), and on the 93 real H100 runs of
``benchmarks/gpu_truth.py`` the replays that ran in such waves overstated the mean TTFT (their
TPOT stayed close). :func:`lockstep` finds such a run, so that ``tune simulate`` can say so
beside its TTFT instead of leaving a user to find out against their own benchmark
(``docs/simulator.md``, "Comparing with your own `vllm bench serve` run").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefill_tuner.trace.model import Trace

LOCKSTEP_GROUP = 4.0
"""A closed loop of identical requests runs in waves when, past its first wave, a request was
admitted together with this many on average (itself included). Replaying the 93 H100 runs
(``benchmarks/gpu_truth.py``), every replay of 1,024-token prompts admitted 6.5-8 together (a
whole wave of eight fits vLLM's 8,192-token budget) and overstated the mean TTFT; every replay
of 4,096-token prompts admitted 1.4-2 and did not (its signed median error is −19%). The 172
MiniMax-M2.5 runs on B200 replayed with fixed lengths split the same way: 4-8 at 1,024
tokens, 1 at 8,192."""

OVERSTATED = "by a median of +52%, up to +195%"
"""What the H100 runs measured for the replays this flags (``benchmarks/RESULTS.md``,
"Lockstep waves, said where they happen"; ``gpu_truth.py`` reproduces it)."""


@dataclass(frozen=True)
class Lockstep:
    """A closed-loop replay of identical requests that ran in lockstep waves."""

    together: float
    """Past the first wave, how many requests a request was admitted with, itself included
    (the mean over requests)."""
    concurrency: int

    def line(self) -> str:
        """What it means for the run's TTFT, in one line."""
        return (
            f"every request has the same lengths, and past the first wave they were admitted "
            f"{self.together:.1f} at a time in this closed loop of {self.concurrency}: lockstep "
            f"waves, finishing together and resent together. A real server breaks such waves "
            f"up: on 93 real H100 runs, replays like this overstated the mean TTFT {OVERSTATED} "
            f"(TPOT stayed close). Replay the lengths your benchmark really sent "
            f"(docs/simulator.md)"
        )


def lockstep(trace: Trace, limit: int | None, admitted_together: Sequence[int]) -> Lockstep | None:
    """The lockstep waves of a run of ``trace`` under the client limit ``limit`` (``None``:
    open loop) whose steps admitted ``admitted_together`` requests each
    (``SimResult.admitted_together``), if it ran in them: a closed loop of at least two waves
    of identical requests (the same prompt and output lengths) whose requests past the first
    wave were admitted :data:`LOCKSTEP_GROUP` or more at a time, on average over requests."""
    requests = trace.requests
    if limit is None or len(requests) < 2 * limit:
        return None
    first = requests[0]
    if any(
        r.prompt_tokens != first.prompt_tokens or r.output_tokens != first.output_tokens
        for r in requests
    ):
        return None
    later: list[int] = []
    admitted = 0
    for group in admitted_together:
        if admitted >= limit:
            later.append(group)
        admitted += group
    if not later:
        return None
    together = sum(group * group for group in later) / sum(later)
    if together < LOCKSTEP_GROUP:
        return None
    return Lockstep(together=together, concurrency=limit)
