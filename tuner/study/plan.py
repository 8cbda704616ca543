"""A study's plan (what to tune, on which trace, against which SLOs), and the one pipeline that
builds it from what the user gave: engine → search space → trace shaping → trace → plan.
``tune run``, ``tune worker`` (through the stored definition) and ``tune nightly`` all use it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from prefill_tuner import defaults
from prefill_tuner.declared import Flag, check_declared, check_values
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.names import SAFE_NAME, check_name
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.scoring import Objective, latency_objectives
from prefill_tuner.objectives.slo import Slo, parse_slos
from prefill_tuner.search_spaces.space import (
    SearchSpace,
    build_space,
    load_space_file,
)
from prefill_tuner.study.windows import canonical, check_new_windows, judge_windows
from prefill_tuner.trace import load_trace
from prefill_tuner.trace.classes import check_slo_classes, class_counts
from prefill_tuner.trace.model import Trace
from prefill_tuner.trace.shaping import ShapeOptions

STUDY_NAME = SAFE_NAME
"""A study name: it becomes part of file and folder names (logs, nightly reports)."""

MAX_HEADROOM = 64.0
"""The largest load margin :attr:`StudyPlan.headroom` takes (the capacity search's bound)."""
RATE_MULTIPLIER = "rate_multiplier"
"""The objective of capacity studies: the highest trace-rate multiplier meeting every SLO."""


@dataclass(frozen=True)
class StudyPlan:
    """Everything a study run needs, as the user asked for it."""

    # The first paragraph of a field's docstring is the help of the option that sets it.
    name: Annotated[str, Flag("--study")]
    """Study name (default: TRACE-OBJECTIVE).

    The study's name in the storage; a resumed study keeps it."""
    trace: Trace
    """The trace, already shaped."""
    shaping: ShapeOptions
    """How it was shaped (stored, so a resume or a worker shapes it the same way)."""
    slos: Annotated[tuple[Slo, ...], Flag("--slo")]
    """SLO like p99_tpot=50ms or p95_ttft=2s (repeatable)."""
    space: SearchSpace
    storage_url: Annotated[str, Flag("--storage")] = defaults.STORAGE
    """Study database URL (SQLite file or PostgreSQL)."""
    model: str = defaults.MODEL
    """Model named in serve lines."""
    trials: Annotated[int, Field(ge=1, le=defaults.MAX_TRIALS)] = defaults.TRIALS
    """Trials of the study.

    The total of finished trials the study should have (a resumed study runs the rest)."""
    objective_mode: Annotated[Literal["latency", "capacity"], Flag("--objective")] = (
        defaults.OBJECTIVE
    )
    """latency: minimise the SLO'd percentiles; capacity: maximise the trace rate multiplier at
    which all SLOs hold."""
    error_budget: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of requests allowed to fail without violating the SLOs."""
    timeout_s: Annotated[float | None, Field(ge=1)] = None
    """Stop starting trials after this many seconds."""
    seed: Annotated[int, Field(ge=0, le=defaults.MAX_SEED)] = 0
    """Sampler seed.

    Offset by the number of trials so far on each resume."""
    sampler: Literal["tpe", "random"] = defaults.SAMPLER
    """tpe (multivariate TPE) or random: both run the engine's defaults first (the baseline
    every ratio is measured against); random then runs random points only, no rule-derived
    trials."""
    startup_trials: Annotated[int, Field(ge=1)] = defaults.STARTUP_TRIALS
    """Trials TPE samples at random before it models the results (the baseline included)."""
    rule_trials: bool = defaults.RULE_TRIALS
    """Latency studies: after the defaults, run a few settings derived from the trace's decode
    batch at the TPOT limit (a small token budget, the same with a per-prompt prefill cap, one
    with room for prefills) before the sampler's.

    The rules are :mod:`prefill_tuner.study.first_trials`'s; they run on the study's first run,
    not under the random sampler (a plain random search), and not in a screened study, whose
    screening candidates come first."""
    capacity_tolerance: Annotated[float, Field(ge=0.001, le=0.5)] = defaults.CAPACITY_TOLERANCE
    """Capacity bisection precision (relative).

    The bisection stops when hi / lo − 1 ≤ this."""
    early_abort: bool = True
    """Stop a real engine's replay once its SLOs are certainly missed (the trial is judged on
    lower bounds of what it would have measured).

    :mod:`prefill_tuner.objectives.early_abort`."""
    screen_trials: Annotated[int, Field(ge=0), Flag("--screen")] = 0
    """``engine`` vllm: after the baseline, fit the simulator to its step log (or use
    ``profile``), simulate this many trials, and run their Pareto-optimal settings on the server
    first (0: off). Workers of the study share the screening.

    :mod:`prefill_tuner.study.screening`."""
    judge_windows: Annotated[tuple[str, ...], Flag("--judge-window")] = ()
    """Also judge each trial on this window of the trace: busiest:SECONDS (the busiest stretch
    of that length) or START..END seconds (repeatable); a trial meets the SLOs only if it meets
    them on the whole trace and on every window.

    :mod:`prefill_tuner.study.windows`."""
    headroom: Annotated[float | None, Field(gt=1, le=MAX_HEADROOM)] = None
    """Required load margin: recommend only a setting that still meets the SLOs at this
    multiple of the trace's request rate (1.2 = 20% more load), checked on the simulator.

    ``None``: no margin is required (the recommendation still prefers a setting that carries
    1.25× and meets the SLOs with its budget and max_num_seqs moved a step;
    :mod:`prefill_tuner.study.headroom`). When no candidate carries the margin, the outputs
    say so and ``tune run`` exits 4."""
    headroom_check: Literal["sim", "engine", "off"] = "sim"
    """Where the headroom checks of the best settings run: sim (the simulator, or a real
    server's calibrated stand-in), engine (the study's own engine: server starts, minutes
    each) or off.

    :mod:`prefill_tuner.study.headroom`."""

    def __post_init__(self) -> None:
        """Each field as declared (its bounds and choices); an SLO naming a class that no
        request carries could never be judged: refused before any trial, listing the classes
        the trace has; so is a window without requests."""
        check_declared(self)
        judge_windows(self.trace, self.judge_windows)  # each has requests
        wanted = [slo.traffic_class for slo in self.slos if slo.traffic_class is not None]
        if wanted:
            check_slo_classes(class_counts(self.trace), wanted)

    @property
    def abort_rule(self) -> EarlyAbortRule | None:
        if not self.early_abort:
            return None
        reported = tuple(o.name for o in self.objectives if o.name != RATE_MULTIPLIER)
        return EarlyAbortRule(self.slos, self.error_budget, reported)

    @property
    def objectives(self) -> tuple[Objective, ...]:
        if self.objective_mode == "capacity":
            return (Objective(RATE_MULTIPLIER, "maximize"),)
        return latency_objectives(self.slos)


@dataclass(frozen=True)
class TraceSpec:
    """Which trace file, how to read it, and how to shape it (the plan clips it to the
    engine's context length)."""

    path: Path
    """The trace file to replay (JSONL, Azure or BurstGPT CSV)."""
    format: str | None = None
    """jsonl (= mooncake, native), azure, burstgpt, csv (named columns), vllm-bench, guidellm or
    aiperf (default: detected from the content)."""
    sort: bool = False
    """Sort out-of-order arrivals instead of refusing the file."""
    shaping: ShapeOptions = field(default_factory=ShapeOptions)


@dataclass(frozen=True)
class SpaceSpec:
    """What the user fixed and where knobs are searched."""

    fixed: Annotated[Mapping[str, Any], Flag("--set")] = field(default_factory=dict)
    """Fixed engine setting, e.g. max_model_len=32768 (repeatable).

    Settings every trial runs with, by vLLM's name: ``{"max_model_len": 32768}``."""
    ranges: Annotated[Mapping[str, str], Flag("--space")] = field(default_factory=dict)
    """Knob range, e.g. max_num_batched_tokens=256..16384 (repeatable).

    By knob, as ``LOW..HIGH``: ``{"max_num_batched_tokens": "256..16384"}``; they win over
    ``space_file``'s."""
    space_file: Path | None = None
    """YAML file of knob ranges."""


def check_study_name(name: str, option: str = "`name`") -> str:
    """``name``, if it is a safe study name (:data:`STUDY_NAME`); a one-line error if not."""
    return check_name(name, "study", option)


SCREEN_SUFFIX = "-screen"
"""A screened study ``NAME`` keeps its simulated study as ``NAME-screen``."""


def screen_study_name(name: str) -> str:
    return f"{name}{SCREEN_SUFFIX}"


def default_study_name(trace: Path, objective_mode: str) -> str:
    """``TRACE-OBJECTIVE`` from the trace file's name, made safe."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", trace.stem).strip("-._")[:80] or "trace"
    return f"{stem}-{objective_mode}"


def search_space_for(engine: TrialEngine, spec: SpaceSpec) -> SearchSpace:
    """The search space for this engine; a setting it cannot take fails here, before any
    work."""
    fixed = engine.validate_fixed(dict(spec.fixed))
    overrides = load_space_file(spec.space_file) if spec.space_file else {}
    if overrides:  # its own errors name the file, and the knob as the file writes it
        try:
            build_space(engine.capabilities, overrides, fixed)
        except TunerError as exc:
            message = str(exc).removeprefix("`ranges` ").removeprefix("`ranges`: ")
            raise TunerError(f"{spec.space_file}: {message}") from None
    overrides.update(spec.ranges)
    return build_space(engine.capabilities, overrides, fixed)


def build_plan(
    engine: TrialEngine,
    trace: TraceSpec,
    space: SpaceSpec = SpaceSpec(),
    *,
    slos: list[str],
    name: str | None = None,
    objective_mode: str = defaults.OBJECTIVE,
    sampler: str = defaults.SAMPLER,
    screen_trials: int = 0,
    storage_url: str = defaults.STORAGE,
    model: str = defaults.MODEL,
    trials: int = defaults.TRIALS,
    error_budget: float = 0.0,
    timeout_s: float | None = None,
    seed: int = 0,
    startup_trials: int = defaults.STARTUP_TRIALS,
    rule_trials: bool = defaults.RULE_TRIALS,
    capacity_tolerance: float = defaults.CAPACITY_TOLERANCE,
    early_abort: bool = True,
    judge_windows: tuple[str, ...] = (),
    headroom: float | None = None,
    headroom_check: str = "sim",
) -> StudyPlan:
    """Everything a study needs, checked before any trial: the SLOs, the space for this engine,
    and the trace shaped and clipped to the engine's context length. The keywords are the
    :class:`StudyPlan` fields of the same names.

    ``name`` defaults to ``TRACE-OBJECTIVE`` (the trace file's stem)."""
    parsed_slos = parse_slos(slos)
    check_values(StudyPlan, objective_mode=objective_mode, sampler=sampler)  # before any work
    if screen_trials:
        if not engine.starts_servers:
            raise TunerError(
                "`screen_trials`: only with `engine` vllm (it screens for a real server)"
            )
        if objective_mode != "latency":
            raise TunerError("`screen_trials`: only with `objective_mode` latency")
    search = search_space_for(engine, space)
    shedding = [name for name, r in search.ranges.items() if r.knob.sheds_load]
    if shedding and not error_budget:
        raise TunerError(
            f"`ranges` {shedding[0]}: it turns requests away (HTTP 503), and with no error "
            "budget every request turned away fails the SLOs: search it with `error_budget` "
            "above 0 (--error-budget), or fix it with `fixed`"
        )
    shaping = trace.shaping.model_copy(
        update={"max_model_len": engine.max_model_len(search.fixed), "over_length": "clip"}
    )
    requests = load_trace(str(trace.path), trace.format, sort=trace.sort, options=shaping)
    check_new_windows(requests, judge_windows)
    return StudyPlan(
        name=(
            check_study_name(name)
            if name is not None
            else default_study_name(trace.path, objective_mode)
        ),
        trace=requests,
        shaping=shaping,
        slos=parsed_slos,
        space=search,
        objective_mode=objective_mode,  # type: ignore[arg-type]
        sampler=sampler,  # type: ignore[arg-type]
        screen_trials=screen_trials,
        storage_url=storage_url,
        model=model,
        trials=trials,
        error_budget=error_budget,
        timeout_s=timeout_s,
        seed=seed,
        startup_trials=startup_trials,
        rule_trials=rule_trials,
        capacity_tolerance=capacity_tolerance,
        early_abort=early_abort,
        judge_windows=tuple(canonical(spec) for spec in judge_windows),
        headroom=headroom,
        headroom_check=headroom_check,  # type: ignore[arg-type]
    )
