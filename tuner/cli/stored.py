"""Opening a stored study for the commands that read one (pareto, export, report)."""

from __future__ import annotations

from pathlib import Path

from prefill_tuner.cli.display import quiet_optuna
from prefill_tuner.files import check_output, declare_inputs
from prefill_tuner.storage.store import TunerStore, inputs_of
from prefill_tuner.study.plan import check_study_name
from prefill_tuner.study.summary import find_study, repoint_trace, trace_location


def open_stored(
    study_name: str | None, storage: str, output: Path | None = None, trace: Path | None = None
) -> tuple[TunerStore, str]:
    """The storage (never created) and the study's name (default: the only or latest one);
    the name and the output path are checked before the storage is opened. ``trace``: where
    the study's trace is now, recorded once its bytes are checked to be the study's."""
    if study_name is not None:
        check_study_name(study_name)
    if output is not None:
        check_output(output, inputs_of(storage))
    quiet_optuna()
    store = TunerStore(storage, create=False)
    name = find_study(store, study_name)
    record = store.get_study(name)
    if record is not None and trace is not None:
        repoint_trace(store, record, trace)
    if output is not None and record is not None and record.trace_path:
        declare_inputs([trace_location(record)])  # the report reads the study's trace again
        check_output(output)
    return store, name
