"""How many replicas a trace needs: the smallest count, behind a router, whose scheduler
settings meet the SLOs, found with the study machinery on the simulator.

Each replica count is a study of its own (``STUDY-3x``: every trial runs that many simulated
replicas behind the router, all with the trial's settings), run only until a trial meets every
SLO. Counts below the fewest whose latency floors are within the SLOs
(:func:`fewest_possible`) cannot meet them and are not searched; from there, counts double
until one is met, then bisect down to the smallest; so the count below the answer was either
searched too, and the plan reports it failing, or is below that floor. The answer's
study then runs its remaining trials to find the best settings at that count. Studies are
stored like any other, so a stopped plan resumes where it stopped.

A count that no trial met within its trials is not proven infeasible (the search is a sample);
the report says how many settings were tried and how close the best came.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from prefill_tuner import defaults
from prefill_tuner.declared import check_declared
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.routing import RouterName
from prefill_tuner.engines.sim.trial_engine import ReplicatedSimEngine
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.infeasibility import Floor, latency_floor
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.run import StudyProgress, open_study, run_study
from prefill_tuner.study.summary import StudySummary, summarize_stored


@dataclass(frozen=True)
class CountResult:
    """What the search found at one replica count."""

    replicas: int
    study: str
    """The study of this count (``STUDY-3x``)."""
    summary: StudySummary
    """Its trials so far: the recommended one meets every SLO, else the closest ones."""

    @property
    def met(self) -> bool:
        return self.summary.recommended is not None


MOST_REPLICAS = 1024
"""The most replicas a search may consider (each is simulated)."""


@dataclass(frozen=True)
class ReplicaSearch:
    """How replica counts are searched (``tune plan``)."""

    # The first paragraph of each field's docstring is its option's help.
    router: RouterName = defaults.ROUTER  # type: ignore[assignment]
    """How requests are spread: round-robin, least-outstanding (fewest in flight) or
    prefix-aware (SGLang's cache-aware policy)."""
    max_replicas: Annotated[int, Field(ge=1, le=MOST_REPLICAS)] = defaults.MAX_REPLICAS
    """The most replicas to consider."""

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True)
class ReplicaPlan:
    """Every count searched, and the smallest that met the SLOs."""

    router: str
    max_replicas: int
    counts: dict[int, CountResult]
    """Replica count → its study's outcome, for every count searched."""
    fewest_possible: int
    """The fewest replicas whose latency floors are all within the SLOs: fewer cannot meet
    them, whatever the settings (:func:`~prefill_tuner.study.infeasibility.latency_floor`)."""
    floors_below: list[Floor] = dataclasses.field(default_factory=list)
    """The floors over their limits with one replica fewer than that (none when it is 1)."""

    @property
    def replicas(self) -> int | None:
        """The smallest count met (``None``: not even ``max_replicas``)."""
        met = [count for count, result in self.counts.items() if result.met]
        return min(met) if met else None

    @property
    def answer(self) -> CountResult | None:
        replicas = self.replicas
        return None if replicas is None else self.counts[replicas]

    @property
    def below(self) -> CountResult | None:
        """The count just below the answer, if it was searched (not met)."""
        replicas = self.replicas
        return None if replicas is None else self.counts.get(replicas - 1)


def fewest_possible(
    plan: StudyPlan, profile: StepModel, max_replicas: int
) -> tuple[int | None, list[Floor]]:
    """The fewest replicas (up to ``max_replicas``) at which no SLO's floor is over its limit,
    by bisection (the floors only fall as replicas are added), and the floors over their
    limits one replica fewer (``None``, with those at ``max_replicas``, when none will do)."""

    @functools.cache  # each count's floors once
    def unreachable(replicas: int) -> list[Floor]:
        floors = latency_floor(
            plan.trace,
            profile,
            plan.slos,
            replicas=replicas,
            max_concurrency=plan.shaping.max_concurrency,
        )
        return [floor for floor in floors if floor.unreachable]

    if unreachable(max_replicas):
        return None, unreachable(max_replicas)
    low, high = 0, max_replicas  # low: unreachable (0: none tried), high: reachable
    while high - low > 1:
        middle = (low + high) // 2
        if unreachable(middle):
            low = middle
        else:
            high = middle
    return high, unreachable(low) if low else []


def count_study_name(base: str, replicas: int) -> str:
    """The study of one replica count: ``sample-plan-3x``."""
    return f"{base}-{replicas}x"


def plan_replicas(
    plan: StudyPlan,
    profile: StepModel,
    store: TunerStore,
    *,
    router: str,
    max_replicas: int,
    progress: Callable[[int, StudyPlan, bool], StudyProgress] | None = None,
) -> ReplicaPlan:
    """Search replica counts from the fewest the floors allow (:func:`fewest_possible`),
    doubling up to ``max_replicas`` until one is met, bisect to the smallest, then finish that
    count's study (``plan.trials`` trials each).
    ``progress(count, plan, met)``: a progress reporter for the study of ``count`` replicas
    (``met``: a stored trial of it already meets the SLOs)."""
    ReplicaSearch(router, max_replicas)  # type: ignore[arg-type]  # checked as declared
    counts: dict[int, CountResult] = {}
    fewest, floors_below = fewest_possible(plan, profile, max_replicas)
    if fewest is None:
        return ReplicaPlan(router, max_replicas, counts, max_replicas + 1, floors_below)

    def search(replicas: int, *, until_feasible: bool) -> CountResult:
        engine = ReplicatedSimEngine(profile, replicas=replicas, router=router)
        count_plan = dataclasses.replace(plan, name=count_study_name(plan.name, replicas))
        opened = open_study(count_plan, store, engine)
        met = any(trial.user_attrs.get("feasible") for trial in opened[0].trials)
        reporter = progress(replicas, count_plan, met) if progress else None
        run_study(count_plan, engine, store, reporter, opened, until_feasible=until_feasible)
        result = CountResult(replicas, count_plan.name, summarize_stored(store, count_plan.name))
        # A count met while searching is done with (``tune studies`` says so); the answer's
        # study then asks for all its trials.
        done = until_feasible and result.met
        store.record_definition(
            opened[1],
            result.summary.finished if done else plan.trials,
            {"runs_in": "tune plan", "replicas": replicas, "router": router},
        )
        counts[replicas] = result
        return result

    # low: the largest count not met (below ``fewest``: by its floors); high: the smallest met
    low, high = fewest - 1, None
    replicas = fewest
    while replicas <= max_replicas:
        if search(replicas, until_feasible=True).met:
            high = replicas
            break
        low = replicas
        if replicas == max_replicas:
            break
        replicas = min(replicas * 2, max_replicas)
    if high is not None:
        while high - low > 1:
            middle = (low + high) // 2
            if search(middle, until_feasible=True).met:
                high = middle
            else:
                low = middle
        search(high, until_feasible=False)  # the best settings at the answer
    return ReplicaPlan(router, max_replicas, counts, fewest, floors_below)


def replica_details(summary: StudySummary) -> list[dict[str, float]]:
    """The recommended trial's per-replica statistics (requests, busy time, utilisation)."""
    trial = summary.recommended
    if trial is None or not trial.metrics:
        return []
    return list(trial.metrics.get("details", {}).get("replicas", []))
