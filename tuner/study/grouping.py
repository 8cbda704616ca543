"""Trials grouped by server (issue 45): on a real engine whose servers take some knobs while
running (:attr:`~prefill_tuner.engines.base.TrialEngine.live_knobs`), a trial the sampler
proposes with new start-up settings is followed by :data:`GROUP` − 1 trials with the same
start-up settings, their per-step knobs left to the sampler: they run on the server the first
one started, so a study starts a server for about one trial in :data:`GROUP` instead of every
trial. The simulator starts no server, and its studies are never grouped. A shared study's
workers group theirs too: a sibling another worker claims first starts a server there."""

from __future__ import annotations

from collections.abc import Callable

import optuna

from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.search_spaces.space import SearchSpace

GROUP = 3
"""Trials per server start: the first the sampler's, the rest with its start-up settings."""
SIBLING_ATTR = "server_of"
"""User attribute of a trial queued to run on another trial's server (that trial's number)."""

Callback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


def startup_params(space: SearchSpace, engine: TrialEngine) -> list[str]:
    """The Optuna parameters of the searched knobs a server needs a restart for; empty when
    no searched knob is one the engine's servers take while running (nothing to group)."""
    live = set(engine.live_knobs) & set(space.ranges)
    if not live:
        return []
    return [r.param for name, r in space.ranges.items() if name not in live]


def group_by_server(space: SearchSpace, engine: TrialEngine, trials: int) -> Callback | None:
    """The ``study.optimize`` callback that queues a finished trial's siblings (``None``:
    nothing to group), never past the study's ``trials`` and never ahead of trials already
    queued (the baseline, the rule trials, retries)."""
    params = startup_params(space, engine)
    if not params:
        return None

    def queue_siblings(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if SIBLING_ATTR in trial.user_attrs or trial.state != optuna.trial.TrialState.COMPLETE:
            return
        # Other workers' running trials count too (``tune worker``: never past ``trials``).
        states = (
            optuna.trial.TrialState.COMPLETE,
            optuna.trial.TrialState.WAITING,
            optuna.trial.TrialState.RUNNING,
        )
        counted = study.get_trials(deepcopy=False, states=states)
        if any(t.state == optuna.trial.TrialState.WAITING for t in counted):
            return
        fixed = {name: trial.params[name] for name in params if name in trial.params}
        if len(fixed) != len(params):
            return
        for _ in range(min(GROUP - 1, trials - len(counted))):
            study.enqueue_trial(fixed, user_attrs={SIBLING_ATTR: trial.number})

    return queue_siblings
