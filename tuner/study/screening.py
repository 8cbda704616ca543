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
   an order that spreads over the front (farthest from those already chosen first), then,
   when the front is small, the settings it ranks next (up to :data:`CANDIDATE_SHARE` of the
   real trials); after each real trial the profile is fitted again and a candidate it now
   predicts to miss the SLOs goes to the back;
5. once the candidates are spent, the study's own sampler on real trials.

The screening is stored with the study (:class:`Screening`, in the Optuna study's user
attributes) and runs once, whoever gets there first after the baseline: ``tune run``, or one
of the study's workers (``tune worker`` waits for the baseline, screens under the study's
lock, and queues one candidate per claim); a resumed run reads it back.

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
from prefill_tuner.calibration.observations import calibrate_from_study
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import StepModel, profile_from_record
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.storage.models import StudyRecord, TrialRecord
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.evaluation import objective_value, verdict_of
from prefill_tuner.study.plan import StudyPlan, screen_study_name
from prefill_tuner.study.recommend import rank_key, references
from prefill_tuner.study.run import (
    LIVE,
    StudyProgress,
    TrialObjective,
    open_study,
    prepare_run,
    run_study,
    running,
)
from prefill_tuner.study.summary import summarize_stored

SCREENING_ATTR = "screening"
"""User attribute of the real study's Optuna study holding its :class:`Screening` (JSON), so
that every process running its real trials (``tune run``, workers, a resumed run) reads the
same candidates and profile."""
CANDIDATE_SHARE = 0.5
"""Share of the real trials (after the baseline) that the screening's candidates may take
when its Pareto front is smaller: the rest go to the sampler, which learns from the real
server rather than from the simulator's picture of it."""
GIVEN_PROFILE_ATTR = "screening_profile"
"""User attribute holding the profile the user gave (``--profile``): screening uses it as it
is, and never refits it."""


@dataclass(frozen=True)
class Candidate:
    """A simulated Pareto-optimal setting, waiting for its real trial."""

    params: dict[str, Any]
    """The study's parameters for it (what the real study is asked to run)."""
    settings: dict[str, Any]
    """The engine settings they give."""
    screened_trial: int
    """Its trial number in the simulated study."""

    def as_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Candidate:
        return cls(dict(data["params"]), dict(data["settings"]), int(data["screened_trial"]))


