"""Who runs a study's trials: ``tune run``'s process marks the study and each trial with its
identity (host, pid, start time), so that a second run of a running study is refused, and a
trial left RUNNING by a process that died (killed, machine rebooted) is found and queued
again (workers have heartbeats instead: :mod:`prefill_tuner.worker.claim`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import optuna

from prefill_tuner.errors import TunerError
from prefill_tuner.storage.models import StudyRecord
from prefill_tuner.storage.store import TunerStore

RUNNER_ATTR = "runner"
"""User attribute of a trial run by ``tune run``: the process running it (host, pid, start)."""
LIVE = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.WAITING,
)
"""States of a trial that has run or will run."""


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``None``: no such process). With
    the pid it names a process uniquely: a reused pid has another start time."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def this_runner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())}


def requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue a trial that did not finish to run again, with the same parameters and marks
    (a baseline stays the baseline)."""
    attrs = {k: v for k, v in trial.user_attrs.items() if k not in (RUNNER_ATTR,)}
    # A queued trial's parameters are Optuna's ``fixed_params`` until the objective suggests
    # them: a trial stopped before that (inside Optuna's ``ask``) has no ``params`` yet.
    params = {**trial.system_attrs.get("fixed_params", {}), **trial.params}
    study.enqueue_trial(params, user_attrs={**attrs, "retry_of": trial.number})


WORKER_ATTR = "worker"
"""User attribute naming the ``tune worker`` that claimed a trial (it has heartbeats)."""
RUN_BY_ATTR = "run_by"
"""Study user attribute: the process that holds (or last held) the study's run lock."""


def recover_orphans(
    study: optuna.Study, store: TunerStore, record: StudyRecord, *, ours: bool = False
) -> list[int]:
    """Fail and queue again the RUNNING trials that no process will finish; without this they
    stay RUNNING for ever. Called under the study's run lock (:func:`running`), so no other
    ``tune run`` is creating trials. The orphans: the trials of ``tune run`` processes on this
    machine that no longer exist (a SIGKILL, a power cut); the trials a run left before its
    objective marked them (a stop inside Optuna's ``ask``, which makes a trial RUNNING before
    it is handed over); and with ``ours``, this process's own (after a stop). Trials of other
    machines' runs, and of workers (whose heartbeats say when they died), are left alone."""
    host, me = socket.gethostname(), this_runner()
    recovered = []
    with store.study_lock(record):  # a worker marks the trial it asked for under this lock
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            runner = trial.user_attrs.get(RUNNER_ATTR)
            if WORKER_ATTR in trial.user_attrs:
                continue
            if isinstance(runner, dict):
                if runner.get("host") != host:
                    continue
                if runner == me and not ours:
                    continue
                alive = _process_start(int(runner.get("pid", -1))) == runner.get("start")
                if alive and runner != me:
                    continue
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            requeue(study, trial)
            recovered.append(trial.number)
    return recovered


@contextmanager
def running(study: optuna.Study, store: TunerStore, record: StudyRecord) -> Iterator[None]:
    """The block in which this process runs the study's trials: it holds the study's run
    lock (:meth:`~prefill_tuner.storage.store.TunerStore.run_lock`; another process running
    the study is a :class:`TunerError`, before any trial), and a stop (``KeyboardInterrupt``)
    leaves no trial of its RUNNING."""
    with store.run_lock(record) as held:
        if not held:
            raise TunerError(
                f"study {record.name!r} is being run by another process"
                f"{_holder_words(study.user_attrs.get(RUN_BY_ATTR))}: two runs would each run "
                "its `trials`; wait for that one to end, or stop it (its finished trials are "
                "kept) and run this command again"
            )
        study.set_user_attr(
            RUN_BY_ATTR, {**this_runner(), "since": datetime.now(timezone.utc).isoformat()}
        )
        try:
            yield
        except KeyboardInterrupt:
            recover_orphans(study, store, record, ours=True)
            raise


def _holder_words(holder: Any) -> str:
    """`` (pid 123 on host h, since 2026-12-01 21:40 UTC)``: who holds a run lock, as the
    holder recorded it; empty when it did not."""
    if not isinstance(holder, dict):
        return ""
    since = str(holder.get("since", ""))[:16].replace("T", " ")
    return f" (pid {holder.get('pid')} on host {holder.get('host')}, since {since} UTC)"
