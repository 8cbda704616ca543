"""What the tuner records beside Optuna's own tables, in the same database (SQLAlchemy 2).

``tuner_studies``: one row per study: the trace it tunes for, the SLOs, the objective, the
engine and model. ``tuner_engine_versions``: each engine build seen (``vllm --version``, or the
simulator's version and profile). ``tuner_trials``: one row per finished trial: knob values,
the settings it ran with, the serve command, the engine version, the fully resolved engine
config, the trace identity, the metrics summary, SLO verdicts, status and failure reason.
``tuner_nightly_runs``: one row per ``tune nightly`` run: the generation's study, the trace and
engine version of the night, the incumbent and challenger with their measurements, and the
decision.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class StudyRecord(Base):
    __tablename__ = "tuner_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    objective_mode: Mapped[str] = mapped_column(String(32))
    """``latency`` or ``capacity``."""
    slos: Mapped[list[str]] = mapped_column(JSON)
    """The SLOs as given, e.g. ``["p99_tpot=50ms"]``."""
    error_budget: Mapped[float] = mapped_column(Float)
    engine: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(255))
    trace_path: Mapped[str] = mapped_column(Text)
    trace_sha256: Mapped[str] = mapped_column(String(64))
    trace_format: Mapped[str] = mapped_column(String(32))
    shaping: Mapped[dict[str, Any]] = mapped_column(JSON)
    space: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Searched ranges, fixed settings and dropped knobs (with reasons)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    target_trials: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """Finished trials the study should have (``tune run --trials``): where workers stop."""
    definition: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """What ``tune worker`` needs, beyond the columns above, to rebuild the study's plan: the
    searched ranges, whether the trace was sorted, the plan's other options (see
    ``prefill_tuner.worker.definition``). ``None`` for studies recorded before workers existed:
    ``tune run`` on them records it."""
    headroom: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The headroom checks of the study's best settings and the recommendation they chose
    (``prefill_tuner.study.headroom.HeadroomReport.as_dict``), as of the trial count it
    records; ``None`` before they ran (or for studies recorded before they existed)."""

    trials: Mapped[list[TrialRecord]] = relationship(back_populates="study")


class EngineVersion(Base):
    __tablename__ = "tuner_engine_versions"
    __table_args__ = (UniqueConstraint("engine", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    engine: Mapped[str] = mapped_column(String(32))
    version: Mapped[str] = mapped_column(String(255))
    """``vllm --version`` for real engines; the simulator's version and profile for ``sim``."""


class TrialRecord(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (UniqueConstraint("study_id", "trial_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tuner_studies.id"))
    trial_number: Mapped[int] = mapped_column(Integer)
    """Optuna's trial number in the study."""
    is_baseline: Mapped[bool] = mapped_column(default=False)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Optuna's parameters, as sampled."""
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Engine settings the trial ran with (after vLLM's validity rules were applied)."""
    repairs: Mapped[list[str]] = mapped_column(JSON)
    serve_command: Mapped[str] = mapped_column(Text)
    engine_version_id: Mapped[int] = mapped_column(ForeignKey("tuner_engine_versions.id"))
    resolved_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Every engine setting the run used, defaults included."""
    trace_sha256: Mapped[str] = mapped_column(String(64))
    shaping: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    objectives: Mapped[dict[str, float]] = mapped_column(JSON)
    constraints: Mapped[dict[str, float]] = mapped_column(JSON)
    slacks: Mapped[dict[str, float]] = mapped_column(JSON)
    feasible: Mapped[bool] = mapped_column()
    status: Mapped[str] = mapped_column(String(16))
    """``complete``, or ``failed`` (the engine failed; stored with its reason)."""
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    wall_s: Mapped[float] = mapped_column(Float)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The server log of a real engine's trial (its step trace is ``*.steps.jsonl`` beside
    it); kept for trials whose server failed to start, which have no metrics."""
    startup_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Seconds the trial's server took to become healthy (a real engine)."""

    study: Mapped[StudyRecord] = relationship(back_populates="trials")
    engine_version: Mapped[EngineVersion] = relationship()


class NightlyRun(Base):
    __tablename__ = "tuner_nightly_runs"
    __table_args__ = (UniqueConstraint("family", "generation"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    family: Mapped[str] = mapped_column(String(255))
    """The ``--study`` name of ``tune nightly``; generation N is the study ``FAMILY-gN``."""
    generation: Mapped[int] = mapped_column(Integer)
    study_name: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    trace_path: Mapped[str] = mapped_column(Text)
    trace_sha256: Mapped[str] = mapped_column(String(64))
    trace_stats: Mapped[dict[str, Any]] = mapped_column(JSON)
    engine_version: Mapped[str] = mapped_column(String(255))
    incumbent: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The settings deployed before this run (``None`` on the first night)."""
    incumbent_runs: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    challenger: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    challenger_runs: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    decision: Mapped[str] = mapped_column(String(16))
    """``promote``, ``keep`` or ``none`` (nothing met the SLOs)."""
    reason: Mapped[str] = mapped_column(Text)
    deployed: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The settings to serve after this run (the incumbent of the next night)."""
    serve_command: Mapped[str | None] = mapped_column(Text, nullable=True)
    report_path: Mapped[str] = mapped_column(Text)
    wall_s: Mapped[float] = mapped_column(Float)
    busiest: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The incumbent and challenger on tonight's busiest window: ``window`` (its spec),
    ``start_s``, ``requests``, ``incumbent_runs`` and ``challenger_runs`` (as the whole
    night's); ``None`` for nights before it was measured."""
