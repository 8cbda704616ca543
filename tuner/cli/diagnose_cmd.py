"""``tune diagnose``: what a run shows, as an expert would read it, and the knob to move."""

from __future__ import annotations

import dataclasses
import json
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

import typer

from prefill_tuner import defaults
from prefill_tuner.cli.display import output_console
from prefill_tuner.cli.options import (
    HARDWARE,
    REAL_SERVER,
    SIM_CONFIG,
    TRACE,
    JsonOpt,
    ModelOpt,
    SimSettings,
    StorageOpt,
    TraceChoice,
    with_options,
)
from prefill_tuner.cli.stored import open_stored
from prefill_tuner.diagnosis import Finding, RunView, diagnose, logged_view, simulated_view
from prefill_tuner.diagnosis.runs import trial_view
from prefill_tuner.engines.factory import EngineOptions, build_engine
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.errors import TunerError
from prefill_tuner.trace import load_trace
from prefill_tuner.trace.model import Trace


@with_options(engine=SIM_CONFIG, trace=TRACE, real=REAL_SERVER, hardware=HARDWARE)
def diagnose_command(
    study_name: Annotated[
        str | None, typer.Option("--study", help="Diagnose a trial of this study.")
    ] = None,
    trial: Annotated[
        int | None,
        typer.Option("--trial", min=0, help="The trial (default: the baseline)."),
    ] = None,
    storage: StorageOpt = defaults.STORAGE,
    trace_file: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="Or simulate this trace with the scheduler flags below (with --study: where "
            "the study's trace is now, if it moved, checked by its sha256).",
        ),
    ] = None,
    steps_file: Annotated[
        Path | None,
        typer.Option(
            "--steps",
            help="Or read this step trace (tune simulate --steps-out, or a real trial's "
            "LABEL.steps.jsonl) with the scheduler flags below as its settings.",
        ),
    ] = None,
    engine_name: Annotated[
        str,
        typer.Option(
            "--engine",
            help="With --trace: sim (simulate it) or vllm (replay it on a real server with "
            "the flags given, and read the server's step log and the request records).",
        ),
    ] = "sim",
    model: ModelOpt = defaults.MODEL,
    as_json: JsonOpt = False,
    *,
    engine: SimSettings,
    trace: TraceChoice,
    real: EngineOptions,
    hardware: ProfileSpec,
) -> None:
    """Name what a run shows (spikes, prefill starvation, KV thrashing, admission stalls,
    fragmented steps), with its evidence and the knob to move."""
    moved = trace_file if study_name is not None else None  # --study S --trace: where S's is
    given = [name for name, value in (("--study", study_name), ("--trace", trace_file),
                                      ("--steps", steps_file)) if value is not None]  # fmt: skip
    if moved is not None:
        given.remove("--trace")
    if len(given) != 1:
        raise TunerError(
            "give one run to diagnose: --study NAME [--trial N], --trace FILE or --steps FILE"
        )
    if trial is not None and study_name is None:
        raise TunerError("--trial: only with --study")
    if engine_name not in ("sim", "vllm"):
        raise TunerError(f"--engine: expected sim or vllm, got {engine_name!r}")
    if engine_name == "vllm" and trace_file is None:
        raise TunerError("--engine vllm: only with --trace (it replays the trace on a server)")
    if study_name is not None:
        view, what = _stored(study_name, trial, storage, moved)
    elif engine_name == "vllm":
        assert trace_file is not None
        requests = load_trace(str(trace_file), trace.format, sort=trace.sort, options=trace.shaping)
        options = dataclasses.replace(real, model=model)
        view = _replayed(requests, engine.settings, options, trace.shaping.max_concurrency)
        what = f"{trace_file}, replayed on {model}"
    else:
        engine_profile = hardware.step_model(model, engine.settings.get("max_model_len"))
        config = engine.config(engine_profile)
        if steps_file is not None:
            view = logged_view(steps_file, config.model_dump())
            what = str(steps_file)
        else:
            assert trace_file is not None
            requests = load_trace(
                str(trace_file), trace.format, sort=trace.sort, options=trace.shaping
            )
            limit = trace.shaping.max_concurrency
            view = simulated_view(requests, config, engine_profile, max_concurrency=limit)
            what = f"{trace_file}, simulated"
    findings = diagnose(view)
    if as_json:
        typer.echo(json.dumps(_document(what, view, findings), indent=2))
        return
    _print(what, view, findings)


def _replayed(
    requests: Trace, settings: dict[str, Any], options: EngineOptions, limit: int | None
) -> RunView:
    """Replay the trace on a real server with ``settings`` (to the end, under the client's
    ``limit``, if any) and read its run."""
    with closing(build_engine(options)) as server:
        fixed = server.validate_fixed({k: v for k, v in settings.items() if v is not None})
        run = server.run(requests, fixed, label="diagnose", max_concurrency=limit)
    if run.failure or run.records is None:
        raise TunerError(f"the replay failed: {run.failure or 'no request records'}")
    steps = (run.details.get("server_steps") or {}).get("trace")
    if not steps:
        raise TunerError("the server wrote no step log (its vLLM version has no step details)")
    scheduler = run.resolved_config.get("scheduler_config") or {}
    started = run.details.get("replay_started_unix_s")
    return logged_view(Path(steps), {**scheduler, **fixed}, requests, run.records, started)


def _stored(
    study_name: str, trial: int | None, storage: str, moved: Path | None
) -> tuple[RunView, str]:
    store, name = open_stored(study_name, storage, trace=moved)
    record = store.get_study(name)
    assert record is not None
    trials = store.trials(record)
    if not trials:
        raise TunerError(f"study {name} has no finished trial yet; nothing to diagnose")
    chosen = next(
        (t for t in trials if (t.trial_number == trial if trial is not None else t.is_baseline)),
        None,
    )
    if chosen is None:
        numbers = ", ".join(str(t.trial_number) for t in trials)
        which = "the baseline" if trial is None else f"--trial {trial}"
        raise TunerError(f"{which}: study {name} has no such finished trial (trials: {numbers})")
    label = " (the baseline)" if chosen.is_baseline else ""
    return trial_view(record, chosen), f"study {name}, trial {chosen.trial_number}{label}"


def _document(what: str, view: RunView, findings: list[Finding]) -> dict[str, object]:
    return {
        "run": what,
        "source": view.source,
        "steps": len(view.steps),
        "notes": view.notes,
        "findings": [
            {
                "symptom": f.symptom,
                "summary": f.summary,
                "evidence": list(f.evidence),
                "knob": f.knob,
                "severity": f.severity,
            }
            for f in findings
        ],
    }


def _print(what: str, view: RunView, findings: list[Finding]) -> None:
    console = output_console()

    def say(text: str) -> None:
        console.print(text, markup=False, soft_wrap=True)

    count = f"{len(findings)} finding{'s' * (len(findings) != 1)}" if findings else "no finding"
    say(f"{what}: {len(view.steps):,} steps ({view.source}): {count}")
    for number, finding in enumerate(findings, start=1):
        say(f"{number}. {finding.symptom}: {finding.summary}")
        for line in finding.evidence:
            say(f"     {line}")
        say(f"   → {finding.knob}")
    for note in view.notes:
        say(f"note: {note}")
    if not findings:
        say(
            "none of the checks fired: no step spikes, no starved prefill, no preemptions "
            "at moderate KV use, no admission stall, no fragmented steps"
        )
