"""One chart curve of one run: read, thinned for the chart width, optionally smoothed."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from chute.errors import PlotError

from .. import _format as F
from .._reader import Reader
from .._smooth import ema, thin

MIN_WIDTH, MAX_WIDTH = 16, 8192
#: Rows read and thinned at a time: a curve never holds more of its column than this.
CHUNK = 1 << 19
Array = np.ndarray[Any, Any]
_NONE = (np.zeros(0, F.INDEX_DTYPE), np.zeros(0), np.zeros(0))  # steps, x, y of no rows


def json_floats(a: np.ndarray[Any, Any]) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in a.astype(np.float64).tolist()]


def _numbers(values: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    if values.dtype == object:
        raise PlotError(f"{name!r} holds text, not numbers")
    return values.astype(np.float64, copy=False)


def metric_kinds(r: Reader) -> list[dict[str, Any]]:
    """Every metric of a run with its storage dtype and monotonic flag (no column is read)."""
    manifest = r.manifest()
    out = []
    for name in r.metrics():
        entry = manifest.get(name)
        if entry is None:  # only in the hot log so far: its last value tells numbers from text
            value = r.metric(name, idx=-1, dtype="storage")[1]
            code = F.JSONL if isinstance(value, (str, dict, list, bool, type(None))) else "hot"
            out.append({"name": name, "dtype": code, "monotonic": None})
        else:
            out.append(
                {"name": name, "dtype": entry.get("dtype"), "monotonic": entry.get("monotonic")}
            )
    return out


def read_series(
    r: Reader, name: str, *, x: str, after: int, width: int, smooth: float
) -> dict[str, Any]:
    """A curve as JSON-ready lists: rows after step `after`, at most ~4 per pixel column.

    The column is read `CHUNK` rows at a time and each slice thinned at once against the
    whole curve's x span, so a long column is never held whole: exactly the rows a
    whole-column thinning keeps survive. With `smooth` > 0 (only on full reads, `after`
    < 0) it also carries the EMA at the kept rows and the EMA state after the last row,
    so the page can extend it.
    """
    code = check_curve(r, name, x)
    rows, span = curve(r, name, x=x, after=after)
    smoothing = smooth > 0 and after < 0
    state, count, last = (0.0, 0.0), 0, after
    kept: list[tuple[Array, ...]] = []
    for steps, xv, y in rows():
        if not len(steps):
            continue
        count, last = count + len(steps), int(steps[-1])
        keep = thin(xv, y, width, span)
        cols = [steps[keep], xv[keep], y[keep]]
        if smoothing:  # the EMA runs over every row, but is kept only at the rows kept
            s, acc, weight = ema(y, smooth, state, at=keep)
            state = (acc, weight)
            cols.append(s)
        kept.append(tuple(cols))
    merged: list[Array] = [np.concatenate(c) for c in zip(*kept, strict=True)] or list(_NONE)
    xk, yk = merged[1], merged[2]
    keep = thin(xk, yk, width, span)
    out: dict[str, Any] = {
        "x": xk[keep].tolist() if x == "step" else json_floats(xk[keep]),
        "y": json_floats(yk[keep]),
        "rows": count,
        "last_step": last,
        "dtype": code or "hot",
    }
    if smoothing:
        out["s"] = json_floats(merged[3][keep]) if kept else []
        out["ema"] = list(state)
    return out


def check_curve(r: Reader, name: str, x: str) -> str | None:
    """The metric's storage code, once it is known to be drawable against `x`."""
    code = r.manifest().get(name, {}).get("dtype")
    if code == F.JSONL:
        raise PlotError(f"{name!r} holds text, not numbers")
    if x != "step" and x not in r.metrics():
        raise PlotError(f"this run has no metric {x!r} for the x axis")
    return code


