"""A study's definition for its workers: recorded with the study by ``tune run``, and rebuilt
into the same :class:`StudyPlan` by every ``tune worker``, so that all workers evaluate the same
objective on the same trace, whatever machine they run on.

The study's record (``tuner_studies``) already holds the trace's path, format and sha256, the
shaping, SLOs, objective, error budget, engine, model and fixed settings; the definition adds
what it lacks: the searched ranges exactly, whether the trace was sorted, and the plan's
other options (sampler, start-up trials, capacity tolerance, early abort).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from pydantic import ValidationError

from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.files import read_input
from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.search_spaces.space import Dropped, KnobRange, SearchSpace, knob_availability
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.study.summary import trace_location
from prefill_tuner.trace import ShapeOptions, load_trace

DEFINITION_VERSION = 1


RECORDED_ELSEWHERE = frozenset(
    {"name", "storage_url", "trace", "shaping", "slos", "space", "model", "trials"}
    | {"objective_mode", "error_budget"}  # columns of the study record
    | {"seed", "timeout_s"}  # each worker's own
)
"""Fields of :class:`StudyPlan` that the definition's ``options`` leave out."""


def definition_of(plan: StudyPlan, engine: TrialEngine, *, sort: bool) -> dict[str, Any]:
    """What workers need beyond the study record's columns (JSON-ready): the searched ranges,
    whether the trace was sorted, every other option of the plan (sampler, start-up trials,
    capacity tolerance, ...), and a deterministic engine's version, which names what decides
    its numbers (the simulator's profile, by content)."""
    return {
        "version": DEFINITION_VERSION,
        "engine_version": engine.version if engine.deterministic else None,
        "ranges": {name: knob_range.as_record() for name, knob_range in plan.space.ranges.items()},
        "sort": sort,
        "options": {
            field.name: getattr(plan, field.name)
            for field in dataclasses.fields(plan)
            if field.name not in RECORDED_ELSEWHERE
        },
    }


def plan_from_record(
    record: StudyRecord,
    *,
    storage_url: str,
    engine: TrialEngine,
    seed: int = 0,
    trace_path: str | None = None,
) -> StudyPlan:
    """The study's plan, rebuilt from its record for a worker with this ``engine``.

    ``trace_path``: where this machine has the trace (default: the path recorded with the
    study); its bytes must have the recorded sha256. Every mismatch is a one-line
    :class:`TunerError`.
    """
    name = record.name
    definition = record.definition
    if definition is not None and "runs_in" in definition:
        raise TunerError(
            f"study {name!r} has no plan for workers: it runs in {definition['runs_in']} only "
            "(tune plan's studies of a replica count simulate replicas behind a router)"
        )
    if definition is None or record.target_trials is None:
        raise TunerError(
            f"study {name!r} was recorded by an earlier version of tune: run its `tune run` "
            "command once more (with --create-only) to record what workers need"
        )
    if definition.get("version") != DEFINITION_VERSION:
        raise TunerError(
            f"study {name!r} was recorded by another version of tune "
            f"(definition version {definition.get('version')}; this tune reads "
            f"{DEFINITION_VERSION})"
        )
    if engine.name != record.engine:
        raise TunerError(
            f"study {name!r} runs on the {record.engine} engine; this worker has "
            f"`engine` {engine.name}"
        )
    recorded = definition.get("engine_version")
    if engine.deterministic and recorded and recorded != engine.version:
        raise TunerError(
            f"study {name!r} runs on {recorded}; this worker's engine is {engine.version} "
            "(give the study's `profile`)"
        )
    space = _space(record, definition, engine)
    try:
        shaping = ShapeOptions.model_validate(record.shaping)
    except ValidationError as exc:
        raise TunerError(f"study {name!r}: its stored shaping is invalid: {exc}") from None
    max_model_len = engine.max_model_len(dict(space.fixed))
    if shaping.max_model_len is not None and shaping.max_model_len != max_model_len:
        raise TunerError(
            f"study {name!r} was shaped for max_model_len {shaping.max_model_len}; this worker's "
            f"engine runs with {max_model_len} (use the study's `profile` or server options)"
        )
    path = trace_path or str(trace_location(record))  # the sample, wherever installed
    _check_trace(path, record)
    trace = load_trace(
        path, record.trace_format or None, sort=bool(definition["sort"]), options=shaping
    )
    return StudyPlan(
        name=name,
        storage_url=storage_url,
        trace=trace,
        shaping=shaping,
        slos=parse_slos(list(record.slos)),
        space=space,
        model=record.model,
        trials=record.target_trials,
        objective_mode=record.objective_mode,  # type: ignore[arg-type]
        error_budget=record.error_budget,
        seed=seed,
        **_options(record, definition),
    )


def _options(record: StudyRecord, definition: dict[str, Any]) -> dict[str, Any]:
    options = dict(definition["options"])
    known = {field.name for field in dataclasses.fields(StudyPlan)} - RECORDED_ELSEWHERE
    unknown = sorted(set(options) - known)
    if unknown:
        raise TunerError(
            f"study {record.name!r} was recorded by a newer version of tune (options "
            f"{', '.join(unknown)}); upgrade this worker's tune"
        )
    return options


def _space(record: StudyRecord, definition: dict[str, Any], engine: TrialEngine) -> SearchSpace:
    ranges = {
        name: KnobRange.from_record(name, data) for name, data in definition["ranges"].items()
    }
    for knob_range in ranges.values():
        reason = knob_availability(knob_range.knob, engine.capabilities)
        if reason is not None:
            raise TunerError(
                f"study {record.name!r} searches {knob_range.knob.name}, which this worker's "
                f"engine cannot take: {reason}"
            )
    fixed = engine.validate_fixed(dict(record.space.get("fixed", {})))
    dropped = tuple(
        Dropped(*text.split(": ", 1)) if ": " in text else Dropped(text, "")
        for text in record.space.get("dropped", [])
    )
    return SearchSpace(ranges=ranges, fixed=fixed, dropped=dropped)


def _check_trace(path: str, record: StudyRecord) -> None:
    """The trace file must be the one the study was created with, byte for byte."""
    try:
        data = read_input(path)
    except OSError as exc:
        raise TunerError(
            f"{path}: the trace of study {record.name!r} cannot be read on this machine "
            f"({exc.strerror or exc}); copy it there, or give its path as `trace`"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != record.trace_sha256:
        raise TunerError(
            f"{path}: not the trace study {record.name!r} was created with (sha256 "
            f"{digest[:12]}…, recorded {record.trace_sha256[:12]}…): the file has changed"
        )