@dataclass(frozen=True)
class Screening:
    """A study's screening, done once (after its baseline) and shared by every process that
    runs its real trials."""

    candidates: tuple[Candidate, ...] = ()
    """The simulated Pareto set, in the order real trials should try them (those tried so
    far first)."""
    profile: StepModel | None = None
    """The simulator's profile: fitted to the real trials, or the one the user gave."""
    base: SimConfig | None = None
    """The real server's config (its defaults, context length and KV pool) as the
    simulator takes it."""
    refit: bool = False
    """Refit the profile to the real trials after each one (no profile was given)."""
    skipped: str | None = None
    """Why there was no screening (every real trial is then proposed by the sampler)."""

    def as_record(self) -> dict[str, Any]:
        return {
            "candidates": [c.as_record() for c in self.candidates],
            "profile": None if self.profile is None else self.profile.model_dump(mode="json"),
            "base": None if self.base is None else self.base.model_dump(mode="json"),
            "refit": self.refit,
            "skipped": self.skipped,
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Screening:
        return cls(
            candidates=tuple(Candidate.from_record(c) for c in data.get("candidates", [])),
            profile=None if data.get("profile") is None else profile_from_record(data["profile"]),
            base=None if data.get("base") is None else SimConfig.model_validate(data["base"]),
            refit=bool(data.get("refit")),
            skipped=data.get("skipped"),
        )


def load_screening(study: optuna.Study) -> Screening | None:
    """The study's screening, or ``None`` when it has not run yet."""
    data = study.user_attrs.get(SCREENING_ATTR)
    return None if data is None else Screening.from_record(data)


def save_screening(study: optuna.Study, screening: Screening) -> None:
    study.set_user_attr(SCREENING_ATTR, screening.as_record())


def give_profile(study: optuna.Study, profile: StepModel) -> None:
    """Screen ``study`` with ``profile`` (``--profile``) instead of a fit to its baseline,
    and explain with it why nothing met the SLOs (:func:`stand_in`)."""
    study.set_user_attr(GIVEN_PROFILE_ATTR, profile.model_dump(mode="json"))


def given_profile(study: optuna.Study) -> StepModel | None:
    data = study.user_attrs.get(GIVEN_PROFILE_ATTR)
    return None if data is None else profile_from_record(data)


def stand_in(store: TunerStore, study: optuna.Study) -> SimEngine | None:
    """The simulator standing in for a real study's server, to explain why nothing met its
    SLOs: the screening's profile (fitted to the real trials, or given), else the one given
    with ``--profile``, on the server's own config. ``None`` when the study has no profile,
    or no baseline that ran on the server."""
    screening = load_screening(study)
    profile = (screening.profile if screening else None) or given_profile(study)
    record = store.get_study(study.study_name)
    if profile is None or record is None:
        return None
    base = screening.base if screening and screening.base else None
    if base is None:
        try:
            base = server_config(store, record)
        except TunerError:
            return None
    return sim_engine(profile, base)


def baseline_pending(study: optuna.Study) -> bool:
    """Whether the baseline, which screening is fitted to, has yet to finish (it is queued or
    running, and no baseline trial is complete)."""
    baselines = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")]
    if any(t.state == optuna.trial.TrialState.COMPLETE for t in baselines):
        return False
    return any(t.state in LIVE for t in baselines)


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
        plan,
        name=screen_study_name(plan.name),
        trials=trials,
        early_abort=False,
        timeout_s=None,
        screen_trials=0,
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
    run = engine.run(plan.trace, settings, max_concurrency=plan.shaping.max_concurrency)
    if run.metrics is None or run.failure:
        return {"failure": run.failure or "no metrics", "profile": profile.name}
    return {
        "objectives": {o.name: objective_value(run, o.name) for o in plan.objectives},
        "feasible": verdict_of(run, plan.slos, plan.error_budget).feasible,
        "profile": profile.name,
    }


def candidates_of(store: TunerStore, simulated: str, limit: int = 0) -> list[Candidate]:
    """The settings the simulated study ``simulated`` found best, in the order real trials
    should try them: its Pareto set (with no feasible setting, the closest ones), the
    recommended one first, then each time the one farthest (in log objective space) from
    those already chosen; then, while fewer than ``limit``, its other feasible settings in
    the recommendation's order (a front of one or two leaves the real budget to settings
    the simulator ranks next, rather than to a sampler that knows nothing yet). The engine's
    defaults are never a candidate: the real study runs them first, as its baseline."""
    summary = summarize_stored(store, simulated)
    defaults = summary.baseline.settings if summary.baseline is not None else None
    front = [t for t in list(summary.pareto) or list(summary.closest) if t.settings != defaults]
    if not front:
        return []
    first = summary.recommended if summary.recommended in front else front[0]
    ordered = [first, *_spread([t for t in front if t is not first], [first], summary.objectives)]
    if len(ordered) < limit:
        limits = {slo.name: slo.limit_s for slo in parse_slos(list(summary.study.slos))}
        reference = references(summary.objectives, summary.pareto, summary.baseline, limits)
        others = sorted(
            (
                t
                for t in store.trials(summary.study)
                if t.feasible and t.status == "complete" and t.settings != defaults
            ),
            key=lambda t: rank_key(t, summary.objectives, summary.directions, reference),
        )
        measured = {tuple(t.objectives.values()) for t in ordered}
        for trial in others:  # one per predicted outcome: a tie adds nothing to learn
            if len(ordered) >= limit:
                break
            if tuple(trial.objectives.values()) not in measured:
                measured.add(tuple(trial.objectives.values()))
                ordered.append(trial)
    candidates: list[Candidate] = []
    for trial in ordered:  # settings two parameter sets share are tried once
        if all(c.settings != trial.settings for c in candidates):
            candidates.append(
                Candidate(dict(trial.params), dict(trial.settings), trial.trial_number)
            )
    return candidates


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
        or trial.system_attrs.get("fixed_params") == candidate.params
        for trial in study.get_trials(deepcopy=False)
        if trial.state != optuna.trial.TrialState.FAIL
    )


def screen(
    plan: StudyPlan,
    store: TunerStore,
    record: StudyRecord,
    study: optuna.Study,
    say: Callable[[str], None] = lambda text: None,
) -> Screening:
    """Screen once, after the baseline: fit the simulator to the real trials (or take the
    given profile), run the simulated study ``NAME-screen``, and store its Pareto set as the
    candidates. When the simulator cannot be fitted (the baseline failed, its step log could
    not be followed), the screening is stored as skipped, with the reason, and said."""
    given = given_profile(study)
    try:
        base = server_config(store, record)
        if given is None:
            say("fitting the simulator to the baseline's step log…")
        profile = given or calibrated_profile(store, plan)
        simulated = simulated_plan(plan, plan.screen_trials)
        stand_in = sim_engine(profile, base)
        say(f"screening {plan.screen_trials} settings on the simulator (study {simulated.name})…")
        run_study(
            simulated, stand_in, store, StudyProgress(), open_study(simulated, store, stand_in)
        )
        limit = math.ceil(CANDIDATE_SHARE * (plan.trials - 1))
        candidates = candidates_of(store, simulated.name, limit)
    except TunerError as exc:
        say(f"screening skipped: {exc}; every trial is proposed by the sampler")
        screening = Screening(skipped=str(exc))
    else:
        screening = Screening(tuple(candidates), profile, base, refit=given is None)
        waiting = [c for c in candidates if not already_run(study, c)]
        if waiting:
            count = f"{len(waiting)} setting{'s' * (len(waiting) > 1)}"
            say(f"{count} the simulator ranks best to confirm on the server")
    save_screening(study, screening)
    return screening


