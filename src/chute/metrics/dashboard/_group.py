"""One chart curve of a group of runs: the mean of the runs with a min-max band, per pixel.

The x span all runs share is cut into `width` buckets. Each run's rows are read a slice
at a time (never a whole column) and reduced per bucket to a sum, a count, a min and a
max; the group's line is the mean over runs of each run's bucket mean (so a run logging
ten times as often does not weigh ten times as much), and its band the least and greatest
value any run has in the bucket: real rows, not thinned points. With smoothing, each
run's rows are smoothed first and the same is computed over the smoothed rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from chute.errors import PlotError

from .._reader import Reader
from .._smooth import ema
from ._runs import NotServed, Run
from ._series import check_curve, curve, json_floats

Array = np.ndarray[Any, Any]
Rows = Callable[[], Iterator[tuple[Array, Array, Array]]]


@dataclass
class _Buckets:
    """Per-bucket sums over one run's rows."""

    count: Array
    y: Array
    x: Array
    low: Array
    high: Array

    @classmethod
    def empty(cls, width: int) -> _Buckets:
        count, y, x = np.zeros(width), np.zeros(width), np.zeros(width)
        return cls(count, y, x, low=np.full(width, np.inf), high=np.full(width, -np.inf))

    def add(self, edges: Array, x: Array, y: Array) -> None:
        """Fold one slice of rows (x ascending) into the buckets."""
        ok = np.isfinite(y)
        x, y = x[ok], y[ok]
        if not len(x):
            return
        b = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(self.count) - 1)
        starts = np.flatnonzero(np.diff(b, prepend=-1))  # b ascends: one run of rows a bucket
        at = b[starts]
        self.count[at] += np.diff(np.append(starts, len(b)))
        self.y[at] += np.add.reduceat(y, starts)
        self.x[at] += np.add.reduceat(x, starts)
        self.low[at] = np.minimum(self.low[at], np.minimum.reduceat(y, starts))
        self.high[at] = np.maximum(self.high[at], np.maximum.reduceat(y, starts))


def _run_curve(r: Reader, name: str, x: str) -> tuple[Rows, tuple[float, float] | None]:
    """A run's rows of `name` against `x`, and their x span (errors as `read_series`)."""
    check_curve(r, name, x)
    return curve(r, name, x=x, after=-1)


def _span_of(spans: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    """The x span covering every run's."""
    known = [s for s in spans if s is not None]
    if not known:
        return None
    return min(s[0] for s in known), max(s[1] for s in known)


def _bucket_run(
    rows: Rows, span: tuple[float, float], width: int, smooth: float
) -> tuple[_Buckets, int]:
    """One run's rows reduced to `width` buckets over `span`, and how many rows it has."""
    lo, hi = span
    edges = np.linspace(lo, hi if hi > lo else lo + 1, width + 1)
    out, state, count = _Buckets.empty(width), (0.0, 0.0), 0
    for _steps, xv, y in rows():
        count += len(y)
        if smooth > 0:
            y, acc, weight = ema(y, smooth, state)
            state = (acc, weight)
        out.add(edges, xv.astype(np.float64, copy=False), y)
    return out, count


def _merge(runs: list[_Buckets], rows: int) -> dict[str, Any]:
    """The group's curve from its runs' buckets: x, mean, min, max and runs per bucket."""
    if not runs:
        return {"x": [], "mean": [], "min": [], "max": [], "n": [], "rows": rows}
    count = np.stack([b.count for b in runs])
    has = count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(has, np.stack([b.y for b in runs]) / count, 0.0)
        xs = np.where(has, np.stack([b.x for b in runs]) / count, 0.0)
    n = has.sum(axis=0)
    keep = n > 0
    low = np.min(np.stack([b.low for b in runs]), axis=0)
    high = np.max(np.stack([b.high for b in runs]), axis=0)
    return {
        "x": json_floats(xs.sum(axis=0)[keep] / n[keep]),
        "mean": json_floats(means.sum(axis=0)[keep] / n[keep]),
        "min": json_floats(low[keep]),
        "max": json_floats(high[keep]),
        "n": n[keep].tolist(),
        "rows": rows,
    }


def group_series(
    runs: list[Run], metrics: list[str], x: str, width: int, smooth: float
) -> dict[str, Any]:
    """Each metric's group curve over `runs`; a run that cannot draw a metric (it lacks
    x, or the metric holds text) is left out of that curve and named under "errors"."""
    spans: dict[str, dict[str, tuple[float, float] | None]] = {m: {} for m in metrics}
    errors: dict[str, dict[str, str]] = {m: {} for m in metrics}

    def find(run: Run, r: Reader) -> None:
        for m in metrics:
            if m not in r.metrics():
                continue
            try:
                run.check_metric(r, m)
                spans[m][run.id] = _run_curve(r, m, x)[1]
            except (PlotError, NotServed) as e:
                errors[m][run.name] = str(e)

    def each(fn: Callable[[Run, Reader], None]) -> None:
        for run in runs:
            try:
                run.use(partial(fn, run))
            except Exception as e:  # a run that cannot be read is named, the others still draw
                for m in metrics:
                    errors[m][run.name] = f"{type(e).__name__}: {e}"
                    spans[m].pop(run.id, None)

    each(find)
    union = {m: _span_of(list(spans[m].values())) for m in metrics}
    parts: dict[str, list[_Buckets]] = {m: [] for m in metrics}
    rows = dict.fromkeys(metrics, 0)

    def reduce(run: Run, r: Reader) -> None:
        for m in metrics:
            span = union[m]
            if span is None or run.id not in spans[m] or m not in r.metrics():
                continue
            buckets, n = _bucket_run(_run_curve(r, m, x)[0], span, width, smooth)
            parts[m].append(buckets)
            rows[m] += n

    each(reduce)
    series = {
        m: {**_merge(parts[m], rows[m]), "runs": len(parts[m]), "errors": errors[m]}
        for m in metrics
    }
    return {"series": series}
