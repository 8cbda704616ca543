"""Where calibration data comes from: a real server replaying the designed workload now, or
the real trials a study already kept."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefill_tuner.calibration.calibrate import (
    Calibration,
    Observed,
    calibrate,
    hardware,
    pool_of,
    sim_config_of,
    today,
)
from prefill_tuner.calibration.refit import (
    Refit,
    machine_mismatches,
    refit_kernels,
    refuse_cpu,
)
from prefill_tuner.calibration.workload import (
    CALIBRATION_THRESHOLD_SHARE,
    burst_trace,
    closed_loop_trace,
    profiling_trace,
)
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim.cost_model import Provenance
from prefill_tuner.engines.sim.kernels.profile import KernelProfile
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.metrics import RequestRecord
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore, redact_url
from prefill_tuner.trace import load_trace
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.shaping import ShapeOptions


def as_sent(trace: Trace, records: list[RequestRecord]) -> tuple[Trace, list[RequestRecord]]:
    """``trace`` with each request arriving when the client really sent it, in that order,
    and the records in the same order: the simulator and the step rebuild then see what the
    server saw, however late the client was (a 2-core machine running client and server
    together is late by up to a second in a burst)."""
    order = sorted(range(len(records)), key=lambda index: records[index].sent_s)
    requests = tuple(
        dataclasses.replace(trace.requests[index], arrival_s=records[index].sent_s)
        for index in order
    )
    return dataclasses.replace(trace, requests=requests), [records[index] for index in order]


def read_steps(path: str | None) -> list[dict[str, Any]]:
    """A step trace (JSONL) a real trial wrote; empty when missing or unreadable."""
    if not path:
        return []
    try:
        with Path(path).open(encoding="utf-8") as stream:
            return [json.loads(line) for line in stream if line.strip()]
    except (OSError, ValueError):
        return []


def calibrate_on_server(
    engine: TrialEngine,
    settings: dict[str, Any],
    *,
    model: str,
    name: str,
    spacing: float = 1.0,
    label: str = "calibration",
) -> Calibration:
    """Start one server with ``settings`` (chunked prefill on, and a low long-prefill
    threshold: see :mod:`~prefill_tuner.calibration.workload`), replay the designed workload,
    fit a profile."""
    observed, provenance, _ = _replay_on_server(
        engine, settings, model=model, spacing=spacing, label=label
    )
    return calibrate(
        observed,
        name=name,
        provenance=provenance,
        engine_defaults=pool_of(observed[0].config),
    )


def refit_on_server(
    engine: TrialEngine,
    settings: dict[str, Any],
    profile: KernelProfile,
    *,
    model: str,
    name: str,
    spacing: float = 1.0,
    label: str = "calibration",
) -> Refit:
    """As :func:`calibrate_on_server`, but keep ``profile``'s measured kernels and refit only
    its time outside kernels (:mod:`~prefill_tuner.calibration.refit`); refused, before a
    server starts, on vLLM's CPU build."""
    refuse_cpu(profile, engine.version)
    observed, provenance, resolved = _replay_on_server(
        engine, settings, model=model, spacing=spacing, label=label
    )
    return refit_kernels(
        observed,
        profile,
        name=name,
        provenance=provenance,
        warnings=machine_mismatches(profile, resolved, provenance.hardware),
    )


def _replay_on_server(
    engine: TrialEngine, settings: dict[str, Any], *, model: str, spacing: float, label: str
) -> tuple[list[Observed], Provenance, dict[str, Any]]:
    """The designed workload replayed on one server (:mod:`~prefill_tuner.calibration.workload`:
    phases 1-4 with a low long-prefill threshold, then phases 5 and 6, each a replay of its
    own with the server's own chunking, which a server with live knobs takes without a
    restart): what it saw, what the calibration is fitted to, and the server's resolved
    config."""
    budget = int(settings.get("max_num_batched_tokens") or 2048)
    designed = {
        **settings,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": max(16, budget // CALIBRATION_THRESHOLD_SHARE),
    }
    max_model_len = int(engine.max_model_len(designed))  # --set max_model_len, if given
    max_num_seqs = int(settings.get("max_num_seqs") or 256)
    trace = profiling_trace(max_model_len=max_model_len, max_num_seqs=max_num_seqs, spacing=spacing)
    first, resolved = _replay(engine, trace, designed, label=label, words="the designed workload")
    config = first.config
    limits = {
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_model_len": max_model_len,
        "max_num_seqs": config.max_num_seqs,
    }
    own = {**settings, "enable_chunked_prefill": True}  # the server's own chunking
    bursts = burst_trace(**limits, spacing=spacing)
    second, _ = _replay(engine, bursts, own, label=f"{label}-bursts", words="prompt bursts")
    loop, concurrency = closed_loop_trace(**limits)
    third, _ = _replay(
        engine,
        loop,
        own,
        label=f"{label}-closed-loop",
        words=f"a closed loop at {concurrency}",
        max_concurrency=concurrency,
    )
    provenance = Provenance(
        kind="calibrated",
        method="vLLM's per-step log of the designed workload",
        vllm_version=engine.version,
        model=model,
        hardware=hardware(),
        date=today(),
        workload=(
            f"designed: {len(trace.requests)} requests (prefill sweep to {max_model_len} "
            f"tokens, decode bursts to {config.max_num_seqs}, long prompts among streams, "
            f"long-context decodes); budget {config.max_num_batched_tokens}, long-prefill "
            f"threshold {config.long_prefill_token_threshold}; then {len(bursts.requests)} in "
            f"prompt bursts and {len(loop.requests)} in a closed loop at {concurrency}, with "
            "the server's own chunking"
        ),
    )
    return [first, second, third], provenance, resolved


