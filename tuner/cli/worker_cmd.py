"""``tune worker``: run trials of a shared study until it has its target of trials."""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer

from prefill_tuner import defaults, exit_codes
from prefill_tuner.cli.declared_options import group
from prefill_tuner.cli.display import (
    WorkerDisplay,
    error_console,
    quiet_optuna,
)
from prefill_tuner.cli.options import ENGINE, SeedOpt, StorageOpt, with_options
from prefill_tuner.engines.factory import EngineOptions, build_engine
from prefill_tuner.errors import TunerError
from prefill_tuner.stopping import stop_signals
from prefill_tuner.storage.store import TunerStore, redact_url
from prefill_tuner.study.plan import check_study_name
from prefill_tuner.worker.definition import plan_from_record
from prefill_tuner.worker.loop import run_worker
from prefill_tuner.worker.shared import Liveness, open_shared_study

LIVENESS = group(Liveness, ("heartbeat_s", "grace_s"), panel="Worker")
"""A worker's heartbeats and the grace before a silent one is taken for dead."""


@with_options(liveness=LIVENESS, engine=ENGINE)
def worker_command(
    study_name: Annotated[
        str, typer.Option("--study", help="The shared study (created by tune run).")
    ],
    storage: StorageOpt = defaults.STORAGE,
    trace_file: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="This machine's copy of the study's trace (default: the path recorded with "
            "the study); it must be the same file (sha256).",
        ),
    ] = None,
    seed: SeedOpt = 0,
    name: Annotated[
        str | None, typer.Option("--name", help="This worker's name (default: HOST:PID).")
    ] = None,
    *,
    liveness: Liveness,
    engine: EngineOptions,
) -> None:
    """Run trials of a shared study (any number of workers, on any machines) until it has its
    target of trials; the study comes from `tune run ... --create-only`."""
    check_study_name(study_name)
    quiet_optuna()
    store = TunerStore(storage, create=False)  # the study must exist
    record = store.get_study(study_name)
    if record is None:
        names = ", ".join(store.study_names()) or "none"
        raise TunerError(
            f"--study {study_name}: no such study in {redact_url(storage)} (studies: {names}); "
            "create it with tune run ... --create-only"
        )
    if engine.engine != record.engine:  # before a real engine is probed
        raise TunerError(
            f"study {study_name!r} runs on the {record.engine} engine: "
            f"give --engine {record.engine}"
        )
    options = dataclasses.replace(engine, model=record.model)
    with closing(build_engine(options, record.space.get("fixed"))) as trial_engine:
        plan = plan_from_record(
            record,
            storage_url=storage,
            engine=trial_engine,
            seed=seed,
            trace_path=str(trace_file) if trace_file else None,
        )
        worker = name or f"{socket.gethostname()}:{os.getpid()}"
        shared = open_shared_study(
            plan,
            store,
            record,
            trial_engine,
            worker=worker,
            heartbeat_interval=liveness.heartbeat_s,
            grace_period=liveness.grace_s,
        )
        display = WorkerDisplay(error_console(), worker, plan)
        display.say(
            f"study {plan.name} ({plan.trials} trials) in {redact_url(storage)}, "
            f"{len(plan.trace):,} requests, on {trial_engine.version}"
        )
        try:
            with stop_signals(display.console):
                summary = run_worker(shared, liveness.heartbeat_s, display.events())
        except KeyboardInterrupt:
            if not display.interrupted:
                display.say("interrupted between trials")
            raise typer.Exit(exit_codes.INTERRUPTED) from None
        pareto = ["tune", "pareto", "--study", plan.name]
        if redact_url(storage) == storage and storage != defaults.STORAGE:  # no password to show
            pareto += ["--storage", storage]
        display.say(
            f"study {plan.name} has its {summary.complete} trials ({summary.ran} run here); "
            f"{shlex.join(pareto)} shows the results"
        )
