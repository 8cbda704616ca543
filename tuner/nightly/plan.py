"""What ``tune nightly`` was asked to do (shared by the night's run and its report)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefill_tuner import defaults
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.plan import StudyPlan


@dataclass(frozen=True)
class NightlyPlan:
    """What ``tune nightly`` was asked to do."""

    family: str
    plan: StudyPlan
    """The study plan of the night (its name is replaced by the generation's)."""
    report_dir: Path
    repeats: int = 3
    """Runs per configuration when re-measuring (1 on a deterministic engine)."""
    min_gain: float = defaults.MIN_GAIN
    deadline_s: float | None = None
    """Wall-clock limit for the whole night; the search gets what the measurements leave."""
    screen_profile: StepModel | None = None
    """The simulator profile to screen with (``--profile``); ``None``: fitted to the night's
    baseline (when the plan screens at all)."""
    verify: bool = False
    """Before promoting, check on the real engine that the challenger's chunking changes no
    output (:mod:`prefill_tuner.verify`); a failed check never promotes."""
