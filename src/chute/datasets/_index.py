"""The one index normaliser of the typed layer: integer indices into a dataset of n records,
negatives counted from the end (as numpy does), anything out of range a `RecordIndexError`."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from chute.errors import RecordIndexError


def index_bounds(flat: npt.NDArray[Any]) -> tuple[int, int]:
    """The smallest and largest of a non-empty flat index array."""
    if flat.size == 1:  # a single record: plain ints, no reductions (the batch-1 read path)
        lo = int(flat[0])
        return lo, lo
    return int(flat.min()), int(flat.max())


def check_indices(
    idx: npt.NDArray[Any], n: int, bounds: tuple[int, int] | None = None
) -> npt.NDArray[np.int64]:
    """Integer indices as flat int64, negatives counted from the end (as numpy does);
    ``bounds`` is their `index_bounds` where the caller has it already."""
    flat = idx.reshape(-1)
    if not flat.size:
        return flat.astype(np.int64)
    lo, hi = index_bounds(flat) if bounds is None else bounds
    if lo < -n or hi >= n:
        bad = flat[(flat < -n) | (flat >= n)][0]
        raise RecordIndexError(f"index {int(bad)} is out of range for a dataset of {n} records")
    if lo >= 0:
        return flat if flat.dtype == np.int64 else flat.astype(np.int64)
    return np.where(flat < 0, flat + n, flat).astype(np.int64)
