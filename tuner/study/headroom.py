"""Headroom of the recommendation: how much more load each of the best settings carries before
an SLO breaks, and whether it still meets the SLOs with its token budget and ``max_num_seqs``
moved one step; the recommendation prefers a setting that does over one that wins by a percent
on a cliff's edge.

The checks run, by default, on the simulator (the study's own engine when it simulates; for a
real server its stand-in, the simulator with the study's profile), a few runs per candidate:

- **candidates**: the Pareto-optimal settings in the recommendation rule's order
  (:mod:`prefill_tuner.study.recommend`) whose worst ratio is within :data:`BAND` of the rule's
  pick (every Pareto setting when a load margin is required), at most :data:`MAX_CANDIDATES`;
- **neighbours**: each searched knob the setting uses (not fixed by the user; a threshold or
  share only when on, no boolean) one step each way: counts (the token budget, the sequence
  slots, the newer vLLM limits) ×0.8 and ×1.25, a threshold or share ×0.5 and ×2, repaired by
  vLLM's rules (:mod:`prefill_tuner.search_spaces.rules`); a step vLLM would refuse (with
  chunked prefill off, a budget below ``max_model_len``) is named with vLLM's reason;
- **load**: the trace's request rate times 1.25, 1.5 and 2 (and the required margin), up to the
  first that misses an SLO.

Each check judges the whole trace and every judge window of the study
(:mod:`prefill_tuner.study.windows`). The recommendation (:data:`HEADROOM_RULE`) is the first
candidate in the rule's order that carries the required margin and is *safe*: it meets the
SLOs at every neighbour and at :data:`SAFE_LOAD` × the load; else the first that carries the
margin and meets them at every neighbour; else the first that carries the margin; else the
rule's pick (the margin is then reported missed). The checks stop at the first safe candidate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.objectives.scoring import ERRORS
from prefill_tuner.objectives.slo import format_seconds
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.rules import effective_settings, first_broken
from prefill_tuner.storage.models import TrialRecord
from prefill_tuner.study.evaluation import verdict_of
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.recommend import rank_key
from prefill_tuner.study.windows import judge_windows
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.shaping import scale_rate

NEIGHBOUR_KNOBS = ("max_num_batched_tokens", "max_num_seqs")
"""The knobs moved when the searched ones are not known (a stored check of an earlier
version): the two a deployment most often changes by hand."""
STEPS = (0.8, 1.25)
"""One step down and up of a count (at least one unit)."""
CAP_STEPS = (0.5, 2.0)
"""One step down and up of a threshold or share (searched as powers of two)."""
MAX_SHARE = 0.5
"""A share moved up stays at most this (vLLM takes less than 1)."""
LOADS = (1.25, 1.5, 2.0)
"""Request-rate multipliers tried, in order, until one misses an SLO."""
SAFE_LOAD = 1.25
"""A safe setting carries at least this much more load than the trace's."""
BAND = 0.2
"""Candidates: Pareto settings whose worst ratio is within this share of the rule's pick's."""
MAX_CANDIDATES = 4
"""Candidates checked at most (each costs up to seven runs)."""
CHECKS = ("sim", "engine", "off")
"""Where the checks run: the simulator (default), the study's own engine (for a real server:
server starts, minutes each), or nowhere."""

HEADROOM_RULE = (
    "of the Pareto settings within 20% of the rule's pick, the first in the rule's order that "
    "meets the SLOs at its neighbours (each searched knob it uses one step each way: counts "
    "×0.8 and ×1.25, a threshold ×0.5 and ×2) and at 1.25× the load (and carries the required "
    "load margin); else the first that meets them at its neighbours"
)
"""How headroom changes the pick, as every output that names it states it."""


@dataclass(frozen=True)
class Check:
    """One run of a candidate's settings, changed: a neighbour, or more load."""

    what: str
    """``max_num_batched_tokens ×1.25`` or ``load ×1.5``."""
    settings: dict[str, Any]
    rate: float
    """Multiplier of the trace's request rate it ran at."""
    meets: bool
    worst: float
    """The worst SLO's measured value over its limit (over 1: missed), over the whole trace
    and every judge window; ``inf`` when the run failed or lost requests beyond the budget."""
    binding: str
    """That SLO's name (``p99_tpot``, ``p99_tpot@busiest:300``, or ``errors``)."""

    def words(self) -> str:
        if not math.isfinite(self.worst):
            return f"{self.what}: misses ({self.binding})"
        verb = "meets" if self.meets else "misses"
        return f"{self.what}: {verb} ({self.binding} at {self.worst:.0%} of its limit)"


