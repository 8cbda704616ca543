"""The simulator as a trial engine for the study."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import weakref
from typing import Any

from pydantic import ValidationError

from prefill_tuner.engines.base import EngineRun
from prefill_tuner.engines.sim.config import SIM_FIELDS, SimConfig, resolve_config
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.loop import SIMULATOR_VERSION, SimResult, simulate
from prefill_tuner.engines.sim.replicas import simulate_replicas
from prefill_tuner.engines.sim.waves import lockstep
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import EngineCapabilities
from prefill_tuner.trace.model import Trace

KEPT_RUNS = 256
"""Runs a simulator engine remembers (each a summary: metrics and details, a few KB)."""


def profile_words(profile: StepModel) -> str:
    """A profile as an engine's version names it: its name and a digest of what it holds, so
    that a study resumed with a profile file whose content changed is told apart (one study
    must not mix two simulators)."""
    content = json.dumps(profile.model_dump(mode="json"), sort_keys=True, default=str)
    return f"{profile.name} (sha256 {hashlib.sha256(content.encode()).hexdigest()[:12]})"


@dataclasses.dataclass(frozen=True)
class _Kept:
    """A run the engine made, and what else it stands for."""

    trace: weakref.ref[Trace]
    """The trace it replayed, not kept alive (a study's many scaled traces would be): an
    object's id is its identity only while the object lives."""
    max_concurrency: int | None
    max_num_seqs: int
    peak_running: int
    run: EngineRun


class SimEngine:
    """Runs trials on the simulated vLLM V1 scheduler with a step-time profile.

    It remembers its runs: a run whose settings differ from an earlier one's (on the same
    trace object, under the same client limit) only in ``max_num_seqs``, where neither limit
    is reached by the most requests the earlier run ever had running, is that run (the limit
    refused no admission in it, and would refuse none with the other value): its metrics are
    returned without simulating again. The headroom checks' ``max_num_seqs`` neighbours, and
    trials that differ from another only there, are most often such runs.
    """

    name = "sim"
    server_args: tuple[str, ...] = ()
    deterministic = True
    """The same trace and settings always give the same run."""
    starts_servers = False
    live_knobs: tuple[str, ...] = ()

    def __init__(self, profile: StepModel) -> None:
        self.profile = profile
        self.version = f"{SIMULATOR_VERSION}; profile {profile_words(profile)}"
        self.capabilities = EngineCapabilities(engine="sim", version=self.version)
        self.about: tuple[str, ...] = (f"profile {profile.name}: {profile.provenance.summary()}",)
        self.server_args = profile.serve_args  # the machine's flags in every serve line
        self._kept: dict[tuple[int, str], list[_Kept]] = {}
        """(the trace's id, every setting but ``max_num_seqs``) → the runs made with them."""

    def close(self) -> None:
        """Nothing to stop: the simulator runs in this process, only during a run."""

    def base_settings(self, fixed: dict[str, Any]) -> dict[str, Any]:
        """The profile's hardware defaults under the user's fixed settings, checked."""
        unknown = [name for name in fixed if name not in SimConfig.model_fields]
        if unknown:
            raise TunerError(
                f"`fixed` {unknown[0]}: not a setting of the simulated engine; settings: "
                f"{', '.join(SimConfig.model_fields)}"
            )
        return {**self.profile.engine_defaults, **fixed}

    def validate_fixed(self, fixed: dict[str, Any]) -> dict[str, Any]:
        """Check ``--set`` values with the model every trial's config is built with
        (:class:`SimConfig`, as ``tune simulate`` does): each value on its own, then together
        once repaired as every trial is (:func:`effective_settings`). Returns them as the
        model reads them (``enable_chunked_prefill=0``: ``False``)."""
        self.base_settings(fixed)
        try:
            fields = SIM_FIELDS.model_validate(fixed)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0])
            message = str(first["msg"]).removeprefix("Value error, ")
            raise TunerError(f"`fixed` {name}={fixed.get(name)}: {message}") from None
        checked = {name: getattr(fields, name) for name in fixed}
        values = SimConfig.model_construct(**{**self.profile.engine_defaults, **checked})
        everything = values.model_dump(warnings=False)
        repaired, _ = effective_settings(everything, {}, int(everything["max_model_len"]))
        resolve_config(self.profile, repaired)
        return checked

    def default_settings(self) -> dict[str, Any]:
        defaults = SimConfig.model_validate(self.profile.engine_defaults).model_dump()
        return {name: defaults[name] for name in KNOBS if name in defaults}

    def max_model_len(self, fixed: dict[str, Any]) -> int:
        values = self.base_settings(fixed)
        return int(values.get("max_model_len", SimConfig.model_fields["max_model_len"].default))

    def run(
        self,
        trace: Trace,
        settings: dict[str, Any],
        early_abort: EarlyAbortRule | None = None,
        *,
        label: str | None = None,
        max_concurrency: int | None = None,
    ) -> EngineRun:
        """Simulate the whole trace: ``early_abort`` is not used (a simulated run costs less
        than watching it would save)."""
        config = self._config(settings)
        if isinstance(config, EngineRun):
            return config
        key = (id(trace), config.model_dump_json(exclude={"max_num_seqs"}))
        same = self._same_run(key, trace, config, max_concurrency)
        if same is not None:
            return same
        result = simulate(trace, config, self.profile, max_concurrency=max_concurrency)
        run = self._engine_run(config, result, trace)
        for gone in [k for k, runs in self._kept.items() if runs[0].trace() is None]:
            del self._kept[gone]  # their trace is gone: nobody can ask for them again
        if sum(map(len, self._kept.values())) >= KEPT_RUNS:
            del self._kept[next(iter(self._kept))]  # the settings kept longest
        kept = _Kept(
            weakref.ref(trace), max_concurrency, config.max_num_seqs, result.peak_running, run
        )
        self._kept.setdefault(key, []).append(kept)
        return run

    def _same_run(
        self,
        key: tuple[int, str],
        trace: Trace,
        config: SimConfig,
        max_concurrency: int | None,
    ) -> EngineRun | None:
        """A copy of a remembered run that is this one (see the class), with this one's
        config; ``None`` when there is none."""
        for kept in self._kept.get(key, []):
            if kept.trace() is not trace or kept.max_concurrency != max_concurrency:
                continue
            limits = min(kept.max_num_seqs, config.max_num_seqs)
            if kept.peak_running < limits or kept.max_num_seqs == config.max_num_seqs:
                return dataclasses.replace(
                    kept.run,
                    metrics=copy.deepcopy(kept.run.metrics),
                    resolved_config={**config.model_dump(), "profile": self.profile.model_dump()},
                    details=dict(kept.run.details),  # (wall_s: what simulating it took)
                )
        return None

    def _config(self, settings: dict[str, Any]) -> SimConfig | EngineRun:
        """The run's config, or the failed run of a config the engine rejects."""
        values = {**self.profile.engine_defaults, **settings}
        try:
            return SimConfig(**values)
        except ValidationError as exc:
            message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            return EngineRun(None, values, self.version, failure=f"config rejected: {message}")

    def _engine_run(self, config: SimConfig, result: SimResult, trace: Trace) -> EngineRun:
        """The trial's run; its details name the lockstep waves it ran in, if it did
        (``lockstep_waves``: how many requests were admitted at a time; see
        :func:`~prefill_tuner.engines.sim.waves.lockstep`)."""
        run = EngineRun(
            metrics=result.metrics,
            resolved_config={**config.model_dump(), "profile": self.profile.model_dump()},
            version=self.version,
            failure=f"stalled: {result.stalled}" if result.stalled else None,
            details={
                "steps": result.steps,
                "preemptions": result.preemptions,
                "peak_kv_usage": result.peak_kv_usage,
                "prefix_cache_hits": result.prefix_cache_hits,
                "prefix_cache_queries": result.prefix_cache_queries,
                "wall_s": result.wall_s,
            },
        )
        waves = lockstep(trace, result.max_concurrency, result.admitted_together)
        if waves is not None:
            run.details["lockstep_waves"] = round(waves.together, 2)
        return run


