"""Percentile summaries, computed the way ``vllm bench serve`` computes them.

numpy's default linear interpolation, so our p99 and vLLM's benchmark p99 agree on the same data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

STANDARD_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
"""The percentiles every report shows."""


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The q-th percentile (0–100) by linear interpolation; NaN for no values."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return float("nan")
    return float(np.percentile(array, q))


def summarize(
    values: Sequence[float] | np.ndarray,
    quantiles: Sequence[float] = STANDARD_PERCENTILES,
    *,
    reorder: bool = False,
) -> dict[str, float]:
    """``{"mean", "p50", "p90", "p95", "p99", "max"}`` of the values (NaN when empty).

    Keys for percentiles are ``p`` plus the number without a trailing ``.0`` (``p99.9`` stays).
    ``reorder``: the values (an array) may be partly sorted in place instead of copied.
    """
    array = np.asarray(values, dtype=float)
    keys = [f"p{q:g}" for q in quantiles]
    if array.size == 0:
        return {"mean": float("nan"), **dict.fromkeys(keys, float("nan")), "max": float("nan")}
    mean, top = float(array.mean()), float(array.max())  # before any reordering
    points = np.percentile(array, list(quantiles), overwrite_input=reorder)
    return {
        "mean": mean,
        **{key: float(point) for key, point in zip(keys, points, strict=True)},
        "max": top,
    }
