"""The front-door demo, shortened (``--quick``), so it cannot rot.

It runs the whole story in a child process: conversion, training with a real SIGKILL and a
resume, the Zarr evaluation and the plot; the demo itself raises if any of its checks fails
(resumed metrics equal the uninterrupted run's, val accuracy >= 0.9, Zarr accuracy equal to
the store's). Here we check what it leaves on disk through the public API.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the demo's data ship with scikit-learn (demo extra)")
pytest.importorskip("zarr", reason="the demo writes a Zarr copy (demo extra)")
pytest.importorskip("matplotlib", reason="the demo plots its run (demo extra)")

import chute
from chute.metrics import Reader

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def test_quick_demo_tells_the_story(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, str(DEMO), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    for marker in ("[1]", "[2]", "[3] SIGKILLed", "step for step", "[4]", "[5]", "summary"):
        assert marker in text, f"{marker!r} missing from the demo's output:\n{text}"

    png = out / "training.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in text

    images = np.load(out / "images.npy")
    with chute.Dataset(out / "images.zr") as ds:
        assert np.array_equal(ds[:], images)
        assert ds.store.stats()["codecs"]["zstd_dict"] > 0

    with Reader(out / "run" / "metrics") as a, Reader(out / "run-uninterrupted" / "metrics") as b:
        for name in ("loss", "lr", "val_acc"):
            sa, va = a.metric(name)
            sb, vb = b.metric(name)
            assert np.array_equal(sa, sb) and np.array_equal(va, vb), name
        steps, acc = a.metric("val_acc")
        assert acc[-1] >= 0.9
        assert len(a.metric("loss")[0]) == int(steps[-1]) + 1  # a row per step, none lost
