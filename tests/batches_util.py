"""Comparing batches as the device tests do: the same keys and the same values, wherever
the arrays live (numpy, torch on the CPU, JAX)."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_same_batches(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    """``got`` holds as many batches as ``want``, each with its keys and values."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            np.testing.assert_array_equal(np.asarray(g[k]), w[k])
