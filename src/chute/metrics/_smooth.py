"""Curve helpers for the PNG plots and the dashboard: EMA smoothing, extreme-keeping thinning."""

from __future__ import annotations

from typing import Any

import numpy as np

from chute import _native
from chute.errors import PlotError

Array = np.ndarray[Any, Any]


def ema(
    values: Array,
    factor: float,
    state: tuple[float, float] = (0.0, 0.0),
    at: Array | None = None,
) -> tuple[Array, float, float]:
    """Debiased exponential moving average of `values` (one pass in the compiled core).

    Non-finite values neither move nor decay the average: they carry the previous
    smoothed value (NaN before the first finite one). Returns the smoothed curve and
    the final ``(acc, weight)`` state, so a caller can continue it over appended rows
    with ``acc = factor * acc + (1 - factor) * v; weight = factor * weight + (1 - factor)``,
    or pass it back as `state` to smooth the next slice of a long curve. With `at`
    (increasing row positions) only the smoothed values at those rows come back.

    >>> out, acc, weight = ema(np.array([1.0, 3.0, np.nan, 3.0]), 0.5)
    >>> out.round(3).tolist()
    [1.0, 2.333, 2.333, 2.714]
    >>> head = ema(np.array([1.0, 3.0]), 0.5)
    >>> ema(np.array([np.nan, 3.0]), 0.5, state=head[1:])[0].round(3).tolist()
    [2.333, 2.714]
    >>> ema(np.array([1.0, 3.0, np.nan, 3.0]), 0.5, at=np.array([1, 3]))[0].round(3).tolist()
    [2.333, 2.714]
    """
    if not 0 <= factor < 1:
        raise PlotError(f"smoothing factor must be in [0, 1), got {factor}")
    vals = _plain(values, np.float64)
    rows = None if at is None else _plain(at, np.int64)
    out = np.empty(len(vals) if rows is None else len(rows))
    acc, weight = _native.ema(vals, float(factor), float(state[0]), float(state[1]), out, rows)
    return out, acc, weight


def thin(x: Array, y: Array, buckets: int, span: tuple[float, float] | None = None) -> Array:
    """Positions of the rows to keep: first, last, min and max of y per x bucket.

    `x` must be sorted ascending. Curves of at most 4 rows per bucket come back whole.
    The buckets divide `span` (default: x's first to last value); a slice of a long curve
    thinned with the whole curve's span keeps every row the whole would keep.

    >>> x = np.arange(1000.0); y = np.zeros(1000); y[500] = 9.0
    >>> keep = thin(x, y, 10)
    >>> len(keep) <= 40 and 500 in keep.tolist() and 0 in keep and 999 in keep
    True
    """
    n = len(x)
    buckets = max(1, int(buckets))
    if n <= 4 * buckets:
        return np.arange(n)
    x0, x1 = (float(x[0]), float(x[-1])) if span is None else span
    if not x1 > x0:
        edges = np.linspace(0, n, buckets + 1).astype(np.int64)[:-1]
    else:
        edges = np.searchsorted(x, np.linspace(x0, x1, buckets + 1)[:-1], side="left")
    starts = np.unique(edges)
    starts = _plain(starts[starts < n], np.int64)  # the buckets in this slice
    keep = np.empty(4 * len(starts), dtype=np.int64)
    count = _native.extremes(_plain(y, np.float64), starts, keep)
    return keep[:count]


def _plain(a: Array, dtype: type) -> Array:
    """`a` as the compiled core takes it: contiguous and aligned (a column read from an
    archive may be neither), copied only when it is not."""
    return np.require(a, dtype, ["C_CONTIGUOUS", "ALIGNED"])
