"""A run as the detectors read it, from whichever engine produced it.

The simulator says everything (each step's requests and their tokens, its queues, KV use,
preemptions); a real server's per-step log says each step's duration, prefill and decode
tokens and requests, and KV use, but neither its queue nor which request got which tokens;
request records say when each request was sent and got its first token. A detector uses what
the run has and says what it could not check.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.loop import StepRecord, simulate
from prefill_tuner.engines.timeline import Step, real_steps, sim_step
from prefill_tuner.errors import TunerError
from prefill_tuner.files import read_input, why_unreadable
from prefill_tuner.objectives.metrics import RequestRecord
from prefill_tuner.objectives.slo import Slo
from prefill_tuner.trace.model import Trace

StepView = Step
"""One engine step (:class:`prefill_tuner.engines.timeline.Step`: the same record the report's
timeline reads)."""


@dataclass(frozen=True)
class RequestView:
    id: str
    prompt_tokens: int
    sent_s: float
    ttft_s: float | None
    """``None``: it never got a first token."""


@dataclass(frozen=True)
class Measured:
    """One of the study's SLOs and the run's value of its statistic: what a finding is judged
    against (what the users felt, not only what the steps look like)."""

    slo: Slo
    value_s: float
    """The run's statistic, in seconds; NaN: not measured (a class that finished nothing)."""

    @property
    def met(self) -> bool:
        return self.value_s == self.value_s and self.value_s <= self.slo.limit_s


@dataclass(frozen=True)
class RunView:
    """What a run did, and the scheduler settings it ran with."""

    steps: list[StepView]
    requests: list[RequestView]
    settings: dict[str, Any]
    """At least max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold,
    scheduler_reserve_full_isl and enable_chunked_prefill (as the run resolved them)."""
    source: str
    """Where it came from, said with every finding."""
    notes: list[str] = field(default_factory=list)
    """What the source lacks (e.g. a real log has no queue lengths)."""
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    """The requests' own records, where the run kept them (a simulation does): with the
    steps, what the report's timeline is built from."""
    share: Trace | None = field(default=None, repr=False)
    """The requests the run served when they are not the study's whole trace (one replica's
    share of a ``tune plan`` trial); ``records`` are theirs, in this order."""
    slos: tuple[Measured, ...] = ()
    """The study's SLOs with the run's measured statistics (a stored trial's); empty: the run
    has no SLOs to be judged against (``tune diagnose --trace`` or ``--steps``)."""

    @property
    def budget(self) -> int:
        return int(self.settings["max_num_batched_tokens"])

    @property
    def max_num_seqs(self) -> int:
        return int(self.settings["max_num_seqs"])


def _requests(trace: Trace, records: Sequence[RequestRecord]) -> list[RequestView]:
    return [
        RequestView(
            id=record.id,
            prompt_tokens=request.prompt_tokens,
            sent_s=record.sent_s,
            ttft_s=(
                float(record.token_times_s[0]) - record.sent_s
                if len(record.token_times_s)
                else None
            ),
        )
        for request, record in zip(trace.requests, records, strict=True)
    ]


def simulated_view(
    trace: Trace, config: SimConfig, profile: StepModel, *, max_concurrency: int | None = None
) -> RunView:
    """Simulate ``trace`` with ``config`` (under the client's limit, if any) and keep
    everything the detectors use, each step's prefill chunks per request included (followed
    from admissions, scheduled tokens and preemptions)."""
    prompts = {r.id: r.prompt_tokens for r in trace.requests}
    computed: dict[str, int] = {}
    steps: list[Step] = []
    usable = config.usable_blocks

    def on_step(record: StepRecord) -> None:
        chunks: dict[str, int] = {}
        # A step of decodes only (most steps) moves no prompt: nothing to follow.
        if record.prefill_tokens or record.preempted or record.admitted_cached_tokens:
            for rid in record.preempted:
                computed[rid] = 0
            for rid, cached in record.admitted_cached_tokens.items():
                computed[rid] = cached
            for rid, tokens in record.scheduled.items():
                done = computed.get(rid, 0)
                if done < prompts.get(rid, 0):
                    chunks[rid] = min(tokens, prompts[rid] - done)
                computed[rid] = done + tokens
        # Kept as a Step at once: the record's per-request dict is not needed after this.
        steps.append(sim_step(record, usable, chunks))

    result = simulate(trace, config, profile, on_step=on_step, max_concurrency=max_concurrency)
    return RunView(
        steps=steps,
        requests=_requests(trace, result.records),
        settings=config.model_dump(),
        source=f"simulated ({profile.name})",
        records=list(result.records),
    )


