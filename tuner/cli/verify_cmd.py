"""``tune verify``: the recommended configuration's outputs equal a no-chunking reference."""

from __future__ import annotations

import dataclasses
import json
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from prefill_tuner import defaults, exit_codes
from prefill_tuner.cli.assignments import parse_assignments, parse_value
from prefill_tuner.cli.display import error_console, output_console, quiet_optuna
from prefill_tuner.cli.options import REAL_SERVER, JsonOpt, ModelOpt, StorageOpt, with_options
from prefill_tuner.cli.stored import open_stored
from prefill_tuner.engines.factory import EngineOptions, build_engine
from prefill_tuner.engines.real.engine import server_engine
from prefill_tuner.engines.real.verify import IRREGULAR, load_reference, verify
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_text, check_output
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.study.summary import summarize_stored


@with_options(engine=REAL_SERVER)
def verify_command(
    model: ModelOpt = defaults.MODEL,
    study_name: Annotated[
        str | None,
        typer.Option("--study", help="Verify this study's recommended setting (or --trial)."),
    ] = None,
    trial: Annotated[
        int | None, typer.Option("--trial", min=0, help="The study's trial to verify.")
    ] = None,
    storage: StorageOpt = defaults.STORAGE,
    assignments: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="KNOB=VALUE: a setting to verify (scheduler knobs), or one every server "
            "runs with (max_model_len); repeat it.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write every configuration's outputs (JSON) here."),
    ] = None,
    reference: Annotated[
        Path | None,
        typer.Option(
            "--reference",
            help="Compare with the reference outputs an earlier `tune verify -o FILE` wrote "
            "(same model and prompts) instead of running the reference again.",
        ),
    ] = None,
    irregular: Annotated[
        bool,
        typer.Option(
            "--irregular/--no-irregular",
            help="Also run deliberately irregular chunks. They depend on the model and the "
            "settings every server runs with, not on the configuration: skip them (a server "
            "start) when verifying more configurations of a model they passed on.",
        ),
    ] = True,
    as_json: JsonOpt = False,
    *,
    engine: EngineOptions,
) -> None:
    """Check on the real engine that chunked prefill changes no output: prompt log-probs
    and greedy tokens of the configuration, and of deliberately irregular chunks, against a
    no-chunking reference. Exit code 0: they agree; 5: they differ."""
    if output is not None:
        check_output(output, [reference] if reference is not None else [])
    given = {
        k: parse_value(v) for k, v in parse_assignments(list(assignments or []), "--set").items()
    }
    knobs = {k: v for k, v in given.items() if k in KNOBS}
    fixed = {k: v for k, v in given.items() if k not in KNOBS}
    if study_name is not None:
        knobs = {**_stored_settings(study_name, trial, storage), **knobs}
    elif trial is not None:
        raise TunerError("--trial: only with --study")
    if not knobs:
        raise TunerError(
            "nothing to verify: give --study NAME (its recommended setting) or the settings "
            "with --set max_num_batched_tokens=... "
        )
    saved = load_reference(reference) if reference is not None else None
    err = error_console()
    with closing(build_engine(dataclasses.replace(engine, model=model))) as trial_engine:
        checked = trial_engine.validate_fixed({**fixed, **knobs})  # vLLM's parser, before a server
        fixed = {k: v for k, v in checked.items() if k not in KNOBS}
        knobs = {k: v for k, v in checked.items() if k in KNOBS}
        server = server_engine(trial_engine)
        if server is None:
            raise TunerError("tune verify compares a real server's outputs: give --engine vllm")
        result = verify(
            server,
            {"configuration": knobs, **({"irregular chunks": IRREGULAR} if irregular else {})},
            fixed=fixed,
            say=lambda text: err.print(escape(text), soft_wrap=True),
            reference_outputs=saved,
        )
        if output is not None:
            with atomic_text(output) as stream:
                stream.write(json.dumps(result.as_record(), indent=1) + "\n")
        if as_json:
            typer.echo(json.dumps({k: v for k, v in result.as_record().items() if k != "outputs"}))
        else:
            console = output_console()
            for comparison in result.comparisons:
                console.print(escape(comparison.line()), soft_wrap=True)
            console.print("verified" if result.passed else "NOT verified", markup=False)
        if not result.passed:
            raise typer.Exit(exit_codes.VERIFY_FAILED)


def _stored_settings(study_name: str, trial: int | None, storage: str) -> dict[str, object]:
    quiet_optuna()
    store, name = open_stored(study_name, storage)
    summary = summarize_stored(store, name)
    if trial is None:
        chosen = summary.recommended
        if chosen is None:
            raise TunerError(f"study {name}: no trial met the SLOs, nothing to verify")
    else:
        chosen = next((t for t in store.trials(summary.study) if t.trial_number == trial), None)
        if chosen is None:
            raise TunerError(f"--trial {trial}: study {name} has no such trial")
    return {k: v for k, v in chosen.settings.items() if k in KNOBS}
