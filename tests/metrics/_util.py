"""Shared helpers for the metric-log tests."""

from __future__ import annotations

import numpy as np
import plattli

import chute.metrics as cm


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values and dtype (NaN equal to NaN)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    return a.tolist() == b.tolist()


def assert_readers_agree(path, kind=None) -> None:
    """chute's and plattli's Readers return the same data for every metric of a run."""
    with cm.Reader(path, kind=kind) as ours, plattli.Reader(path, kind=kind) as theirs:
        assert ours.metrics() == theirs.metrics()
        assert ours.manifest().keys() == theirs.manifest().keys()
        assert ours.config() == theirs.config()
        for name in theirs.metrics():
            assert ours.rows(name) == theirs.rows(name), name
            for dtype in ("standard", "storage"):
                s1, v1 = ours.metric(name, dtype=dtype)
                s2, v2 = theirs.metric(name, dtype=dtype)
                assert same(s1, s2), (name, s1, s2)
                assert same(v1, v2), (name, dtype, v1, v2)
            if theirs.rows(name):
                a, b = ours.metric(name, idx=-1), theirs.metric(name, idx=-1)
                assert a[0] == b[0] and (a[1] == b[1] or a[1] != a[1]), (name, a, b)
                mid = theirs.rows(name) // 2
                steps = theirs.metric_indices(name)
                selections = [
                    {"istart": mid},
                    {"istart": -3, "istop": -1},
                    {"start": int(steps[mid]), "stop": int(steps[-1]) - 1},
                ]
                if theirs.manifest().get(name, {}).get("dtype", "jsonl") != "jsonl":
                    lo = theirs.metric(name, idx=mid, dtype="storage")[1]
                    selections.append({"vstart": lo})
                    selections.append({"vstop": lo})
                for sel in selections:
                    s1, v1 = ours.metric(name, **sel)
                    s2, v2 = theirs.metric(name, **sel)
                    assert same(s1, s2) and same(v1, v2), (name, sel)
