"""The run of a stored trial, as the detectors read it: a simulated trial is simulated again
(the simulator is deterministic: the same steps), a real one is read from the step log its
trial kept."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any

from prefill_tuner.diagnosis.detectors import Finding, diagnose
from prefill_tuner.diagnosis.view import Measured, RunView, logged_view, simulated_view
from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import profile_from_record
from prefill_tuner.engines.sim.replicas import simulate_replicas
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.slo import parse_slos, split_name
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.study.summary import study_trace
from prefill_tuner.trace.model import Trace


def trial_view(record: StudyRecord, trial: TrialRecord, trace: Trace | None = None) -> RunView:
    """The trial's run, with the study's SLOs and the trial's measured statistics (what its
    findings are judged against); a one-line :class:`TunerError` when it cannot be rebuilt.
    ``trace``: the study's trace when the caller has loaded it already."""
    view = _trial_run(record, trial, trace)
    return dataclasses.replace(view, slos=measured_slos(record, trial))


def measured_slos(record: StudyRecord, trial: TrialRecord) -> tuple[Measured, ...]:
    """The study's SLOs, each with the trial's value of its statistic (NaN: not measured)."""
    metrics = trial.metrics or {}
    return tuple(
        Measured(slo, _statistic(metrics, slo.name)) for slo in parse_slos(list(record.slos))
    )


def _statistic(metrics: dict[str, Any], name: str) -> float:
    stat, metric, traffic_class = split_name(name)
    if traffic_class is not None:
        metrics = (metrics.get("by_class") or {}).get(traffic_class) or {}
    value = (metrics.get(f"{metric}_s") or {}).get(stat)
    return float(value) if value is not None else math.nan


def _trial_run(record: StudyRecord, trial: TrialRecord, trace: Trace | None) -> RunView:
    where = f"study {record.name}, trial {trial.trial_number}"
    if trial.status == "failed":
        raise TunerError(f"{where} failed ({trial.failure_reason}): no run to diagnose")
    resolved = trial.resolved_config
    if "profile" in resolved:
        if trace is None:
            trace, note = study_trace(record)
        if trace is None:
            raise TunerError(f"{where}: {note}")
        limit = (record.shaping or {}).get("max_concurrency")
        return _simulated_view(trace, json.dumps(resolved, sort_keys=True), limit)
    steps = (((trial.metrics or {}).get("details") or {}).get("server_steps") or {}).get("trace")
    if not steps or not Path(steps).is_file():
        raise TunerError(f"{where}: its server step log ({steps or 'none'}) is not on this machine")
    scheduler = resolved.get("scheduler_config") or {}
    settings = {**scheduler, **trial.settings}
    return logged_view(Path(steps), settings)


@functools.lru_cache(maxsize=2)
def _simulated_view(trace: Trace, resolved_json: str, max_concurrency: int | None) -> RunView:
    """A simulated trial's run, kept for the next caller: ``tune run`` diagnoses the baseline
    and its report then draws it (one simulation, not two). A trial of several replicas
    (``tune plan``) shows its busiest replica's run: the replicas are routed again, and that
    replica's share of the trace simulated alone (exactly its schedule: see
    ``engines/sim/replicas.py``), each request arriving when the client sent it (under a
    client limit, which holds over all replicas, that may be after its arrival)."""
    resolved = json.loads(resolved_json)
    config = SimConfig(**{k: v for k, v in resolved.items() if k in SimConfig.model_fields})
    profile = profile_from_record(resolved["profile"])
    replicas, router = int(resolved.get("replicas", 1)), resolved.get("router")
    if replicas <= 1 or router is None:
        return simulated_view(trace, config, profile, max_concurrency=max_concurrency)
    routed = simulate_replicas(
        trace, config, profile, replicas=replicas, router=router, max_concurrency=max_concurrency
    )
    busiest = max(range(replicas), key=lambda index: routed.replicas[index].busy_s)
    share = tuple(
        dataclasses.replace(request, arrival_s=record.sent_s)
        for request, record, replica in zip(
            trace.requests, routed.result.records, routed.assignment, strict=True
        )
        if replica == busiest
    )
    served = dataclasses.replace(trace, requests=share)
    view = simulated_view(served, config, profile)
    return dataclasses.replace(
        view,
        share=served,
        source=f"{view.source}, replica {busiest} of {replicas} behind a {router} router "
        f"(the busiest: {len(share):,} of {len(trace.requests):,} requests)",
    )


def trial_findings(record: StudyRecord, trial: TrialRecord) -> tuple[list[Finding], str | None]:
    """The trial's findings, judged against the study's SLOs (those within them last, saying
    no action is needed), or why it could not be diagnosed."""
    try:
        return diagnose(trial_view(record, trial)), None
    except TunerError as exc:
        return [], str(exc)