def next_candidate(study: optuna.Study, screening: Screening | None) -> Candidate | None:
    """The first candidate the real study has not run or queued yet."""
    if screening is None:
        return None
    return next((c for c in screening.candidates if not already_run(study, c)), None)


def enqueue_candidate(study: optuna.Study, candidate: Candidate) -> None:
    study.enqueue_trial(candidate.params, user_attrs={"screened_from": candidate.screened_trial})


def refine(
    study: optuna.Study,
    plan: StudyPlan,
    store: TunerStore,
    say: Callable[[str], None] = lambda text: None,
) -> Screening | None:
    """After a real trial: refit the profile to every real trial so far (unless it was given)
    and re-rank the candidates still waiting with it; stored for every process. Nothing is
    done once the candidates are spent."""
    screening = load_screening(study)
    if screening is None or next_candidate(study, screening) is None:
        return screening
    if screening.profile is None or screening.base is None:
        return screening  # skipped: it has no candidates (not reached)
    profile = screening.profile
    if screening.refit:
        try:
            profile = calibrated_profile(store, plan)
        except TunerError as exc:
            say(f"the profile was not refitted after that trial: {exc}")
    tried = [c for c in screening.candidates if already_run(study, c)]
    waiting = [c for c in screening.candidates if not already_run(study, c)]
    ranked = rerank(waiting, profile, plan, screening.base)
    refined = dataclasses.replace(screening, candidates=(*tried, *ranked), profile=profile)
    save_screening(study, refined)
    return refined


def predictor(
    screening: Screening | None, plan: StudyPlan
) -> Callable[[dict[str, Any]], dict[str, Any] | None] | None:
    """What the simulator predicts for a real trial's settings, with the screening's current
    profile (``None`` before the screening: the baseline is what the profile is fitted to)."""
    if screening is None or screening.profile is None or screening.base is None:
        return None
    profile, base = screening.profile, screening.base
    return lambda settings: predict(profile, plan, settings, base)


def run_screened_study(
    plan: StudyPlan,
    engine: TrialEngine,
    store: TunerStore,
    opened: tuple[optuna.Study, StudyRecord],
    *,
    progress: StudyProgress | None = None,
    say: Callable[[str], None] = lambda text: None,
) -> optuna.Study:
    """Run a real-engine study to ``plan.trials`` finished trials the screened way (module
    docs). Falls back to the study's sampler, saying why, when the simulator cannot be
    fitted (the baseline failed, or its step log could not be followed)."""
    if plan.objective_mode != "latency":
        raise TunerError(
            "`screen_trials`: only for latency studies (capacity bisects on the server)"
        )
    progress = progress or StudyProgress()
    deadline = None if plan.timeout_s is None else time.monotonic() + plan.timeout_s
    study, record = opened
    with running(study, store, record):
        recovered = prepare_run(study, plan, engine, store, record)

        def complete() -> int:
            return sum(1 for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)

        def objective(screening: Screening | None, whole: bool = False) -> TrialObjective:
            finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
            # The baseline is replayed to the end even when it misses the SLOs: its whole step
            # log (and its TTFTs, not lower bounds of them) is what the simulator is fitted to.
            run_plan = dataclasses.replace(plan, early_abort=False) if whole else plan
            return TrialObjective(
                run_plan,
                engine,
                store,
                record,
                progress,
                finished,
                standalone=True,
                predict=predictor(screening, plan),
            )

        def time_left() -> float | None:
            return None if deadline is None else deadline - time.monotonic()

        progress.on_start(complete(), max(plan.trials - complete(), 0))
        if recovered:
            progress.on_recovered(recovered)
        screening = load_screening(study)
        if baseline_pending(study) and complete() < plan.trials:
            study.optimize(objective(screening, whole=True), n_trials=1, catch=())
        if screening is None and complete() < plan.trials:
            screening = screen(plan, store, record, study, say)
        while complete() < plan.trials:
            left = time_left()
            candidate = next_candidate(study, screening)
            if candidate is None or (left is not None and left <= 0):
                break
            enqueue_candidate(study, candidate)
            study.optimize(objective(screening), n_trials=1, catch=())
            screening = refine(study, plan, store, say)
        remaining = max(plan.trials - complete(), 0)
        left = time_left()
        if remaining and (left is None or left > 0):
            study.optimize(objective(screening), n_trials=remaining, timeout=left, catch=())
    return study


__all__ = [
    "Candidate",
    "Screening",
    "already_run",
    "baseline_pending",
    "calibrated_profile",
    "candidates_of",
    "enqueue_candidate",
    "give_profile",
    "given_profile",
    "load_screening",
    "next_candidate",
    "predict",
    "predictor",
    "refine",
    "rerank",
    "run_screened_study",
    "save_screening",
    "screen",
    "server_config",
    "sim_engine",
    "simulated_plan",
    "stand_in",
]