class ReplicatedSimEngine(SimEngine):
    """Runs trials on ``replicas`` copies of the simulated engine behind a router
    (:mod:`~prefill_tuner.engines.sim.replicas`); every replica gets the trial's settings."""

    def __init__(self, profile: StepModel, *, replicas: int, router: str) -> None:
        super().__init__(profile)
        self.replicas = replicas
        self.router = router
        self.version = (
            f"{SIMULATOR_VERSION}; profile {profile_words(profile)}; {replicas} replica"
            f"{'s' if replicas != 1 else ''} behind a {router} router"
        )
        self.capabilities = EngineCapabilities(engine="sim", version=self.version)

    def run(
        self,
        trace: Trace,
        settings: dict[str, Any],
        early_abort: EarlyAbortRule | None = None,
        *,
        label: str | None = None,
        max_concurrency: int | None = None,
    ) -> EngineRun:
        """Simulate the whole trace on every replica (``early_abort`` is not used); a client
        limit holds over all of them."""
        config = self._config(settings)
        if isinstance(config, EngineRun):
            return config
        replicated = simulate_replicas(
            trace,
            config,
            self.profile,
            replicas=self.replicas,
            router=self.router,
            max_concurrency=max_concurrency,
        )
        run = self._engine_run(config, replicated.result, trace)
        # the deployment is part of what the run used (diagnosis rebuilds a replica's run)
        run.resolved_config.update(replicas=self.replicas, router=self.router)
        run.details["replicas"] = [
            {**stats.as_dict(), "utilisation": share}
            for stats, share in zip(replicated.replicas, replicated.utilisation(), strict=True)
        ]
        return run
