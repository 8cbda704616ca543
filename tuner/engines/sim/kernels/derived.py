"""A kernel profile's tables made ready to evaluate, once per profile (:class:`Derived`): the
token and request curves summed over every kernel and layer, the decode grid and the context
curve with their slopes, the lower bounds the fast path uses, as floats and numpy arrays; and
the interpolations a step's time is read with (:meth:`Derived.decode`, :meth:`Derived.chunk`
and their ``_many`` forms over runs of steps, the same operations in the same order, so that a
run's times are exactly its steps').

:class:`~prefill_tuner.engines.sim.kernels.profile.KernelProfile` holds the measured curves and
makes this of them on first use (``derive``)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class Derived:
    """What a profile's fields imply, computed once: the token and request curves (seconds,
    every layer), the decode grid and context curve (seconds, every layer), the lower
    bounds. Equal to any other, and to not being computed yet: it is a function of the
    fields, which the profile compares."""

    owner: dict[str, Any]
    token_x: list[float]
    token_y: list[float]
    token_slope: list[float]
    token_tail: float
    request_x: list[float]
    request_y: list[float]
    request_slope: list[float]
    request_tail: float
    batch: list[float]
    kv: list[float]
    grid: list[list[float]]
    grid_slope: list[list[float]]
    grid_np: np.ndarray
    grid_slope_np: np.ndarray
    kv_np: np.ndarray
    ctx_x: list[float]
    ctx_root: list[float]
    ctx_root_slope: list[float]
    ctx_x_np: np.ndarray
    ctx_root_np: np.ndarray
    ctx_root_slope_np: np.ndarray
    ctx_last: float
    token_floor: float
    pair_floor: float
    host_fixed: float
    """``host_seconds`` is ``host_fixed + host_per_request × requests``, these same floats."""
    host_per_request: float
    curves: dict[int, Callable[[float], float]] = field(default_factory=dict)
    """Batch → :meth:`decode` at that batch (:meth:`decode_curve`), made when first read."""

    def __eq__(self, other: object) -> bool:
        # Not yet derived (``None``) or derived: the same profile either way.
        return other is None or isinstance(other, Derived)

    # Each reader below is exact at the curve's points, linear between them, and beyond the
    # last point grows in proportion (the utilisation of the last measured point held).

    def tokens(self, count: float) -> float:
        x, y = self.token_x, self.token_y
        j = bisect_right(x, count) - 1
        if j < 0:
            return y[0]
        if j >= len(x) - 1:
            return y[-1] + (count - x[-1]) * self.token_tail
        return y[j] + (count - x[j]) * self.token_slope[j]

    def requests(self, count: float) -> float:
        x, y = self.request_x, self.request_y
        j = bisect_right(x, count) - 1
        if j < 0:
            return y[0]
        if j >= len(x) - 1:
            return y[-1] + (count - x[-1]) * self.request_tail
        return y[j] + (count - x[j]) * self.request_slope[j]

    def decode(self, batch: int, kv: float) -> float:
        """Decode attention of ``batch`` requests reading ``kv`` KV tokens each (mean)."""
        return self.decode_curve(batch)(kv)

    def decode_curve(self, batch: int) -> Callable[[float], float]:
        """:meth:`decode` at ``batch``, a function of the KV tokens: the batch's rows of the
        grid, and its weight between them, found once (a step's time reads it millions of
        times). Row ``i`` at ``kv`` is linear between the grid's KV points, held below the
        first and in proportion beyond the last; the batch interpolates linearly between
        two rows, or scales the last row beyond it."""
        curve = self.curves.get(batch)
        if curve is not None:
            return curve
        b, x = self.batch, self.kv
        last, x_last = len(x) - 1, x[-1]
        i = bisect_right(b, batch) - 1
        low_row, low_slope = self.grid[max(i, 0)], self.grid_slope[max(i, 0)]

        def row(grid: list[float], slope: list[float], kv: float) -> float:
            j = bisect_right(x, kv) - 1
            if j < 0:
                return grid[0]
            if j >= last:
                return grid[-1] * (kv / x_last)
            return grid[j] + (kv - x[j]) * slope[j]

        if i < 0:
            curve = lambda kv: row(low_row, low_slope, kv)  # noqa: E731
        elif i >= len(b) - 1:
            scale = batch / b[-1]
            curve = lambda kv: row(low_row, low_slope, kv) * scale  # noqa: E731
        else:
            weight = (batch - b[i]) / (b[i + 1] - b[i])
            high_row, high_slope = self.grid[i + 1], self.grid_slope[i + 1]

            def curve(kv: float) -> float:
                j = bisect_right(x, kv) - 1
                if j < 0:
                    low, high = low_row[0], high_row[0]
                elif j >= last:
                    low, high = low_row[-1] * (kv / x_last), high_row[-1] * (kv / x_last)
                else:
                    low = low_row[j] + (kv - x[j]) * low_slope[j]
                    high = high_row[j] + (kv - x[j]) * high_slope[j]
                return low + weight * (high - low)

        self.curves[batch] = curve
        return curve

    def _rows(self, i: int, kv: np.ndarray, at: _Brackets) -> np.ndarray:
        """Row ``i`` of the decode grid (as :meth:`decode_curve` reads one) at each of
        ``kv``, bracketed by ``at``."""
        inner, ends = at
        grid, slope, x = self.grid_np[i], self.grid_slope_np[i], self.kv_np
        middle = grid[inner] + (kv - x[inner]) * slope[inner]
        if ends is None:
            return middle
        above, below = ends
        return np.where(above, grid[-1] * (kv / x[-1]), np.where(below, grid[0], middle))

    def decode_many(self, batch: int, kv: np.ndarray) -> np.ndarray:
        """:meth:`decode` at each of ``kv`` (non-decreasing): the same operations on
        arrays."""
        b = self.batch
        i = bisect_right(b, batch) - 1
        at = _brackets(self.kv_np, kv)
        if i < 0:
            return self._rows(0, kv, at)
        if i >= len(b) - 1:
            return self._rows(len(b) - 1, kv, at) * (batch / b[-1])
        weight = (batch - b[i]) / (b[i + 1] - b[i])
        low = self._rows(i, kv, at)
        return low + weight * (self._rows(i + 1, kv, at) - low)

    def context(self, length: int) -> float:
        """Causal attention of one sequence of ``length`` tokens, no prior context."""
        x = self.ctx_x
        j = bisect_right(x, length) - 1
        if j < 0:
            root = self.ctx_root[0]
            return root * root
        if j >= len(x) - 1:  # the last measured per-pair cost held
            return self.ctx_last * ((length * (length + 1)) / (x[-1] * (x[-1] + 1)))
        root = self.ctx_root[j] + (length - x[j]) * self.ctx_root_slope[j]
        return root * root

    def context_many(self, length: np.ndarray) -> np.ndarray:
        """:meth:`context` at each of ``length`` (non-decreasing integers): the same
        operations on arrays."""
        x, root, slope = self.ctx_x_np, self.ctx_root_np, self.ctx_root_slope_np
        inner, ends = _brackets(x, length)
        middle = root[inner] + (length - x[inner]) * slope[inner]
        if ends is None:
            return middle * middle
        above, below = ends
        last = float(x[-1])
        beyond = self.ctx_last * ((length * (length + 1)) / (last * (last + 1)))
        first = float(root[0])
        return np.where(above, beyond, np.where(below, first * first, middle * middle))

    def prefill_many(self, chunks: Sequence[tuple[np.ndarray, int]]) -> np.ndarray:
        """:meth:`prefill` of steps whose chunks are ``(tokens before, tokens)`` with the
        tokens before an integer array (one element per step): the same operations on
        arrays, chunk by chunk in order."""
        total: np.ndarray | float = 0.0
        for before, count in chunks:
            length = before + count
            pairs = count * before + count * (count + 1) // 2
            share = self.context_many(length) * (pairs / (length * (length + 1) // 2))
            total = total + np.maximum(share, self.decode_many(1, length.astype(np.float64)))
        return np.asarray(total)

    def prefill(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Context attention of each chunk ``(prior, tokens)``: the full causal attention of
        its ``prior + tokens`` scaled by the share of query-key pairs the chunk computes
        (AIConfigurator's prefix correction), and never less than one decode reading that
        context (a short chunk after a long prefix is bound by reading the KV cache)."""
        total = 0.0
        for before, count in chunks:
            total += self.chunk(before, count)
        return total

    def chunk(self, before: int, count: int) -> float:
        """:meth:`prefill`'s term for one chunk of ``count`` tokens after ``before``."""
        length = before + count
        pairs = count * before + count * (count + 1) // 2
        share = self.context(length) * (pairs / (length * (length + 1) // 2))
        return max(share, self.decode_curve(1)(float(length)))


_Brackets = tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]
"""Per point: the segment of a curve's x it falls in (the first or the last beyond the ends);
and, unless no point lies outside the curve (``None``), whether each lies at or beyond the
last x, and whether before the first."""


def _brackets(x: np.ndarray, at: np.ndarray) -> _Brackets:
    """Where each of the non-decreasing ``at`` falls on the increasing ``x``
    (``bisect_right(x, a) - 1``, kept to a segment's start, and the two ends' tests, which
    the first and last points settle for all when both lie inside)."""
    inner = np.searchsorted(x[1:-1], at, side="right")
    if at.size == 0 or (at[0] >= x[0] and at[-1] < x[-1]):
        return inner, None
    return inner, (at >= x[-1], at < x[0])