def _replay(
    engine: TrialEngine,
    trace: Trace,
    settings: dict[str, Any],
    *,
    label: str,
    words: str,
    max_concurrency: int | None = None,
) -> tuple[Observed, dict[str, Any]]:
    """One replay of the calibration on the server (``words``: what it is), as sent (a closed
    loop's sends are its arrivals then), and the config the server resolved."""
    run = engine.run(trace, settings, label=label, max_concurrency=max_concurrency)
    if run.failure or run.records is None:
        raise TunerError(f"the calibration run failed: {run.failure or 'no request records'}")
    steps = read_steps((run.details.get("server_steps") or {}).get("trace"))
    sent, records = as_sent(trace, run.records)
    observed = Observed(
        trace=sent,
        steps=steps,
        config=sim_config_of(run.resolved_config),
        records=records,
        label=words,
        client_limit=max_concurrency,
    )
    return observed, run.resolved_config


def calibrate_from_study(
    store: TunerStore,
    study: str,
    *,
    name: str,
    on_start: Callable[[str], None] | None = None,
) -> Calibration:
    """Fit a profile to the step logs the real trials of ``study`` kept (every completed
    trial whose step trace is still on disk); the front end is fitted to their stored TTFT
    percentiles (stored trials keep no per-request token times)."""
    trials = _study_trials(store, study)
    if on_start is not None:
        on_start(
            f"fitting to the step logs of {len(trials.observed)} real trials of study {study}…"
        )
    return calibrate(
        trials.observed,
        name=name,
        provenance=trials.provenance,
        engine_defaults=pool_of(trials.observed[0].config),
    )


def refit_from_study(
    store: TunerStore,
    study: str,
    profile: KernelProfile,
    *,
    name: str,
    on_start: Callable[[str], None] | None = None,
) -> Refit:
    """As :func:`calibrate_from_study`, but keep ``profile``'s measured kernels and refit only
    its time outside kernels (:mod:`~prefill_tuner.calibration.refit`); refused when a trial
    ran on vLLM's CPU build."""
    trials = _study_trials(store, study)
    for version in trials.versions:
        refuse_cpu(profile, version)
    warnings = dict.fromkeys(
        line for resolved in trials.resolved for line in machine_mismatches(profile, resolved)
    )
    if on_start is not None:
        on_start(
            f"refitting {profile.name}'s time outside kernels to the step logs of "
            f"{len(trials.observed)} real trials of study {study}…"
        )
    return refit_kernels(
        trials.observed, profile, name=name, provenance=trials.provenance, warnings=list(warnings)
    )


@dataclasses.dataclass(frozen=True)
class _StudyTrials:
    """What a study's real trials kept: their replays, what a calibration is fitted to, their
    engine versions and resolved configs."""

    observed: list[Observed]
    provenance: Provenance
    versions: list[str]
    resolved: list[dict[str, Any]]


def _study_trials(store: TunerStore, study: str) -> _StudyTrials:
    record = store.get_study(study)
    if record is None:
        raise TunerError(f"`from_study` {study}: no such study in {redact_url(store.url)}")
    if record.engine != "vllm":
        raise TunerError(
            f"`from_study` {study}: its trials ran on the {record.engine} engine; calibration "
            "needs real vLLM trials (tune run --engine vllm)"
        )
    trace = _study_trace(record)
    limit = ShapeOptions.model_validate(record.shaping).max_concurrency
    observed: list[Observed] = []
    versions: set[str] = set()
    resolved: list[dict[str, Any]] = []
    missing = 0
    for trial in store.trials(record):
        metrics = trial.metrics or {}
        steps = read_steps(((metrics.get("details") or {}).get("server_steps") or {}).get("trace"))
        if (
            trial.status != "complete"
            or not steps
            or (metrics.get("details") or {}).get("cut_short")
        ):
            missing += trial.status == "complete" and not steps
            continue
        try:
            config = sim_config_of(trial.resolved_config)
        except TunerError:
            continue
        observed.append(
            Observed(
                trace=trace,
                steps=steps,
                config=config,
                ttft_s=metrics.get("ttft_s"),
                max_concurrency=limit,
            )
        )
        versions.add(trial.engine_version.version)
        resolved.append(trial.resolved_config)
    if not observed:
        raise TunerError(
            f"`from_study` {study}: no completed real trial with its step trace on disk"
            + (f" ({missing} trials' step traces are gone)" if missing else "")
        )
    provenance = Provenance(
        kind="calibrated",
        method=f"vLLM's per-step logs of {len(observed)} trials of study {study}",
        vllm_version=", ".join(sorted(versions)),
        model=record.model,
        # Not this machine's: the trials' servers may have run anywhere (workers).
        hardware=None,
        date=today(),
        workload=f"study {study}'s trace ({Path(record.trace_path).name}, "
        f"{len(trace.requests)} requests)",
    )
    return _StudyTrials(observed, provenance, sorted(versions), resolved)


def _study_trace(record: StudyRecord) -> Trace:
    """The study's trace as its trials replayed it (the file must be unchanged)."""
    path = record.trace_path
    if not path or not Path(path).is_file():
        raise TunerError(
            f"`from_study` {record.name}: its trace {path or '(none recorded)'} is not on disk"
        )
    definition = record.definition or {}
    trace = load_trace(
        path,
        record.trace_format or None,
        sort=bool(definition.get("sort", False)),
        options=ShapeOptions(**record.shaping),
    )
    if trace.source is not None and trace.source.sha256 != record.trace_sha256:
        raise TunerError(
            f"`from_study` {record.name}: {path} changed since the study ran (sha256 "
            f"{record.trace_sha256[:12]}… then, {trace.source.sha256[:12]}… now)"
        )
    return trace