def curve(
    r: Reader, name: str, *, x: str, after: int
) -> tuple[Callable[[], Iterator[tuple[Array, Array, Array]]], tuple[float, float] | None]:
    """The rows of a curve after step `after`: a function giving (steps, x, y) slices of at
    most `CHUNK` rows (non-finite x dropped; called again, it reads them again), and the
    first and last x (None when there are no rows). A non-step x is checked to increase."""
    total = r.rows(name)
    i0 = _first_after(r, name, after, total)

    def rows() -> Iterator[tuple[Array, Array, Array]]:
        if x == "step":
            for steps, y in _chunks(r, name, i0, total):
                yield steps, steps, _numbers(y, name)
            return
        if x == name:
            joined: Iterator[tuple[Array, Array, Array]] = (
                (s, v, v) for s, v in _chunks(r, name, i0, total)
            )
        else:
            xrows = r.rows(x)
            xs = _chunks(r, x, _first_after(r, x, after, xrows), xrows)
            joined = _joined(xs, _chunks(r, name, i0, total))
        for steps, xv, y in joined:
            xf, yf = _numbers(xv, x), _numbers(y, name)
            ok = np.isfinite(xf)
            yield (steps, xf, yf) if ok.all() else (steps[ok], xf[ok], yf[ok])

    span = _step_span(r, name, i0, total) if x == "step" else _x_span(rows(), x)
    return rows, span


def _chunks(r: Reader, name: str, start: int, stop: int) -> Iterator[tuple[Array, Array]]:
    """(steps, values) of rows [start, stop), `CHUNK` rows at a time."""
    for i in range(start, stop, CHUNK):
        yield r.metric(name, dtype="storage", istart=i, istop=min(i + CHUNK, stop))


def _first_after(r: Reader, name: str, after: int, total: int) -> int:
    """Position of the first of `total` rows with a step above `after` (steps increase).

    Galloping back from the end, then bisecting: a live tail of k rows costs about
    2 log2(k) single-row reads, never the column's whole index.
    """
    if after < 0:
        return 0

    def step(i: int) -> int:
        return int(r.metric(name, idx=i, dtype="storage")[0])

    lo, hi, gap = 0, total, 1
    while hi - gap >= 0:
        if step(hi - gap) <= after:
            lo = hi - gap + 1
            break
        hi, gap = hi - gap, gap * 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if step(mid) <= after else (lo, mid)
    return lo


def _joined(
    a: Iterator[tuple[Array, Array]], b: Iterator[tuple[Array, Array]]
) -> Iterator[tuple[Array, Array, Array]]:
    """(steps, a values, b values) at the steps both chunked, step-sorted columns have."""
    ca, cb = next(a, None), next(b, None)
    while ca is not None and cb is not None:
        (sa, va), (sb, vb) = ca, cb
        if len(sa) and len(sb):
            upto = min(sa[-1], sb[-1])
            ka = int(np.searchsorted(sa, upto, "right"))
            kb = int(np.searchsorted(sb, upto, "right"))
            common, ia, ib = np.intersect1d(
                sa[:ka], sb[:kb], assume_unique=True, return_indices=True
            )
            yield common, va[ia], vb[ib]
        else:
            ka, kb = len(sa), len(sb)
        ca = (sa[ka:], va[ka:]) if ka < len(sa) else next(a, None)
        cb = (sb[kb:], vb[kb:]) if kb < len(sb) else next(b, None)


def _step_span(r: Reader, name: str, i0: int, total: int) -> tuple[float, float] | None:
    """First and last step of rows [i0, total): the span a step axis divides."""
    if i0 >= total:
        return None
    first = r.metric(name, idx=i0, dtype="storage")[0]
    return float(first), float(r.metric(name, idx=total - 1, dtype="storage")[0])


def _x_span(rows: Iterator[tuple[Array, Array, Array]], x: str) -> tuple[float, float] | None:
    """First and last x of the curve, checking on the way that x never decreases."""
    span: tuple[float, float] | None = None
    for _steps, xv, _y in rows:
        if not len(xv):
            continue
        prev = span[1] if span else -math.inf
        if xv[0] < prev or not bool(np.all(np.diff(xv) >= 0)):
            raise PlotError(f"{x!r} does not increase over the steps of this run")
        span = (span[0] if span else float(xv[0]), float(xv[-1]))
    return span
