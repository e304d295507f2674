"""Runs for the dashboard and plot tests: made by chute's writers, or raw on-disk files."""

from __future__ import annotations

import json
import os

import numpy as np

import chute.metrics as cm


def write_run(path, steps=300, *, scale=300.0, finish=False, text=True, seed=0, warmup=50):
    """A run with loss (decaying), walltime (increasing), lr (schedule), acc (every 10)."""
    rng = np.random.default_rng(seed)
    w = cm.DirectWriter(path)
    w.set_config({"lr": 1e-3, "seed": seed})
    for s in range(steps):
        w.write(
            loss=float(np.exp(-s / scale) + abs(rng.normal(0, 0.01))),
            walltime=100.0 + s,
            lr=float(min(1.0, (s + 1) / warmup)),
        )
        if s % 10 == 0:
            w.write(acc=float(1 - np.exp(-s / 100)))
            if text:
                w.write(note=f"eval {s}")
        w.end_step()
    if finish:
        w.finish()
        return None
    w.flush()
    return w


def raw_run(path, columns, *, finished=False):
    """A `plattli/` folder written byte by byte from the format: {name: (steps, values)}."""
    pdir = os.path.join(path, "plattli")
    os.makedirs(pdir, exist_ok=True)
    manifest = {}
    for name, (steps, values) in columns.items():
        values = np.asarray(values)
        code = {"float32": "f32", "float64": "f64", "int64": "i64"}[values.dtype.name]
        os.makedirs(os.path.dirname(os.path.join(pdir, name)), exist_ok=True)
        np.asarray(steps, "<u4").tofile(os.path.join(pdir, name + ".indices"))
        values.astype(values.dtype.newbyteorder("<")).tofile(os.path.join(pdir, f"{name}.{code}"))
        manifest[name] = {"indices": "indices", "dtype": code}
    if finished:
        manifest["run_rows"] = max(len(s) for s, _ in columns.values())
    with open(os.path.join(pdir, "plattli.json"), "w") as f:
        json.dump(manifest, f)
    return path


def client(*paths):
    """A test client of a dashboard serving ``paths`` (imported here: only the dashboard
    tests need starlette)."""
    from starlette.testclient import TestClient

    from chute.metrics.dashboard import create_app

    return TestClient(create_app([str(p) for p in paths]))


def runs_by_name(c):
    """The run list, by run name."""
    res = c.get("/api/runs")
    assert res.status_code == 200
    return {r["name"]: r for r in res.json()["runs"]}
