"""Fitting a step-time model to measured steps, and saying how well it predicts unseen ones.

Bounded, robust least squares (:func:`scipy.optimize.least_squares`, ``soft_l1`` loss) on the
log of predicted over measured time: a 3 ms decode counts as much as a 300 ms prefill, over-
and under-prediction weigh the same, no coefficient can go negative (a negative cost per
token would make long prompts cheap), and an outlier step (the machine busy with something
else) cannot pull the fit. It starts from plain non-negative least squares
(:func:`scipy.optimize.nnls`).
A random fifth of the steps is held out; the error printed is on those.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from prefill_tuner.engines.sim.cost_model import FEATURES, StepShape, step_features

KINDS = ("decode", "mixed", "prefill")
"""Step kinds the error is reported by: pure decode, prefill with decodes, prefill only."""


def step_kind(shape: StepShape) -> str:
    if shape.prefill_tokens == 0:
        return "decode"
    return "mixed" if shape.decode_tokens else "prefill"


@dataclass(frozen=True)
class KindError:
    """Relative step-time error over some steps (``|predicted - measured| / measured``)."""

    steps: int
    median: float
    p90: float
    bias: float
    """Median of ``predicted / measured - 1``: negative when the model is fast."""

    def as_dict(self) -> dict[str, float]:
        return {"steps": self.steps, "median": self.median, "p90": self.p90, "bias": self.bias}


@dataclass(frozen=True)
class StepFit:
    """A fitted step model and its held-out error."""

    coefficients_ms: dict[str, float]
    """Milliseconds per unit of each feature (:data:`FEATURES`): the model's part of a step,
    as vLLM's step timer measures it."""
    host_ms: float
    """Per step, between vLLM's step timer and the next step (scheduling, output processing,
    the messages to the front end)."""
    host_request_ms: float
    """Of that, per scheduled request."""
    train_steps: int
    held_out: KindError
    """The model part against vLLM's step timer, on held-out steps."""
    by_kind: dict[str, KindError] = field(default_factory=dict)
    """The same per step kind (kinds with no held-out step are absent)."""
    cycle_held_out: KindError | None = None
    """The whole step (model + host) against the gap between log lines, on held-out steps
    that followed another at once (the log's own timing jitter is in this error)."""

    def predict_ms(self, shapes: Sequence[StepShape]) -> np.ndarray:
        """The model part of each step (what vLLM's step timer would say)."""
        return _matrix(shapes) @ np.array([self.coefficients_ms[name] for name in FEATURES])


def fit_steps(
    shapes: Sequence[StepShape],
    timer_s: Sequence[float],
    cycle_s: Sequence[float] | None = None,
    *,
    hold_out: float = 0.2,
    seed: int = 0,
) -> StepFit:
    """Fit :data:`FEATURES` coefficients to vLLM's step timer (``timer_s``) and the host
    time to what the cycle adds (``cycle_s``: NaN where a step has none); errors on a
    held-out share."""
    count = len(shapes)
    cycles = np.full(count, np.nan) if cycle_s is None else np.asarray(cycle_s, dtype=float)
    if len(timer_s) != count or len(cycles) != count:
        raise ValueError("one timer and one cycle time per step")
    timer_ms = np.asarray(timer_s, dtype=float) * 1000.0
    usable = np.isfinite(timer_ms) & (timer_ms > 0)
    x_all, y_all = _matrix(shapes)[usable], timer_ms[usable]
    cycle_ms = cycles[usable] * 1000.0
    kinds = np.array([step_kind(s) for s, ok in zip(shapes, usable, strict=True) if ok])
    if len(y_all) < 2 * len(FEATURES):
        raise ValueError(f"{len(y_all)} usable steps: too few to fit {len(FEATURES)} coefficients")
    held = held_out_mask(len(y_all), hold_out, seed)
    coefficients = _fit_relative(x_all[~held], y_all[~held])
    predicted = x_all @ coefficients
    by_kind = {
        kind: step_error(predicted[held & mask], y_all[held & mask])
        for kind in KINDS
        if (held & (mask := kinds == kind)).any()
    }
    # Host time: what the cycle adds to the step timer, per step and per request.
    timed = np.isfinite(cycle_ms)
    requests = x_all[:, FEATURES.index("request")]
    fitted_host = fit_host(requests[~held], y_all[~held], cycle_ms[~held])
    host = np.zeros(2) if fitted_host is None else np.array(fitted_host)
    cycle_error = None
    if fitted_host is not None and (timed & held).any():
        whole = predicted + host[0] + host[1] * requests
        cycle_error = step_error(whole[timed & held], cycle_ms[timed & held])
    return StepFit(
        coefficients_ms=dict(zip(FEATURES, coefficients.tolist(), strict=True)),
        host_ms=float(host[0]),
        host_request_ms=float(host[1]),
        train_steps=int((~held).sum()),
        held_out=step_error(predicted[held], y_all[held]),
        by_kind=by_kind,
        cycle_held_out=cycle_error,
    )