@dataclass(frozen=True)
class Candidate:
    """One setting's checks."""

    trial_number: int
    neighbours: list[Check]
    loads: list[Check]
    score: float = math.nan
    """Its worst ratio by the recommendation rule (1 = at the bar)."""
    objectives: dict[str, float] = field(default_factory=dict)
    """What it measured on the trace itself."""
    refused: dict[str, str] = field(default_factory=dict)
    """Neighbours that could not run, and why (vLLM would refuse them): ``{"max_num_batched_
    tokens ×0.8": "vLLM refuses it: with chunked prefill off, ..."}``."""

    @property
    def neighbours_meet(self) -> bool:
        return all(check.meets for check in self.neighbours)

    @property
    def load(self) -> float:
        """The highest rate multiplier tried that it met (1: none above the trace's)."""
        return max((check.rate for check in self.loads if check.meets), default=1.0)

    @property
    def load_missed(self) -> float | None:
        """The lowest multiplier it missed (``None``: it met every one tried)."""
        return min((check.rate for check in self.loads if not check.meets), default=None)

    def carries(self, margin: float | None) -> bool:
        return margin is None or self.load >= margin

    def safe(self, margin: float | None) -> bool:
        return self.neighbours_meet and self.carries(max(margin or 1.0, SAFE_LOAD))

    def load_words(self) -> str:
        missed = self.load_missed
        if missed is None:
            return f"meets the SLOs up to {self.load:g}× this trace's rate (the most tried)"
        if self.load <= 1:
            return f"meets the SLOs at this trace's rate but not at {missed:g}× it"
        return f"meets the SLOs up to {self.load:g}× this trace's rate (not at {missed:g}×)"

    def neighbour_words(self) -> str:
        missed = [check.what for check in self.neighbours if not check.meets]
        refused = "".join(f"; {what} could not run ({why})" for what, why in self.refused.items())
        if not self.neighbours:
            return "no neighbour to check (every knob it uses fixed)" + refused
        if not missed:
            every = ", ".join(c.what for c in self.neighbours)
            return f"every neighbour ({every}) meets them" + refused
        return "misses them at " + ", ".join(missed) + refused


