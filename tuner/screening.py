"""Screen on the calibrated simulator, confirm on the real server.

A real trial costs a server start and a full replay; a simulated one costs a second. So a
real-engine study with screening (``tune run --engine vllm --screen N``) runs:

1. the baseline (the engine's defaults) on the real server, replayed to the end even when it
   misses the SLOs (early abort would leave too little of its step log to fit);
2. a calibration of the simulator to the real trials so far (their per-step logs, as
   ``tune calibrate --from-study`` fits them), unless the user gave a profile;
3. a simulated study of N trials on the same trace, SLOs and space, with the real server's
   own config (its defaults, ``max_model_len`` and KV pool) as the simulator's defaults; it is
   kept in the same storage as ``NAME-screen``, never mixed with the real trials;
4. real trials of its Pareto-optimal settings, the recommended one first, then the others in
   an order that spreads over the front (farthest from those already chosen first); after each
   real trial the profile is fitted again and a candidate it now predicts to miss the SLOs
   goes to the back;
5. once the candidates are spent, the study's own sampler on real trials.

Every real trial stores what the simulator predicted for it (``details.predicted``) beside
what was measured; the result is computed from the real trials alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from prefill_tuner.calibration.calibrate import sim_config_of
from prefill_tuner.calibration.sources import calibrate_from_study
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim.adapter import SimEngine
from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.errors import TunerError
from prefill_tuner.evaluation import objective_value, verdict_of
from prefill_tuner.plan import StudyPlan, screen_study_name
from prefill_tuner.report import summarize_stored
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study import (
    StudyProgress,
    TrialObjective,
    open_study,
    prepare_run,
    run_study,
)


@dataclass(frozen=True)
class Candidate:
    """A simulated Pareto-optimal setting, waiting for its real trial."""

    params: dict[str, Any]
    """The study's parameters for it (what the real study is asked to run)."""
    settings: dict[str, Any]
    """The engine settings they give."""
    screened_trial: int
    """Its trial number in the simulated study."""


def server_config(store: TunerStore, record: StudyRecord) -> SimConfig:
    """The real server's config as the simulator takes it, from the baseline trial (its
    resolved config and the KV pool the running server reported)."""
    for trial in store.trials(record):
        if trial.is_baseline and trial.status == "complete":
            return sim_config_of(trial.resolved_config)
    raise TunerError(
        f"study {record.name}: screening needs its baseline trial to have run on the real server"
    )


def calibrated_profile(store: TunerStore, plan: StudyPlan) -> StepModel:
    """A profile fitted to every real trial of the study so far."""
    return calibrate_from_study(store, plan.name, name=f"{plan.name}-calibrated").profile


def simulated_plan(plan: StudyPlan, trials: int) -> StudyPlan:
    """The simulated study's plan: the same trace, SLOs and space, its own name and size."""
    return dataclasses.replace(
        plan, name=screen_study_name(plan.name), trials=trials, early_abort=False, timeout_s=None
    )


def sim_engine(profile: StepModel, base: SimConfig) -> SimEngine:
    """The simulator standing in for the real server: its config as the defaults."""
    defaults = base.model_dump()
    return SimEngine(profile.model_copy(update={"engine_defaults": defaults}))


def predict(
    profile: StepModel, plan: StudyPlan, settings: dict[str, Any], base: SimConfig
) -> dict[str, Any]:
    """Simulated metrics and SLO verdict for ``settings`` on the real server's config."""
    engine = sim_engine(profile, base)
    run = engine.run(plan.trace, settings)
    if run.metrics is None or run.failure:
        return {"failure": run.failure or "no metrics", "profile": profile.name}
    return {
        "objectives": {o.name: objective_value(run, o.name) for o in plan.objectives},
        "feasible": verdict_of(run, plan.slos, plan.error_budget).feasible,
        "profile": profile.name,
    }


def candidates_of(store: TunerStore, simulated: str) -> list[Candidate]:
    """The Pareto-optimal settings of the simulated study ``simulated``, in the order real
    trials should try them: the recommended one first, then each time the one farthest (in
    log objective space) from those already chosen; with no feasible setting, the closest
    ones."""
    summary = summarize_stored(store, simulated)
    front = list(summary.pareto) or list(summary.closest)
    if not front:
        return []
    first = summary.recommended or front[0]
    ordered = [first, *_spread([t for t in front if t is not first], [first], summary.objectives)]
    return [
        Candidate(params=dict(t.params), settings=dict(t.settings), screened_trial=t.trial_number)
        for t in ordered
    ]


def _spread(
    rest: list[TrialRecord], chosen: list[TrialRecord], objectives: Sequence[str]
) -> list[TrialRecord]:
    """Farthest-point order of ``rest`` from ``chosen`` (log-scaled objectives)."""

    def point(trial: TrialRecord) -> list[float]:
        values = [trial.objectives.get(name) for name in objectives]
        return [math.log(v) if v and v > 0 and math.isfinite(v) else 0.0 for v in values]

    chosen_points = [point(t) for t in chosen]
    remaining = list(rest)
    ordered: list[TrialRecord] = []
    while remaining:
        best = max(
            remaining,
            key=lambda t: min(math.dist(point(t), c) for c in chosen_points),
        )
        remaining.remove(best)
        ordered.append(best)
        chosen_points.append(point(best))
    return ordered


