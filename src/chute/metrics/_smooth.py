"""Curve helpers for the PNG plots and the dashboard: EMA smoothing, extreme-keeping thinning."""

from __future__ import annotations

from typing import Any

import numpy as np

from chute.errors import PlotError

Array = np.ndarray[Any, Any]


def ema(
    values: Array, factor: float, state: tuple[float, float] = (0.0, 0.0)
) -> tuple[Array, float, float]:
    """Debiased exponential moving average of `values`, vectorised.

    Non-finite values neither move nor decay the average: they carry the previous
    smoothed value (NaN before the first finite one). Returns the smoothed curve and
    the final ``(acc, weight)`` state, so a caller can continue it over appended rows
    with ``acc = factor * acc + (1 - factor) * v; weight = factor * weight + (1 - factor)``,
    or pass it back as `state` to smooth the next slice of a long curve.

    >>> out, acc, weight = ema(np.array([1.0, 3.0, np.nan, 3.0]), 0.5)
    >>> out.round(3).tolist()
    [1.0, 2.333, 2.333, 2.714]
    >>> head = ema(np.array([1.0, 3.0]), 0.5)
    >>> ema(np.array([np.nan, 3.0]), 0.5, state=head[1:])[0].round(3).tolist()
    [2.333, 2.714]
    """
    if not 0 <= factor < 1:
        raise PlotError(f"smoothing factor must be in [0, 1), got {factor}")
    acc0, weight0 = state
    vals = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(vals)
    v = vals[finite]
    n = len(v)
    acc = (1 - factor) * v
    # Prefix scan of acc[j] = factor * acc[j-1] + (1-factor) * v[j] in log2(n) vector passes;
    # factor**d underflows to 0 long before d reaches n for any factor not close to 1.
    d, p = 1, factor
    while d < n and p > 0:
        acc[d:] += p * acc[:-d]
        d, p = d * 2, p * p
    decay = np.cumprod(np.full(n, factor))  # factor ** (j + 1)
    if acc0 or weight0:
        acc += decay * acc0
    weight = 1 - decay * (1 - weight0)
    smooth = acc / weight if n else acc
    pos = np.cumsum(finite) - 1
    before = acc0 / weight0 if weight0 > 0 else np.nan  # what rows before the first carry
    out = np.where(pos >= 0, smooth[np.maximum(pos, 0)] if n else before, before)
    return out, float(acc[-1]) if n else acc0, float(weight[-1]) if n else weight0


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
    starts = starts[starts < n]  # buckets after this slice of the span
    ends = np.append(starts[1:], n)
    yf = np.asarray(y, dtype=np.float64)
    lo = np.fmin.reduceat(yf, starts)
    hi = np.fmax.reduceat(yf, starts)
    idx = np.arange(n)
    counts = ends - starts
    big = np.int64(n)
    at_lo = np.minimum.reduceat(np.where(yf == np.repeat(lo, counts), idx, big), starts)
    at_hi = np.minimum.reduceat(np.where(yf == np.repeat(hi, counts), idx, big), starts)
    at_lo = np.where(at_lo == big, starts, at_lo)  # all-NaN bucket
    at_hi = np.where(at_hi == big, starts, at_hi)
    return np.unique(np.concatenate([starts, ends - 1, at_lo, at_hi]))