@dataclass(frozen=True)
class HeadroomReport:
    """The checks of a study's best settings and the recommendation they lead to."""

    checked_on: str
    """Where the runs ran (``the simulator (profile ...)``)."""
    margin: float | None
    """The required load margin (``headroom``), if any."""
    rule_pick: int
    """The trial the recommendation rule alone picks."""
    recommended: int
    candidates: list[Candidate]
    finished: int
    """Finished trials of the study when it was checked (more since: the checks are stale)."""
    runs: int = 0
    """Engine runs the checks took."""
    seconds: float = 0.0
    windows: list[str] = field(default_factory=list)

    def candidate(self, number: int) -> Candidate | None:
        return next((c for c in self.candidates if c.trial_number == number), None)

    @property
    def chosen(self) -> Candidate:
        found = self.candidate(self.recommended)
        assert found is not None
        return found

    @property
    def margin_met(self) -> bool:
        return self.chosen.carries(self.margin)

    def lines(self) -> list[str]:
        """What the checks found, as every output states it."""
        chosen = self.chosen
        lines = [
            f"headroom (trial {chosen.trial_number}, on {self.checked_on}): "
            f"{chosen.load_words()}; {chosen.neighbour_words()}"
        ]
        if self.margin is not None:
            met = "carries it" if self.margin_met else "NO candidate carries it"
            lines.append(f"required load margin {self.margin:g}×: {met}")
            if not self.margin_met:
                lines.append(self.short_of(self.margin))
        if self.recommended != self.rule_pick:
            pick = self.candidate(self.rule_pick)
            assert pick is not None
            lines.append(
                f"chosen over trial {self.rule_pick}, which the rule alone picks (worst ratio "
                f"{pick.score:.2f} against {chosen.score:.2f}; {_measured(pick)} against "
                f"{_measured(chosen)}): trial {self.rule_pick} {pick.load_words()} and "
                f"{pick.neighbour_words()}"
            )
        elif not chosen.safe(self.margin):
            if not any(c.carries(SAFE_LOAD) for c in self.candidates):
                lines.append(self.short_of(SAFE_LOAD))
            else:
                lines.append(
                    "no candidate within 20% of it is safer: it sits near an SLO's edge (see "
                    "the checks)"
                )
        return lines

    def short_of(self, margin: float) -> str:
        """What to do when no checked setting carries ``margin`` × the load: the most any
        carries, and what would carry it."""
        best = max(self.candidates, key=lambda c: c.load)
        most = (
            f"the most any carries is {best.load:g}× (trial {best.trial_number})"
            if best.load > 1
            else "none carries more load than this trace's"
        )
        return (
            f"no setting checked carries {margin:g}× this trace's rate ({len(self.candidates)} "
            f"of the best checked): {most}; to carry it, spread the load over more replicas "
            "(tune plan finds how many, and their settings) or loosen the SLO that breaks"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadroomReport:
        def check(stored: dict[str, Any]) -> Check:  # storage keeps no infinity: null
            worst = stored.get("worst")
            return Check(**{**stored, "worst": math.inf if worst is None else float(worst)})

        candidates = [
            Candidate(
                c["trial_number"],
                [check(stored) for stored in c["neighbours"]],
                [check(stored) for stored in c["loads"]],
                math.nan if c.get("score") is None else float(c["score"]),
                {k: v for k, v in (c.get("objectives") or {}).items() if v is not None},
                dict(c.get("refused") or {}),
            )
            for c in data["candidates"]
        ]
        return cls(**{**data, "candidates": candidates})


def _measured(candidate: Candidate) -> str:
    return ", ".join(
        f"{name} {format_seconds(value)}"
        for name, value in candidate.objectives.items()
        if math.isfinite(value)
    )


@dataclass(frozen=True)
class Neighbour:
    """A setting one step from a candidate in one knob, or why that step cannot run."""

    what: str
    """``long_prefill_token_threshold ×0.5``."""
    settings: dict[str, Any] | None
    """``None``: vLLM would refuse it (:attr:`why`)."""
    why: str = ""


def _steps(knob: str, value: Any) -> list[tuple[float, Any]]:
    """The one-step moves of a knob's value (see the module): none for a boolean, an unset
    limit, or a threshold or share that is off (the pick does not use it)."""
    kind = KNOBS[knob].kind if knob in KNOBS else "int"
    if isinstance(value, bool) or value is None or kind == "bool":
        return []
    if kind in ("threshold", "share"):
        if not value:
            return []
        if kind == "share":
            return [(step, min(value * step, MAX_SHARE)) for step in CAP_STEPS]
        return [(step, max(1, round(value * step))) for step in CAP_STEPS]
    if not isinstance(value, int):
        return []
    return [
        (STEPS[0], max(1, min(value - 1, round(value * STEPS[0])))),
        (
            STEPS[1],
            max(value + 1, round(value * STEPS[1])),
        ),
    ]


def neighbours(
    settings: dict[str, Any],
    fixed: dict[str, Any],
    max_model_len: int,
    searched: Sequence[str] = NEIGHBOUR_KNOBS,
) -> list[Neighbour]:
    """``settings`` with each searched knob it uses (``searched``, less ``fixed``) moved one
    step each way (counts ×0.8 and ×1.25, a threshold or share ×0.5 and ×2), each repaired by
    vLLM's rules; a move vLLM would refuse whichever way it is repaired (the repair undoes it)
    is kept with vLLM's reason, a move that changes nothing is left out."""
    result: list[Neighbour] = []
    seen: list[dict[str, Any]] = []
    for knob in searched:
        if knob in fixed:
            continue
        for step, value in _steps(knob, settings.get(knob)):
            raw = {**settings, knob: value}
            moved, _ = effective_settings(raw, fixed, max_model_len)
            what = f"{knob} ×{step:g}"
            if moved == settings:
                why = first_broken({**raw, **fixed, "max_model_len": max_model_len})
                if why is not None:
                    result.append(Neighbour(what, None, f"vLLM refuses it: {why}"))
                continue
            if moved not in seen:
                seen.append(moved)
                result.append(Neighbour(what, moved))
    return result


class Checker:
    """Runs one setting at one load on the whole trace and every judge window."""

    def __init__(self, plan: StudyPlan, engine: TrialEngine) -> None:
        self.plan, self.engine = plan, engine
        self.parts = [("", plan.trace)] + [
            (f"@{w.spec}", w.trace) for w in judge_windows(plan.trace, plan.judge_windows)
        ]
        self.runs = 0
        self._scaled: dict[tuple[str, float], Trace] = {}
        """Each part at each rate tried, made once: every candidate replays the same trace
        object (the simulator prepares a trace's requests once per object)."""

    def _at(self, suffix: str, trace: Trace, rate: float) -> Trace:
        if rate == 1:
            return trace
        scaled = self._scaled.get((suffix, rate))
        if scaled is None:
            scaled = self._scaled[suffix, rate] = scale_rate(trace, rate)
        return scaled

    def check(self, what: str, settings: dict[str, Any], rate: float) -> Check:
        worst, binding, meets = 0.0, "", True
        limits = {slo.name: slo.limit_s for slo in self.plan.slos}
        for suffix, trace in self.parts:
            run = self.engine.run(
                self._at(suffix, trace, rate),
                settings,
                self.plan.abort_rule,
                label="headroom",
                max_concurrency=self.plan.shaping.max_concurrency,
            )
            self.runs += 1
            verdict = verdict_of(run, self.plan.slos, self.plan.error_budget)
            meets = meets and verdict.feasible
            if verdict.constraints.get(ERRORS, 0) > 0:
                worst, binding = math.inf, ERRORS + suffix
                continue
            for name, constraint in verdict.constraints.items():
                if name in limits and 1 + constraint > worst:
                    worst, binding = 1 + constraint, name + suffix
            if not meets and not math.isfinite(worst):
                break
        return Check(what, settings, rate, meets, worst, binding)


def candidates_of(
    pareto: Sequence[TrialRecord],
    key: Callable[[TrialRecord], tuple[float, ...]],
    margin: float | None,
) -> list[TrialRecord]:
    """The Pareto settings worth checking, in the rule's order (see the module)."""
    ordered = sorted(pareto, key=key)
    if not ordered:
        return []
    if margin is None:
        top = key(ordered[0])[0]
        ordered = [t for t in ordered if key(t)[0] <= top * (1 + BAND) + 1e-12]
    return ordered[:MAX_CANDIDATES]


def check_headroom(
    plan: StudyPlan,
    engine: TrialEngine,
    pareto: Sequence[TrialRecord],
    key: Callable[[TrialRecord], tuple[float, ...]],
    *,
    checked_on: str,
    finished: int,
    say: Callable[[str], None] = lambda text: None,
) -> HeadroomReport | None:
    """Check the candidates (see the module) and choose the recommendation; ``None`` when
    there is nothing to check (no Pareto setting)."""
    import time

    started = time.perf_counter()
    chosen = candidates_of(pareto, key, plan.headroom)
    if not chosen:
        return None
    checker = Checker(plan, engine)
    max_model_len = engine.max_model_len(dict(plan.space.fixed))
    loads = sorted({*LOADS, *([plan.headroom] if plan.headroom else [])})
    checked: list[Candidate] = []
    for trial in chosen:
        say(f"checking trial {trial.trial_number}'s neighbours and load headroom...")
        moves = neighbours(
            trial.settings, dict(plan.space.fixed), max_model_len, list(plan.space.ranges)
        )
        near = [checker.check(n.what, n.settings, 1.0) for n in moves if n.settings is not None]
        refused = {n.what: n.why for n in moves if n.settings is None}
        tried: list[Check] = []
        for rate in loads:
            tried.append(checker.check(f"load ×{rate:g}", trial.settings, rate))
            if not tried[-1].meets:
                break
        checked.append(
            Candidate(
                trial.trial_number, near, tried, key(trial)[0], dict(trial.objectives), refused
            )
        )
        if checked[-1].safe(plan.headroom):
            break
    recommended = choose(checked, plan.headroom)
    return HeadroomReport(
        checked_on=checked_on,
        margin=plan.headroom,
        rule_pick=chosen[0].trial_number,
        recommended=recommended.trial_number,
        candidates=checked,
        finished=finished,
        runs=checker.runs,
        seconds=time.perf_counter() - started,
        windows=[suffix[1:] for suffix, _ in checker.parts[1:]],
    )


def choose(checked: Sequence[Candidate], margin: float | None) -> Candidate:
    """:data:`HEADROOM_RULE` over candidates in the rule's order."""
    tiers: list[Callable[[Candidate], bool]] = [
        lambda c: c.safe(margin),
        lambda c: c.carries(margin) and c.neighbours_meet,
        lambda c: c.carries(margin),
    ]
    for tier in tiers:
        found = next((c for c in checked if tier(c)), None)
        if found is not None:
            return found
    return checked[0]


def rule_key(
    objectives: Sequence[str],
    directions: Sequence[str],
    reference: dict[str, float],
    windowed: Sequence[str] = (),
) -> Callable[[TrialRecord], tuple[float, ...]]:
    """The recommendation rule's order (:func:`~prefill_tuner.study.recommend.rank_key`)."""
    return lambda trial: rank_key(trial, objectives, directions, reference, windowed)
