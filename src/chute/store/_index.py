"""The one index normaliser: record indices as flat int64, checked against n records.

Every entry point of the record layers (`RecordStore`, the sharded store, `Dataset`,
`RaggedDataset`) takes its indices through here, so a wrong index is the same
`RecordIndexError` (a `ChuteError` and an `IndexError`) from each. It lives in the store,
the lowest layer that reads records, so the typed layer above uses it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from chute.errors import RecordIndexError

IndexLike = int | Sequence[int] | npt.NDArray[np.integer[Any]]
"""What the record readers take as indices: an int, a sequence of ints, an integer array."""


def as_indices(indices: Any) -> npt.NDArray[Any]:
    """``indices`` as an integer array of their own shape (an empty one of any dtype, as
    ``[]`` arrives, becomes int64); anything else, booleans included, is a TypeError.

    >>> as_indices([3, 1]).tolist(), as_indices([]).dtype
    ([3, 1], dtype('int64'))
    """
    arr = np.asarray(indices)
    if arr.dtype.kind not in "iu":  # bool is kind "b": a mask, not an index
        if arr.size:
            raise TypeError(f"record indices must be integers, got {arr.dtype}")
        return arr.astype(np.int64)
    return arr


def index_bounds(flat: npt.NDArray[Any]) -> tuple[int, int]:
    """The smallest and largest of a non-empty flat index array."""
    if flat.size == 1:  # a single record: plain ints, no reductions (the batch-1 read path)
        lo = int(flat[0])
        return lo, lo
    return int(flat.min()), int(flat.max())


def out_of_range(index: int, n: int) -> RecordIndexError:
    """The one error of an index outside ``n`` records."""
    return RecordIndexError(f"record index {index} is out of range for a dataset of {n} records")


def check_indices(
    idx: npt.NDArray[Any],
    n: int,
    bounds: tuple[int, int] | None = None,
    *,
    negative: bool = True,
) -> npt.NDArray[np.int64]:
    """Integer indices (from `as_indices`) as flat C-contiguous int64 within ``n`` records;
    with ``negative``, negatives count from the end (as numpy does), else they are out of
    range. ``bounds`` is their `index_bounds` where the caller has it already.

    >>> check_indices(np.array([0, -1]), 4).tolist()
    [0, 3]
    >>> check_indices(np.array([4]), 4)
    Traceback (most recent call last):
    chute.errors.RecordIndexError: record index 4 is out of range for a dataset of 4 records
    """
    flat = idx.reshape(-1)
    if not flat.size:
        return flat.astype(np.int64)
    lo, hi = index_bounds(flat) if bounds is None else bounds
    low = -n if negative else 0
    if lo < low or hi >= n:
        raise out_of_range(int(flat[(flat < low) | (flat >= n)][0]), n)
    return flat_int64(np.where(flat < 0, flat + n, flat) if lo < 0 else flat)


def flat_int64(idx: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Integer indices as a flat C-contiguous int64 array (the array itself where it is one)."""
    if idx.dtype == np.int64 and idx.ndim == 1 and idx.flags.c_contiguous:
        return idx
    return np.ascontiguousarray(idx.reshape(-1), dtype=np.int64)