def _matrix(shapes: Sequence[StepShape]) -> np.ndarray:
    return np.array([step_features(shape) for shape in shapes], dtype=float).reshape(
        len(shapes), len(FEATURES)
    )


ROBUST_SCALE = 0.1
"""Log errors beyond 0.1 (about 10%) count linearly, not squared (``soft_l1``'s
``f_scale``)."""


def _fit_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the robust log error of the prediction;
    columns are scaled to unit size first (token counts and query-key pairs differ by orders
    of magnitude)."""
    from scipy.optimize import least_squares, nnls  # ~0.7 s to load: only when fitting

    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    scaled = x / scale
    start, _ = nnls(scaled, y, maxiter=50 * x.shape[1])
    floor = max(float(np.median(y)) * 1e-3, 1e-9)

    def relative(beta: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(scaled @ beta, floor) / y)

    solution = least_squares(
        relative,
        np.maximum(start, 1e-12),
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=ROBUST_SCALE,
    ).x
    return solution / scale


HOST_SCALE_MS = 0.5
"""Host residuals beyond half a millisecond count linearly (the log's timing jitter)."""


def held_out_mask(count: int, hold_out: float = 0.2, seed: int = 0) -> np.ndarray:
    """Which of ``count`` usable steps are held out (a random share ``hold_out``): the same
    steps for the same count and seed, so that two fits to one log are judged alike."""
    return np.random.default_rng(seed).random(count) < hold_out


MIN_HOST_STEPS = 10
"""Fewer training steps timed line to line than this fit no host time."""


def fit_host(
    requests: np.ndarray, timer_ms: np.ndarray, cycle_ms: np.ndarray
) -> tuple[float, float] | None:
    """Host time per step and per request (ms): what the gap since the previous log line
    (``cycle_ms``, NaN where the step did not follow another at once) adds to vLLM's step timer;
    ``None`` with fewer than :data:`MIN_HOST_STEPS` timed steps."""
    timed = np.isfinite(cycle_ms)
    if timed.sum() < MIN_HOST_STEPS:
        return None
    x = np.column_stack([np.ones(int(timed.sum())), requests[timed]])
    host = fit_absolute(x, cycle_ms[timed] - timer_ms[timed])
    return float(host[0]), float(host[1])


def fit_offset(
    known_ms: np.ndarray, requests: np.ndarray, measured_ms: np.ndarray
) -> tuple[float, float]:
    """Non-negative ``(per step, per request)`` milliseconds that, added to a known part of each
    step (``known_ms``, a kernel sum), best predict ``measured_ms``: the same robust log error as
    the step model's fit (a 3 ms decode weighs as much as a 300 ms prefill), from a non-negative
    least-squares start on the relative residual."""
    from scipy.optimize import least_squares, nnls

    x = np.column_stack([np.ones(len(measured_ms)), np.asarray(requests, dtype=float)])
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    scaled = x / scale
    start, _ = nnls(scaled / measured_ms[:, None], (measured_ms - known_ms) / measured_ms)
    floor = max(float(np.median(measured_ms)) * 1e-3, 1e-9)

    def relative(beta: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(known_ms + scaled @ beta, floor) / measured_ms)

    solution = least_squares(
        relative,
        np.maximum(start, 1e-12),
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=ROBUST_SCALE,
    ).x
    per_step, per_request = solution / scale
    return float(per_step), float(per_request)


def fit_absolute(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative, robust least squares in absolute terms (host residuals can be negative
    where log lines were written late and early)."""
    from scipy.optimize import least_squares, nnls

    start, _ = nnls(x, np.maximum(y, 0.0))
    return least_squares(
        lambda beta: x @ beta - y,
        np.maximum(start, 1e-9),
        bounds=(0.0, np.inf),
        loss="soft_l1",
        f_scale=HOST_SCALE_MS,
    ).x


def step_error(predicted: np.ndarray, measured: np.ndarray) -> KindError:
    """The relative error of ``predicted`` step times against ``measured`` ones."""
    if measured.size == 0:
        return KindError(0, float("nan"), float("nan"), float("nan"))
    ratio = predicted / measured - 1.0
    relative = np.abs(ratio)
    return KindError(
        steps=int(measured.size),
        median=float(np.median(relative)),
        p90=float(np.percentile(relative, 90)),
        bias=float(np.median(ratio)),
    )
