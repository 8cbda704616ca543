"""A calibration as one library call: fit a step-time profile (or refit a kernels profile's
time outside its kernels) to one real server replaying the designed workload
(:func:`calibrate_server`), or to a study's stored real trials (:func:`calibrate_study`).
``tune calibrate`` is a thin shell over these; the fits themselves are in
:mod:`.observations`, :mod:`.calibrate` and :mod:`.refit`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from prefill_tuner.calibration.calibrate import Calibration
from prefill_tuner.declared import check_declared
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.errors import TunerError

if TYPE_CHECKING:
    from prefill_tuner.calibration.refit import Refit
    from prefill_tuner.engines.base import TrialEngine
    from prefill_tuner.engines.sim.kernels import KernelProfile

DESIGNED_SEQS = 128
"""Largest decode batch of the designed workload unless told otherwise."""


@dataclass(frozen=True)
class Design:
    """The designed workload a calibration server replays (:func:`designed_settings`,
    :func:`calibrate_server`)."""

    # The first paragraph of each field's docstring is its option's help (tune calibrate).
    max_num_seqs: Annotated[int, Field(ge=1)] = DESIGNED_SEQS
    """Largest decode batch the designed workload builds."""
    max_num_batched_tokens: Annotated[int | None, Field(ge=1)] = None
    """The calibration server's step budget: the largest prefill chunk it sees (default: the
    server's own default)."""
    spacing: Annotated[float, Field(ge=0.01, le=100.0)] = 1.0
    """Stretch the workload's gaps (1: a small model on a CPU; more where one max_model_len
    prompt takes over a second)."""

    def __post_init__(self) -> None:
        check_declared(self)


def calibrate_server(
    engine: TrialEngine,
    settings: dict[str, Any],
    *,
    model: str,
    base: KernelProfile | None = None,
    name: str | None = None,
    spacing: float = 1.0,
    on_start: Callable[[str], None] | None = None,
) -> Calibration | Refit:
    """A profile fitted to one server of ``engine`` replaying the designed workload with
    ``settings`` (:func:`designed_settings`); with ``base``, that kernels profile refitted
    (its measured kernels kept). ``on_start`` hears one line before the server starts."""
    from prefill_tuner.calibration.observations import calibrate_on_server, refit_on_server

    if base is not None:
        from prefill_tuner.calibration.refit import refuse_cpu

        refuse_cpu(base, engine.version)  # before the server starts
    if on_start is not None:
        what = f"refitting {base.name}'s time outside kernels to" if base else "calibrating"
        on_start(
            f"{what} {model} on {engine.version}: one server "
            f"(budget {settings['max_num_batched_tokens']}, up to {settings['max_num_seqs']} "
            f"sequences), the designed workload (about {60 * spacing:.0f} s)…"
        )
    if base is not None:
        return refit_on_server(
            engine, settings, base, model=model, name=name or refit_name(base), spacing=spacing
        )
    return calibrate_on_server(
        engine, settings, model=model, name=name or profile_name(model), spacing=spacing
    )


def calibrate_study(
    storage: str,
    study: str,
    *,
    hardware: ProfileSpec,
    model: str,
    name: str | None = None,
    on_start: Callable[[str], None] | None = None,
) -> Calibration | Refit:
    """A profile fitted to the real trials study ``study`` (in ``storage``) kept, or, when
    ``hardware`` gives a kernels profile, that profile refitted to them. ``model``: the one
    calibrated when the study does not say."""
    from prefill_tuner.calibration.observations import calibrate_from_study, refit_from_study
    from prefill_tuner.storage.store import TunerStore

    store = TunerStore(storage, create=False)
    record = store.get_study(study)  # calibrate_from_study says when there is none
    model = record.model if record else model
    base = kernels_to_refit(hardware, model)
    if base is not None:
        return refit_from_study(
            store, study, base, name=name or refit_name(base), on_start=on_start
        )
    return calibrate_from_study(store, study, name=name or profile_name(model), on_start=on_start)


def kernels_to_refit(
    hardware: ProfileSpec, model: str, max_model_len: int | None = None
) -> KernelProfile | None:
    """The kernels profile ``hardware`` gives, to refit; ``None`` when it gives none (a
    profile is fitted from scratch). Another kind of profile is refused."""
    if not hardware.given:
        return None
    from prefill_tuner.engines.sim.kernels import KernelProfile

    profile = hardware.step_model(model, max_model_len)
    if not isinstance(profile, KernelProfile):
        raise TunerError(
            f"--profile {hardware.profile}: a {profile.kind} profile; a refit keeps a kernels "
            "profile's measured kernels and refits its time outside kernels (tune profile, or "
            "--gpu, builds one); without --profile, tune calibrate fits a profile from scratch"
        )
    return profile


def designed_settings(
    server_defaults: Mapping[str, Any],
    fixed: Mapping[str, Any],
    max_num_seqs: int = DESIGNED_SEQS,
    max_num_batched_tokens: int | None = None,
) -> dict[str, Any]:
    """The calibration server's settings: its defaults, the ``fixed`` ones, the designed
    workload's decode batch, and a step budget of at least that batch."""
    settings = {**server_defaults, **fixed, "max_num_seqs": max_num_seqs}
    if max_num_batched_tokens is not None:
        settings["max_num_batched_tokens"] = max_num_batched_tokens
    settings["max_num_batched_tokens"] = max(
        settings.get("max_num_batched_tokens") or max_num_seqs, max_num_seqs
    )
    return settings


def profile_name(model: str) -> str:
    """A calibrated profile's default name: the model's, as a file name may hold it."""
    return "calibrated-" + (
        re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model).name).strip("-") or "model"
    )


def refit_name(profile: KernelProfile) -> str:
    """A refitted kernels profile's default name."""
    return profile.name.removesuffix("-calibrated") + "-calibrated"
