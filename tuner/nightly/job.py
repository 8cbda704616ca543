"""What ``tune nightly`` is asked to do: the night's job (shared by its run and its outputs)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from prefill_tuner import defaults
from prefill_tuner.declared import Flag, check_declared
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.errors import TunerError
from prefill_tuner.files import check_output
from prefill_tuner.study.plan import StudyPlan


@dataclass(frozen=True)
class NightlyJob:
    """What ``tune nightly`` was asked to do."""

    # The first paragraph of a field's docstring is the help of the option that sets it.
    family: Annotated[str, Flag("--study")]
    """Study family: each night is a new generation, study NAME-gN."""
    plan: StudyPlan
    """The study plan of the night (its name is replaced by the generation's)."""
    report_dir: Path = defaults.REPORT_DIR
    """Where the dated report and the serve lines (DIR/STUDY/serve.sh, serve.yaml) go."""
    repeats: Annotated[int, Field(ge=1, le=defaults.MAX_REPEATS)] = defaults.REPEATS
    """Runs of the incumbent and of the challenger on tonight's trace, to tell a real gain from
    noise (1 on the deterministic simulator)."""
    min_gain: Annotated[float, Field(ge=0)] = defaults.MIN_GAIN
    """Least median gain in headroom (share of the tightest SLO limit) worth a promotion."""
    deadline_s: Annotated[float | None, Field(ge=1)] = None
    """Seconds the whole night may take (measurements included); the search stops starting
    trials in time to re-measure its challenger."""
    screen_profile: StepModel | None = None
    """The simulator profile to screen with (``--profile``); ``None``: fitted to the night's
    baseline (when the plan screens at all)."""
    verify: bool = False
    """``engine`` vllm: before promoting, check that the challenger's chunking changes no
    output (tune verify); a failed check keeps the incumbent, exit 5.

    :mod:`prefill_tuner.engines.real.verify`."""
    html_report: bool = True
    """Besides the Markdown report and the serve lines, write the generation's HTML report
    beside them (:mod:`prefill_tuner.output.html`)."""

    def __post_init__(self) -> None:
        """Each field as declared; where the report goes is checked before any trial runs: a
        night's trials must not be spent on a report that cannot be written (a file, or
        /dev/zero, as the folder)."""
        check_declared(self)
        check_report_folder(self.report_dir / self.family)


def check_report_folder(folder: Path) -> None:
    """``folder`` is one, or can be made (its nearest existing ancestor is a folder we may
    write in), and its serve files, if there, are regular files; else a one-line error."""
    existing = next(path for path in (folder, *folder.parents) if os.path.lexists(path))
    if not existing.is_dir():
        raise TunerError(
            f"`report_dir`: {existing} is not a folder (the night's report goes in {folder})"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TunerError(f"`report_dir`: cannot write in {existing} (the report goes in {folder})")
    if existing == folder:
        for name in ("serve.sh", "serve.yaml"):
            check_output(folder / name)