def logged_view(
    steps_file: Path,
    settings: dict[str, Any],
    trace: Trace | None = None,
    records: Sequence[RequestRecord] | None = None,
    started_unix_s: float | None = None,
) -> RunView:
    """A real server's steps, as its trial kept them (``LABEL.steps.jsonl``), or a
    ``tune simulate --steps-out`` file; with the run's request records when there are any.
    Given also when the replay started (Unix time), a real server's steps are placed on the
    replay's clock and each gets a waiting count from the records: requests sent and not yet
    at their first token (queued or in prefill: the log has no queue)."""
    try:
        lines = read_input(steps_file).decode("utf-8").splitlines()
        raw = [json.loads(line) for line in lines if line.strip()]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TunerError(
            f"{steps_file}: cannot read the step trace: {why_unreadable(exc)}"
        ) from None
    steps = []
    for number, line in enumerate(raw):
        try:
            steps.append(_logged_step(number, line))
        except (KeyError, TypeError, ValueError) as exc:
            raise TunerError(
                f"{steps_file}:{number + 1}: not a step record ({type(exc).__name__}: {exc})"
            ) from None
    if not steps:
        raise TunerError(f"{steps_file}: no steps in it (an empty step trace)")
    simulated = "scheduled" in raw[0]
    notes = []
    if not simulated:
        notes.append(
            "a real server's step log has no queue lengths nor per-request tokens: the "
            "admission and starvation checks use the request records where there are some"
        )
    requests = _requests(trace, records) if trace is not None and records is not None else []
    if not requests:
        notes.append("no request records: TTFT-based checks are left out")
    elif not simulated and started_unix_s is not None:
        steps = _placed(raw, steps, started_unix_s, requests)
        notes[0] = (
            "a real server's step log has no queue: waiting counts requests sent and not yet "
            "at their first token (queued or in prefill)"
        )
    return RunView(
        steps=steps,
        requests=requests,
        settings=settings,
        source=f"{'simulated' if simulated else 'server'} step trace {steps_file}",
        notes=notes,
    )


def _placed(
    raw: list[dict[str, Any]],
    steps: list[StepView],
    started_unix_s: float,
    requests: list[RequestView],
) -> list[StepView]:
    """Real steps on the replay's clock (as the report's timeline places them), each with the
    requests waiting for their first token when it started."""
    timed = real_steps(raw, started_unix_s)
    if len(timed) != len(steps):
        return steps  # lines without a time: left unplaced
    sent = np.array([r.sent_s for r in requests])
    first = np.array([r.sent_s + r.ttft_s if r.ttft_s is not None else np.inf for r in requests])
    placed = []
    for step, at in zip(steps, timed, strict=True):
        waiting = int(((sent <= at.start_s) & (first > at.start_s)).sum())
        placed.append(dataclasses.replace(step, start_s=at.start_s, waiting=waiting))
    return placed


def _logged_step(number: int, line: dict[str, Any]) -> StepView:
    if "scheduled" in line:  # tune simulate --steps-out
        return StepView(
            index=int(line["step"]),
            start_s=float(line["start_s"]),
            duration_s=float(line["duration_s"]),
            prefill_tokens=int(line["prefill_tokens"]),
            decode_tokens=int(line["decode_tokens"]),
            running=int(line["running_after"]),
            waiting=int(line["waiting_after"]),
            kv_usage=None,
            preempted=tuple(line.get("preempted") or ()),
        )
    return StepView(  # a real server's iteration log
        index=int(line.get("step", number)),
        start_s=None,
        duration_s=float(line["duration_s"]),
        prefill_tokens=int(line["prefill_tokens"]),
        decode_tokens=int(line["decode_tokens"]),
        running=int(line["prefill_requests"]) + int(line["decode_requests"]),
        waiting=None,
        kv_usage=line.get("kv_usage"),
    )
