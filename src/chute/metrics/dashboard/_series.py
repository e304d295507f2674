"""One chart curve of one run: read, thinned for the chart width, optionally smoothed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from chute.errors import PlotError

from .. import _format as F
from .._reader import Reader
from .._smooth import ema, thin

MIN_WIDTH, MAX_WIDTH = 16, 8192


def _json_floats(a: np.ndarray[Any, Any]) -> list[float | None]:
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

    With `smooth` > 0 (only on full reads, `after` < 0) it also carries the EMA at the
    kept rows and the EMA state after the last row, so the page can extend it.
    """
    code = r.manifest().get(name, {}).get("dtype")
    if code == F.JSONL:
        raise PlotError(f"{name!r} holds text, not numbers")
    sel: dict[str, Any] = {"start": after + 1} if after >= 0 else {}
    if x == "step":
        steps, y = r.metric(name, dtype="storage", **sel)
        xs: np.ndarray[Any, Any] = steps
    else:
        if x not in r.metrics():
            raise PlotError(f"this run has no metric {x!r} for the x axis")
        steps, cols = r.table(dict.fromkeys([x, name]), on=x, dtype="storage", **sel)
        xs, y = _numbers(cols[x], x), cols[name]
    y = _numbers(y, name)
    if xs.dtype.kind == "f":
        ok = np.isfinite(xs)
        if not ok.all():
            xs, y, steps = xs[ok], y[ok], steps[ok]
        if len(xs) > 1 and not bool(np.all(np.diff(xs) >= 0)):
            raise PlotError(f"{x!r} does not increase over the steps of this run")
    keep = thin(xs, y, width)
    whole = len(keep) == len(xs)
    out: dict[str, Any] = {
        "x": (xs if whole else xs[keep]).tolist() if x == "step" else _json_floats(xs[keep]),
        "y": _json_floats(y if whole else y[keep]),
        "rows": len(xs),
        "last_step": int(steps[-1]) if len(steps) else after,
        "dtype": code or "hot",
    }
    if smooth > 0 and after < 0:
        s, acc, weight = ema(y, smooth)
        out["s"] = _json_floats(s if whole else s[keep])
        out["ema"] = [acc, weight]
    return out
