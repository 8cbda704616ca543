"""``tune diagnose``: what a run shows, as an expert would read it, and the knob to move."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prefill_tuner import defaults
from prefill_tuner.cli.display import output_console
from prefill_tuner.cli.options import (
    SIM_CONFIG,
    TRACE,
    JsonOpt,
    SimSettings,
    StorageOpt,
    TraceChoice,
    with_options,
)
from prefill_tuner.cli.stored import open_stored
from prefill_tuner.diagnosis import Finding, RunView, diagnose, logged_view, simulated_view
from prefill_tuner.diagnosis.sources import trial_view
from prefill_tuner.engines.sim import load_profile
from prefill_tuner.engines.sim.config import resolve_config
from prefill_tuner.errors import TunerError
from prefill_tuner.trace import load_trace


@with_options(engine=SIM_CONFIG, trace=TRACE)
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
        typer.Option("--trace", help="Or simulate this trace with the scheduler flags below."),
    ] = None,
    steps_file: Annotated[
        Path | None,
        typer.Option(
            "--steps",
            help="Or read this step trace (tune simulate --steps-out, or a real trial's "
            "LABEL.steps.jsonl) with the scheduler flags below as its settings.",
        ),
    ] = None,
    profile: Annotated[
        str, typer.Option("--profile", help="Step-time profile (with --trace).")
    ] = defaults.PROFILE,
    as_json: JsonOpt = False,
    *,
    engine: SimSettings,
    trace: TraceChoice,
) -> None:
    """Name what a run shows (spikes, prefill starvation, KV thrashing, admission stalls,
    fragmented steps), with its evidence and the knob to move."""
    given = [name for name, value in (("--study", study_name), ("--trace", trace_file),
                                      ("--steps", steps_file)) if value is not None]  # fmt: skip
    if len(given) != 1:
        raise TunerError(
            "give one run to diagnose: --study NAME [--trial N], --trace FILE or --steps FILE"
        )
    if trial is not None and study_name is None:
        raise TunerError("--trial: only with --study")
    if study_name is not None:
        view, what = _stored(study_name, trial, storage)
    else:
        engine_profile = load_profile(profile)
        config = resolve_config(engine_profile, engine.settings, engine.kv_cache_memory_bytes)
        if steps_file is not None:
            view = logged_view(steps_file, config.model_dump())
            what = str(steps_file)
        else:
            assert trace_file is not None
            requests = load_trace(
                str(trace_file), trace.format, sort=trace.sort, options=trace.shaping
            )
            view = simulated_view(requests, config, engine_profile)
            what = f"{trace_file}, simulated"
    findings = diagnose(view)
    if as_json:
        typer.echo(json.dumps(_document(what, view, findings), indent=2))
        return
    _print(what, view, findings)


def _stored(study_name: str, trial: int | None, storage: str) -> tuple[RunView, str]:
    store, name = open_stored(study_name, storage)
    record = store.get_study(name)
    assert record is not None
    trials = store.trials(record)
    chosen = next(
        (t for t in trials if (t.trial_number == trial if trial is not None else t.is_baseline)),
        None,
    )
    if chosen is None:
        numbers = ", ".join(str(t.trial_number) for t in trials) or "none"
        raise TunerError(f"--trial {trial}: study {name} has no such trial (trials: {numbers})")
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
