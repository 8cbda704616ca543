"""``tune run``, ``tune pareto``, ``tune export``: the tuning study and its results."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from objectives.scoring import Objective
from objectives.slo import format_seconds, parse_slos
from search_spaces.knobs import KNOBS
from search_spaces.space import (
    SearchSpace,
    build_space,
    load_space_file,
    parse_assignments,
    parse_value,
)
from storage.store import TunerStore, redact_url
from tuner.cli.engine_options import (
    EngineOpt,
    HangTimeoutOpt,
    LogDirOpt,
    ProfileOpt,
    ServeCmdOpt,
    ServerArgOpt,
    ServerEnvOpt,
    VllmPythonOpt,
    build_engine,
)
from tuner.cli.options import (
    DequantizeOpt,
    DurationOpt,
    FormatOpt,
    JitterSeedOpt,
    MaxRequestsOpt,
    RateScaleOpt,
    SortOpt,
    StartOpt,
    output_console,
    shape_options,
)
from tuner.cli.simulate_cmd import DEFAULT_PROFILE
from tuner.engines.base import TrialEngine
from tuner.engines.real.guard import DEFAULT_HANG_TIMEOUT_S
from tuner.errors import TunerError
from tuner.report import export, render_summary, summarize_study
from tuner.study import StudyPlan, StudyProgress, TrialResult, open_study, run_study
from tuner.trace import load_trace
from tuner.trace.native import atomic_write_lines
from tuner.worker.definition import definition_of

DEFAULT_STORAGE = "sqlite:///tune.db"
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EXIT_INTERRUPTED = 130

StorageOpt = Annotated[
    str,
    typer.Option(
        "--storage",
        envvar="TUNE_STORAGE",
        help="Study database URL (SQLite file or PostgreSQL); from $TUNE_STORAGE when not "
        "given, which keeps a password out of command lines and process lists.",
    ),
]
StudyOpt = Annotated[
    str | None, typer.Option("--study", help="Study name (default: TRACE-OBJECTIVE).")
]


TraceOpt = Annotated[Path, typer.Option("--trace", help="Trace file to replay.")]
SloOpt = Annotated[
    list[str], typer.Option("--slo", help="SLO like p99_tpot=50ms or p95_ttft=2s (repeatable).")
]
ModelOpt = Annotated[str, typer.Option("--model", help="Model named in serve lines.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Sampler seed.")]
SpaceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--space", help="Knob range, e.g. max_num_batched_tokens=256..16384 (repeatable)."
    ),
]
SpaceFileOpt = Annotated[
    Path | None, typer.Option("--space-file", help="YAML file of knob ranges.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Fixed engine setting, e.g. max_model_len=32768 (repeatable)."),
]
ErrorBudgetOpt = Annotated[
    float,
    typer.Option(
        "--error-budget",
        min=0,
        max=1,
        help="Share of requests allowed to fail without violating the SLOs.",
    ),
]


def run_command(
    trace_file: TraceOpt,
    slo: SloOpt,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="latency: minimise the SLO'd percentiles; capacity: maximise the "
            "trace rate multiplier at which all SLOs hold.",
        ),
    ] = "latency",
    trials: Annotated[int, typer.Option("--trials", min=1, help="Total trials of the study.")] = 30,
    create_only: Annotated[
        bool,
        typer.Option(
            "--create-only",
            help="Record the study (trace, SLOs, space, --trials target) and run no trial: "
            "`tune worker` processes run them.",
        ),
    ] = False,
    engine: EngineOpt = "sim",
    model: ModelOpt = DEFAULT_MODEL,
    profile: ProfileOpt = DEFAULT_PROFILE,
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", min=0, help="Stop starting trials after this many seconds."),
    ] = None,
    seed: SeedOpt = 0,
    sampler: Annotated[
        str, typer.Option("--sampler", help="tpe (multivariate TPE) or random.")
    ] = "tpe",
    space: SpaceOpt = None,
    space_file: SpaceFileOpt = None,
    set_values: SetOpt = None,
    error_budget: ErrorBudgetOpt = 0.0,
    capacity_tolerance: Annotated[
        float,
        typer.Option(
            "--capacity-tolerance", min=0.001, help="Capacity bisection precision (relative)."
        ),
    ] = 0.05,
    early_abort: Annotated[
        bool,
        typer.Option(
            "--early-abort/--no-early-abort",
            help="Stop a real engine's replay once its SLOs are certainly missed (the trial "
            "is judged on lower bounds of what it would have measured).",
        ),
    ] = True,
    vllm_python: VllmPythonOpt = None,
    serve_cmd: ServeCmdOpt = None,
    server_arg: ServerArgOpt = None,
    server_env: ServerEnvOpt = None,
    log_dir: LogDirOpt = Path("tune-logs"),
    hang_timeout: HangTimeoutOpt = DEFAULT_HANG_TIMEOUT_S,
    format: FormatOpt = None,
    sort: SortOpt = False,
    start: StartOpt = 0.0,
    duration: DurationOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    max_requests: MaxRequestsOpt = None,
    dequantize: DequantizeOpt = None,
    jitter_seed: JitterSeedOpt = 0,
) -> None:
    """Tune the scheduler settings for a trace and SLOs; print the Pareto-optimal settings."""
    slos = parse_slos(slo)
    if objective not in ("latency", "capacity"):
        raise TunerError(f"--objective: expected latency or capacity, got {objective!r}")
    if sampler not in ("tpe", "random"):
        raise TunerError(f"--sampler: expected tpe or random, got {sampler!r}")
    trial_engine = build_engine(
        engine,
        model=model,
        profile=profile,
        vllm_python=vllm_python,
        serve_cmd=serve_cmd,
        server_arg=server_arg,
        server_env=server_env,
        log_dir=log_dir,
        hang_timeout_s=hang_timeout,
    )
    search = search_space_for(trial_engine, set_values, space, space_file)
    options = shape_options(
        start,
        duration,
        rate_scale,
        trial_engine.max_model_len(search.fixed),
        "clip",
        max_requests,
        dequantize,
        jitter_seed,
    )
    trace = load_trace(str(trace_file), format, sort=sort, options=options)
    name = study_name or f"{trace_file.stem}-{objective}"
    plan = StudyPlan(
        name=name,
        storage_url=storage,
        trace=trace,
        shaping=options,
        slos=slos,
        space=search,
        model=model,
        trials=trials,
        objective_mode=objective,  # type: ignore[arg-type]
        error_budget=error_budget,
        timeout_s=timeout,
        seed=seed,
        sampler=sampler,  # type: ignore[arg-type]
        capacity_tolerance=capacity_tolerance,
        early_abort=early_abort,
    )
    err = Console(stderr=True, highlight=False)
    print_study_header(err, plan, trace_file, trial_engine.version)
    quiet_optuna()
    store = TunerStore(storage)
    opened = open_study(plan, store, trial_engine)  # a mismatched resume fails before any work
    store.record_definition(opened[1], trials, definition_of(plan, sort=sort))
    if create_only:
        err.print(
            f"study {name} recorded with a target of {trials} trials; run them with "
            f"tune worker --study {name} --storage {redact_url(storage)}",
            soft_wrap=True,
        )
        return
    interrupted = False
    # A line per trial when trials take minutes (a real engine); the bar alone otherwise.
    with ProgressDisplay(err, plan, verbose=trial_engine.name != "sim") as display:
        try:
            study = run_study(plan, trial_engine, store, display.progress, opened)
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        err.print("interrupted: every finished trial is kept; run the same command to resume")
        study = optuna.load_study(study_name=name, storage=storage)
    _print_results(store, study, name, search.ranges)
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


def search_space_for(
    trial_engine: TrialEngine,
    set_values: list[str] | None,
    space: list[str] | None,
    space_file: Path | None,
) -> SearchSpace:
    """The search space from ``--set``, ``--space`` and ``--space-file``, for this engine
    (unknown ``--set`` names fail here, before any work)."""
    fixed = {k: parse_value(v) for k, v in parse_assignments(set_values or [], "--set").items()}
    overrides = load_space_file(space_file) if space_file else {}
    overrides.update(parse_assignments(space or [], "--space"))
    trial_engine.validate_fixed(fixed)
    return build_space(trial_engine.capabilities, overrides, fixed)


def print_study_header(console: Console, plan: StudyPlan, trace_file: Path, version: str) -> None:
    """What is about to be tuned: the study, the trace, the engine, the space."""
    console.print(
        f"study {plan.name} on {trace_file} ({len(plan.trace):,} requests) with {version}"
    )
    for line in plan.space.describe():
        console.print(f"  search {line}")
    for dropped in plan.space.dropped:
        console.print(f"  dropped {dropped}")
    for note in plan.trace.adjustments:
        console.print(f"  trace: {note}")


def quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("optuna").setLevel(logging.ERROR)


class ProgressDisplay:
    """A progress bar with the best feasible result so far."""

    def __init__(self, console: Console, plan: StudyPlan, verbose: bool = False) -> None:
        self.plan, self.verbose = plan, verbose
        self.bar = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        )
        self.task = self.bar.add_task("no feasible trial yet", total=None)
        self.best: TrialResult | None = None
        self.progress = StudyProgress(on_start=self._start, on_trial=self._trial)

    def __enter__(self) -> ProgressDisplay:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def _start(self, finished: int, remaining: int) -> None:
        self.bar.update(self.task, total=finished + remaining, completed=finished)

    def _trial(self, result: TrialResult) -> None:
        objectives = self.plan.objectives
        if result.verdict.feasible:
            first = objectives[0]
            better = self.best is None or (result.values[0] < self.best.values[0]) == (
                first.direction == "minimize"
            )
            if better:
                self.best = result
        description = "no feasible trial yet"
        if self.best is not None:
            shown = ", ".join(
                f"{o.name} {_value(o.name, v)}"
                for o, v in zip(objectives, self.best.values, strict=True)
            )
            description = f"best feasible (trial {self.best.number}): {shown}"
        self.bar.update(self.task, advance=1, description=description)
        if self.verbose:
            self.bar.console.print(escape(trial_line(result, objectives)), soft_wrap=True)


def _value(name: str, value: float) -> str:
    return f"{value:.3g}×" if name == "rate_multiplier" else format_seconds(value)


def trial_line(result: TrialResult, objectives: Sequence[Objective]) -> str:
    """One line per finished trial: its values, its verdict, and why it failed or was cut
    short."""
    shown = ", ".join(
        f"{o.name} {'≥ ' if result.cut_short else ''}{_value(o.name, v)}"
        for o, v in zip(objectives, result.values, strict=True)
    )
    verdict = "meets the SLOs" if result.verdict.feasible else "misses the SLOs"
    why = ""
    if result.failure:
        why = f"; failed: {result.failure}"
    elif result.cut_short:
        why = f"; cut short: {result.cut_short}"
    return f"trial {result.number} {verdict}: {shown}{why}"


def _load(storage: str, name: str | None) -> tuple[TunerStore, optuna.Study, str]:
    store = TunerStore(storage)
    names = store.study_names()
    if name is None:
        if len(names) != 1:
            listing = ", ".join(names) if names else "none"
            raise TunerError(f"--study: name the study (studies in {storage}: {listing})")
        name = names[0]
    if name not in names:
        raise TunerError(
            f"--study {name}: no such study in {storage} (studies: {', '.join(names) or 'none'})"
        )
    quiet_optuna()
    return store, optuna.load_study(study_name=name, storage=storage), name


def _print_results(store: TunerStore, study: optuna.Study, name: str, knobs: Any) -> None:
    record = store.get_study(name)
    assert record is not None
    summary = summarize_study(study, record, store.trials(record))
    output_console().print(render_summary(summary, list(knobs) or list(KNOBS)))


def pareto_command(study_name: StudyOpt = None, storage: StorageOpt = DEFAULT_STORAGE) -> None:
    """Print a stored study's Pareto-optimal settings and serve lines again."""
    store, study, name = _load(storage, study_name)
    record = store.get_study(name)
    assert record is not None
    trials = store.trials(record)
    searched = [
        knob
        for knob in KNOBS
        if any(knob in t.params or f"{knob}_log2" in t.params for t in trials)
    ]
    _print_results(store, study, name, searched)


def export_command(
    format: Annotated[str, typer.Option("--format", help="shell, yaml or json.")] = "shell",
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
) -> None:
    """Export a study's recommended settings (and Pareto alternatives) for deployment."""
    if format not in ("shell", "yaml", "json"):
        raise TunerError(f"--format: expected shell, yaml or json, got {format!r}")
    store, study, name = _load(storage, study_name)
    record = store.get_study(name)
    assert record is not None
    summary = summarize_study(study, record, store.trials(record))
    if summary.recommended is None:
        raise TunerError(
            f"study {name}: no trial met the SLOs, nothing to export "
            "(tune pareto shows the closest trials)"
        )
    text = export(summary, record.model, format)
    if output is None:
        sys.stdout.write(text)
    else:
        atomic_write_lines(output, [text])
        Console(stderr=True).print(f"wrote {output}")
