"""Auto-tuner for vLLM's chunked-prefill scheduler configuration.

The public API (everything else is internal and may change)::

    from contextlib import closing
    import prefill_tuner as pt

    with closing(pt.build_engine(pt.EngineOptions())) as engine:  # the simulator
        plan = pt.build_plan(engine, pt.TraceSpec(pt.SAMPLE_TRACE), slos=["p99_tpot=50ms"],
                             storage_url="sqlite:///tune.db", trials=12)
        summary = pt.tune_study(plan, engine, pt.TunerStore(plan.storage_url))
    print(summary.recommended.serve_command)

``tune_study`` is ``tune run``: it opens (or resumes) the study, holds its run lock, records
what ``tune worker`` needs to join it, runs the trials and says why nothing met the SLOs if
nothing did; ``TuningSession`` is the same in steps.

The ``tune`` command line (:mod:`prefill_tuner.cli`) is a thin layer over these.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from prefill_tuner.version import __version__

_EXPORTS = {
    "EngineOptions": "prefill_tuner.engines.factory",
    "build_engine": "prefill_tuner.engines.factory",
    "TrialEngine": "prefill_tuner.engines.base",
    "EngineRun": "prefill_tuner.engines.base",
    "StudyPlan": "prefill_tuner.study.plan",
    "TraceSpec": "prefill_tuner.study.plan",
    "SpaceSpec": "prefill_tuner.study.plan",
    "TuningSession": "prefill_tuner.study.session",
    "tune_study": "prefill_tuner.study.session",
    "build_plan": "prefill_tuner.study.plan",
    "search_space_for": "prefill_tuner.study.plan",
    "open_study": "prefill_tuner.study.run",
    "run_study": "prefill_tuner.study.run",
    "StudyProgress": "prefill_tuner.study.run",
    "TrialResult": "prefill_tuner.study.run",
    "verdict_of": "prefill_tuner.study.evaluation",
    "capacity_search": "prefill_tuner.study.evaluation",
    "StudySummary": "prefill_tuner.study.summary",
    "summarize_stored": "prefill_tuner.study.summary",
    "export": "prefill_tuner.study.summary",
    "TunerStore": "prefill_tuner.storage.store",
    "Trace": "prefill_tuner.trace",
    "ShapeOptions": "prefill_tuner.trace",
    "load_trace": "prefill_tuner.trace",
    "Slo": "prefill_tuner.objectives.slo",
    "parse_slos": "prefill_tuner.objectives.slo",
    "SimConfig": "prefill_tuner.engines.sim",
    "simulate": "prefill_tuner.engines.sim",
    "simulate_replicas": "prefill_tuner.engines.sim.replicas",
    "ReplicaPlan": "prefill_tuner.study.replica_count",
    "plan_replicas": "prefill_tuner.study.replica_count",
    "latency_floor": "prefill_tuner.study.infeasibility",
    "load_profile": "prefill_tuner.engines.sim",
    "TunerError": "prefill_tuner.errors",
    "SAMPLE_TRACE": "prefill_tuner.defaults",
    "Calibration": "prefill_tuner.calibration.calibrate",
    "calibrate_on_server": "prefill_tuner.calibration.observations",
    "calibrate_from_study": "prefill_tuner.calibration.observations",
}

__all__ = [
    "SAMPLE_TRACE",
    "Calibration",
    "EngineOptions",
    "EngineRun",
    "ReplicaPlan",
    "ShapeOptions",
    "SimConfig",
    "Slo",
    "SpaceSpec",
    "StudyPlan",
    "StudyProgress",
    "StudySummary",
    "Trace",
    "TraceSpec",
    "TrialEngine",
    "TrialResult",
    "TunerError",
    "TunerStore",
    "TuningSession",
    "__version__",
    "build_engine",
    "build_plan",
    "calibrate_from_study",
    "calibrate_on_server",
    "capacity_search",
    "export",
    "latency_floor",
    "load_profile",
    "load_trace",
    "open_study",
    "parse_slos",
    "plan_replicas",
    "run_study",
    "search_space_for",
    "simulate",
    "simulate_replicas",
    "summarize_stored",
    "tune_study",
    "verdict_of",
]


def __getattr__(name: str) -> Any:
    """Import on first use, so ``import prefill_tuner`` stays cheap (a worker's scripts, the
    CLI's ``--version``)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prefill_tuner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from prefill_tuner.calibration.calibrate import Calibration
    from prefill_tuner.calibration.observations import calibrate_from_study, calibrate_on_server
    from prefill_tuner.defaults import SAMPLE_TRACE
    from prefill_tuner.engines.base import EngineRun, TrialEngine
    from prefill_tuner.engines.factory import EngineOptions, build_engine
    from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
    from prefill_tuner.engines.sim.replicas import simulate_replicas
    from prefill_tuner.errors import TunerError
    from prefill_tuner.objectives.slo import Slo, parse_slos
    from prefill_tuner.storage.store import TunerStore
    from prefill_tuner.study.evaluation import capacity_search, verdict_of
    from prefill_tuner.study.infeasibility import latency_floor
    from prefill_tuner.study.plan import (
        SpaceSpec,
        StudyPlan,
        TraceSpec,
        build_plan,
        search_space_for,
    )
    from prefill_tuner.study.replica_count import ReplicaPlan, plan_replicas
    from prefill_tuner.study.run import StudyProgress, TrialResult, open_study, run_study
    from prefill_tuner.study.session import TuningSession, tune_study
    from prefill_tuner.study.summary import StudySummary, export, summarize_stored
    from prefill_tuner.trace import ShapeOptions, Trace, load_trace
