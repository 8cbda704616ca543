"""``tune nightly``: one night of retuning, with an exit code a pipeline can act on."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from objectives.slo import parse_slos
from storage.store import TunerStore
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
    interrupt,
    shape_options,
)
from tuner.cli.run_cmd import (
    DEFAULT_MODEL,
    DEFAULT_STORAGE,
    EXIT_INTERRUPTED,
    ErrorBudgetOpt,
    ModelOpt,
    ProgressDisplay,
    SeedOpt,
    SetOpt,
    SloOpt,
    SpaceFileOpt,
    SpaceOpt,
    StorageOpt,
    TraceOpt,
    print_study_header,
    quiet_optuna,
    search_space_for,
)
from tuner.cli.simulate_cmd import DEFAULT_PROFILE
from tuner.engines.real.guard import DEFAULT_HANG_TIMEOUT_S
from tuner.nightly.promotion import DEFAULT_MIN_GAIN
from tuner.nightly.retune import NightlyPlan, retune
from tuner.study import StudyPlan
from tuner.trace import load_trace


def nightly_command(
    study: Annotated[
        str,
        typer.Option(
            "--study", help="Study family: each night is a new generation, study NAME-gN."
        ),
    ],
    trace_file: TraceOpt,
    slo: SloOpt,
    storage: StorageOpt = DEFAULT_STORAGE,
    trials: Annotated[
        int, typer.Option("--trials", min=1, help="Trials of tonight's search.")
    ] = 30,
    deadline: Annotated[
        float | None,
        typer.Option(
            "--deadline",
            min=1,
            help="Seconds the whole night may take (measurements included); the search "
            "stops starting trials in time to re-measure its challenger.",
        ),
    ] = None,
    repeats: Annotated[
        int,
        typer.Option(
            "--repeats",
            min=1,
            help="Runs of the incumbent and of the challenger on tonight's trace, to tell a "
            "real gain from noise (1 on the deterministic simulator).",
        ),
    ] = 3,
    min_gain: Annotated[
        float,
        typer.Option(
            "--min-gain",
            min=0,
            help="Least median gain in headroom (share of the tightest SLO limit) worth a "
            "promotion.",
        ),
    ] = DEFAULT_MIN_GAIN,
    report_dir: Annotated[
        Path,
        typer.Option(
            "--report-dir",
            help="Where the dated report and the serve lines (DIR/STUDY/serve.sh, serve.yaml) go.",
        ),
    ] = Path("nightly-reports"),
    engine: EngineOpt = "sim",
    model: ModelOpt = DEFAULT_MODEL,
    profile: ProfileOpt = DEFAULT_PROFILE,
    seed: SeedOpt = 0,
    space: SpaceOpt = None,
    space_file: SpaceFileOpt = None,
    set_values: SetOpt = None,
    error_budget: ErrorBudgetOpt = 0.0,
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
    """Retune on tonight's trace and promote a new configuration only when it beats the
    incumbent beyond noise. Exit code 0: kept; 3: promoted (new serve lines); 4: nothing
    meets the SLOs; 2: bad input; 130: interrupted."""
    slos = parse_slos(slo)
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
    plan = StudyPlan(
        name=study,
        storage_url=storage,
        trace=trace,
        shaping=options,
        slos=slos,
        space=search,
        model=model,
        trials=trials,
        error_budget=error_budget,
        seed=seed,
    )
    nightly = NightlyPlan(
        family=study,
        plan=plan,
        report_dir=report_dir,
        repeats=repeats,
        min_gain=min_gain,
        deadline_s=deadline,
    )
    err = Console(stderr=True, highlight=False)
    print_study_header(err, plan, trace_file, trial_engine.version)
    quiet_optuna()
    store = TunerStore(storage)

    def say(text: str) -> None:
        err.print(escape(f"nightly {study}: {text}"), soft_wrap=True)

    previous = signal.signal(signal.SIGTERM, interrupt)  # a stopped service: as Ctrl-C
    try:
        with ProgressDisplay(err, plan, verbose=trial_engine.name != "sim") as display:
            outcome = retune(nightly, trial_engine, store, display.progress, say)
    except KeyboardInterrupt:
        err.print(
            "interrupted: finished trials are kept; run the same command to resume tonight's "
            "generation"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = Console(highlight=False, soft_wrap=True)
    out.print(
        f"generation {outcome.generation} ({outcome.study_name}): "
        f"{outcome.decision.action}: {outcome.decision.reason}"
    )
    if outcome.serve_command:
        out.print(outcome.serve_command)
    out.print(f"report: {outcome.report_path}")
    raise typer.Exit(outcome.exit_code)
