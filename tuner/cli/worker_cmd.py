"""``tune worker``: run trials of a shared study until it has its target of trials."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

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
from tuner.cli.options import interrupt
from tuner.cli.run_cmd import (
    DEFAULT_STORAGE,
    EXIT_INTERRUPTED,
    StorageOpt,
    quiet_optuna,
    trial_line,
)
from tuner.cli.simulate_cmd import DEFAULT_PROFILE
from tuner.engines.real.guard import DEFAULT_HANG_TIMEOUT_S
from tuner.errors import TunerError
from tuner.study import StudyPlan, TrialResult
from tuner.worker.claim import Claimed, Wait
from tuner.worker.definition import plan_from_record
from tuner.worker.loop import WorkerEvents, run_worker
from tuner.worker.shared import open_shared_study


def worker_command(
    study_name: Annotated[
        str, typer.Option("--study", help="The shared study (created by tune run).")
    ],
    storage: StorageOpt = DEFAULT_STORAGE,
    trace_file: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="This machine's copy of the study's trace (default: the path recorded with "
            "the study); it must be the same file (sha256).",
        ),
    ] = None,
    engine: EngineOpt = "sim",
    profile: ProfileOpt = DEFAULT_PROFILE,
    seed: Annotated[
        int, typer.Option("--seed", help="Sampler seed (added to a per-trial offset).")
    ] = 0,
    heartbeat: Annotated[
        int, typer.Option("--heartbeat", min=1, help="Seconds between a trial's heartbeats.")
    ] = 15,
    grace: Annotated[
        int,
        typer.Option(
            "--grace",
            min=1,
            help="Seconds without a heartbeat after which a trial's worker is taken for dead: "
            "its trial is failed and run again by another worker.",
        ),
    ] = 60,
    name: Annotated[
        str | None, typer.Option("--name", help="This worker's name (default: HOST:PID).")
    ] = None,
    vllm_python: VllmPythonOpt = None,
    serve_cmd: ServeCmdOpt = None,
    server_arg: ServerArgOpt = None,
    server_env: ServerEnvOpt = None,
    log_dir: LogDirOpt = Path("tune-logs"),
    hang_timeout: HangTimeoutOpt = DEFAULT_HANG_TIMEOUT_S,
) -> None:
    """Run trials of a shared study (any number of workers, on any machines) until it has its
    target of trials; the study comes from `tune run ... --create-only`."""
    if grace <= heartbeat:
        raise TunerError(f"--grace {grace}: must be longer than --heartbeat {heartbeat}")
    quiet_optuna()
    store = TunerStore(storage)
    record = store.get_study(study_name)
    if record is None:
        names = ", ".join(store.study_names()) or "none"
        raise TunerError(
            f"--study {study_name}: no such study in {redact_url(storage)} (studies: {names}); "
            "create it with tune run ... --create-only"
        )
    if engine != record.engine:  # before a real engine is probed
        raise TunerError(
            f"study {study_name!r} runs on the {record.engine} engine: "
            f"give --engine {record.engine}"
        )
    trial_engine = build_engine(
        engine,
        model=record.model,
        profile=profile,
        vllm_python=vllm_python,
        serve_cmd=serve_cmd,
        server_arg=server_arg,
        server_env=server_env,
        log_dir=log_dir,
        hang_timeout_s=hang_timeout,
    )
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
        heartbeat_interval=heartbeat,
        grace_period=grace,
    )
    display = _WorkerDisplay(Console(stderr=True, highlight=False), worker, plan)
    display.say(
        f"study {plan.name} ({plan.trials} trials) in {redact_url(storage)}, "
        f"{len(plan.trace):,} requests, on {trial_engine.version}"
    )
    previous = signal.signal(signal.SIGTERM, interrupt)  # a stopped container: as Ctrl-C
    try:
        summary = run_worker(shared, heartbeat, display.events())
    except KeyboardInterrupt:
        if not display.interrupted:
            display.say("interrupted between trials")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    display.say(
        f"study {plan.name} has its {summary.complete} trials ({summary.ran} run here); "
        f"tune pareto --study {plan.name} --storage {redact_url(storage)} shows the results"
    )


class _WorkerDisplay:
    """One line per event, prefixed with the worker's name (logs of many machines mix)."""

    def __init__(self, console: Console, worker: str, plan: StudyPlan) -> None:
        self.console, self.worker, self.plan = console, worker, plan
        self.interrupted = False

    def say(self, text: str) -> None:
        self.console.print(escape(f"worker {self.worker}: {text}"), soft_wrap=True)

    def events(self) -> WorkerEvents:
        return WorkerEvents(
            claimed=self._claimed,
            finished=self._finished,
            waiting=self._waiting,
            lost=lambda number: self.say(
                f"trial {number} was failed by another worker (heartbeats late by more than "
                "--grace) and queued again; this result is dropped"
            ),
            gave_up=self._gave_up,
        )

    def _claimed(self, claim: Claimed) -> None:
        retry = f" (retry of trial {claim.retry_of})" if claim.retry_of is not None else ""
        self.say(f"trial {claim.trial.number} started{retry}")

    def _finished(self, result: TrialResult) -> None:
        self.say(trial_line(result, self.plan.objectives))

    def _waiting(self, wait: Wait) -> None:
        self.say(f"waiting: {wait.running} trial(s) still running on other workers")

    def _gave_up(self, number: int | None) -> None:
        self.interrupted = True
        if number is None:
            self.say("interrupted")
        else:
            self.say(f"interrupted: trial {number} marked failed and queued for another worker")