def rerank(
    candidates: list[Candidate], profile: StepModel, plan: StudyPlan, base: SimConfig
) -> list[Candidate]:
    """Keep the spread order, but move the candidates ``profile`` now predicts to miss the
    SLOs (or to fail) to the back."""
    verdicts = [
        (bool(predict(profile, plan, c.settings, base).get("feasible")), c) for c in candidates
    ]
    return [c for ok, c in verdicts if ok] + [c for ok, c in verdicts if not ok]


def already_run(study: optuna.Study, candidate: Candidate) -> bool:
    """Whether the real study has run (or queued) these parameters."""
    return any(
        trial.params == candidate.params
        for trial in study.get_trials(deepcopy=False)
        if trial.state != optuna.trial.TrialState.FAIL
    )


def run_screened_study(
    plan: StudyPlan,
    engine: TrialEngine,
    store: TunerStore,
    opened: tuple[optuna.Study, StudyRecord],
    *,
    screen_trials: int,
    profile: StepModel | None = None,
    progress: StudyProgress | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> optuna.Study:
    """Run a real-engine study to ``plan.trials`` finished trials the screened way (module
    docs). Falls back to the plain study, saying why, when the simulator cannot be fitted
    (the baseline failed, or its step log could not be followed)."""
    if plan.objective_mode != "latency":
        raise TunerError("--screen: only for latency studies (capacity bisects on the server)")
    progress = progress or StudyProgress()
    deadline = None if plan.timeout_s is None else time.monotonic() + plan.timeout_s
    study, record = opened
    prepare_run(study, plan, engine)

    def complete() -> int:
        return sum(1 for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)

    progress.on_start(complete(), max(plan.trials - complete(), 0))
    current: dict[str, Any] = {"profile": profile, "base": None}

    def predicted(settings: dict[str, Any]) -> dict[str, Any] | None:
        if current["profile"] is None or current["base"] is None:
            return None  # the baseline: it is what the profile is fitted to
        return predict(current["profile"], plan, settings, current["base"])

    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    objective = TrialObjective(
        plan, engine, store, record, progress, finished, standalone=True, predict=predicted
    )
    baseline_done = any(
        t.user_attrs.get("baseline") and t.state == optuna.trial.TrialState.COMPLETE
        for t in study.trials
    )
    if not baseline_done and complete() < plan.trials:
        # Replayed to the end even when it misses the SLOs: its whole step log (and its
        # TTFTs, not lower bounds of them) is what the simulator is fitted to.
        whole = dataclasses.replace(plan, early_abort=False)
        baseline = TrialObjective(
            whole, engine, store, record, progress, finished, standalone=True, predict=predicted
        )
        study.optimize(baseline, n_trials=1, catch=())
    candidates: list[Candidate] = []
    try:
        current["base"] = server_config(store, record)
        if profile is None:
            say("fitting the simulator to the baseline's step log…")
            current["profile"] = calibrated_profile(store, plan)
        simulated = simulated_plan(plan, screen_trials)
        stand_in = sim_engine(current["profile"], current["base"])
        say(f"screening {screen_trials} settings on the simulator (study {simulated.name})…")
        run_study(
            simulated, stand_in, store, StudyProgress(), open_study(simulated, store, stand_in)
        )
        candidates = candidates_of(store, simulated.name)
    except TunerError as exc:
        say(f"screening skipped: {exc}; every trial is proposed by the sampler")
    candidates = [c for c in candidates if not already_run(study, c)]
    if candidates:
        say(f"{len(candidates)} simulated Pareto-optimal settings to confirm on the server")
    while candidates and complete() < plan.trials:
        if deadline is not None and time.monotonic() >= deadline:
            return study  # --timeout: no trial starts after it
        candidate = candidates.pop(0)
        study.enqueue_trial(
            candidate.params, user_attrs={"screened_from": candidate.screened_trial}
        )
        study.optimize(objective, n_trials=1, catch=())
        if profile is None:
            try:
                current["profile"] = calibrated_profile(store, plan)
            except TunerError as exc:
                say(f"the profile was not refitted after that trial: {exc}")
        candidates = rerank(
            [c for c in candidates if not already_run(study, c)],
            current["profile"],
            plan,
            current["base"],
        )
    remaining = max(plan.trials - complete(), 0)
    left = None if deadline is None else deadline - time.monotonic()
    if remaining and (left is None or left > 0):
        study.optimize(objective, n_trials=remaining, timeout=left, catch=())
    return study


__all__ = [
    "Candidate",
    "already_run",
    "calibrated_profile",
    "candidates_of",
    "predict",
    "rerank",
    "run_screened_study",
    "server_config",
    "sim_engine",
    "simulated_plan",
]
