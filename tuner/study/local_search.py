"""Budget refinement around the best trial so far (issue 46): where the SLOs are met only in a
narrow band of token budgets, the rule trials (:mod:`prefill_tuner.study.first_trials`) land
a power of two apart, in or beside the band, and TPE alone finds the band's best budget late
or never. So once every queued trial has run, a latency study with rule trials runs the best
trial's settings (the lowest worst SLO ratio: measured over limit, the worse of the SLOs) with
its budget a half octave either side (× 2^±½), then around the best of those a quarter
octave either side (× 2^±¼), before the sampler goes on: at most four trials, never past the
study's trials, none repeating a trial already run. ``benchmarks/search_efficiency.py``
measures what it buys (``tuner-norefine`` turns it off)."""

from __future__ import annotations

import math

import optuna
from optuna.trial import FrozenTrial, TrialState

from prefill_tuner.objectives.scoring import ERRORS
from prefill_tuner.study.first_trials import RULE_ATTR
from prefill_tuner.study.grouping import Callback
from prefill_tuner.study.plan import StudyPlan

REFINE = True
"""On (``benchmarks/search_efficiency.py`` turns it off to measure what it buys)."""
STEPS_OCTAVES = (0.5, 0.25)
"""The budget steps of the rounds, in octaves: each round tries the best budget so far this
far either side."""
REFINE_ATTR = "refines"
"""User attribute of a refinement trial: ``[the trial it refines, the step in octaves]``."""
TOKENS, SEQS = "max_num_batched_tokens", "max_num_seqs"


def worst_ratio(trial: FrozenTrial) -> float:
    """A complete trial's worst SLO ratio (measured over limit, the worse of its SLOs, every
    judge window's included); infinite when it failed requests beyond the error budget."""
    worst = -math.inf
    for name, constraint in trial.constraints.items():
        if name.split("@")[0] == ERRORS:
            if constraint > 0:
                return math.inf
            continue
        worst = max(worst, 1 + constraint)
    return worst if worst > -math.inf else math.inf


def refine_budget(plan: StudyPlan) -> Callback | None:
    """The ``study.optimize`` callback that queues the next refinement round once nothing is
    queued (``None`` when the study cannot have one: no rule trials, or no budget searched)."""
    if not REFINE or TOKENS not in plan.space.ranges or plan.objective_mode != "latency":
        return None
    budget_range = plan.space.ranges[TOKENS]

    def queue_round(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state != TrialState.COMPLETE:
            return
        trials = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return  # the baseline, the rule trials, a round or retries still queued
        if not any(RULE_ATTR in t.user_attrs for t in trials):
            return
        done = {t.user_attrs[REFINE_ATTR][1] for t in trials if REFINE_ATTR in t.user_attrs}
        steps = [step for step in STEPS_OCTAVES if step not in done]
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        scored = [(worst_ratio(t), t.number, t) for t in complete]
        scored = [entry for entry in scored if math.isfinite(entry[0])]
        if not steps or not scored:
            return
        best = min(scored, key=lambda entry: entry[:2])[2]
        counted = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.RUNNING)]
        room = plan.trials - len(counted)
        settings = plan.space.settings_from_params(best.params)  # every searched knob's
        budget = int(settings[TOKENS])
        seen = [t.params for t in trials]
        for step in steps:  # a round whose budgets were all run already: the next one
            queued = 0
            for factor in (2**-step, 2**step):
                new = min(max(round(budget * factor), budget_range.low), budget_range.high)
                chosen = {**settings, TOKENS: new}
                if SEQS in chosen and chosen[SEQS] > new:
                    chosen[SEQS] = new  # vLLM's rule: a step holds every sequence's token
                params = plan.space.params_for(chosen)
                if params in seen or queued >= room:
                    continue
                seen.append(params)
                study.enqueue_trial(params, user_attrs={REFINE_ATTR: [best.number, step]})
                queued += 1
            if queued:
                return

    return queue_round
