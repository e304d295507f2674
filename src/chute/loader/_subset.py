"""Subsets of an index space: hold out a validation set without copying any data."""

from __future__ import annotations

import hashlib
import itertools
import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.checks import check_int
from chute._util.renamed import legacy_arguments
from chute.loader._sampler import Sampler


class IndexSet:
    """The records a loader draws from, as positions ``0..len-1`` of the given indices.

    Samplers and evaluation passes work on positions; a batch maps them through the array,
    so a subset costs one uint64 per member and no copy of the data. ``fingerprint`` (the
    count and a hash of the indices) is what the loader's state keeps.
    """

    def __init__(self, indices: npt.ArrayLike, length: int) -> None:
        idx = np.asarray(indices)
        if idx.ndim != 1 or idx.size == 0:
            raise ValueError(f"indices= must be a non-empty 1-D array, got shape {idx.shape}")
        if idx.dtype.kind not in "iu":
            raise TypeError(f"indices= must hold integers, got {idx.dtype}")
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= length:
            bad = low if low < 0 else high
            raise IndexError(f"indices= holds {bad}, outside the streams' {length} records")
        self.array: npt.NDArray[np.uint64] = np.ascontiguousarray(idx, dtype=np.uint64)
        self.array.flags.writeable = False
        digest = hashlib.blake2b(self.array.astype("<u8").tobytes(), digest_size=8).hexdigest()
        self.fingerprint = f"{idx.size}:{digest}"

    def __len__(self) -> int:
        return int(self.array.size)

    def map(self, positions: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """The record indices at ``positions``."""
        return self.array[positions]


@legacy_arguments(positional=("seed",))
def split(n: int, fractions: Sequence[float], *, seed: int = 0) -> list[npt.NDArray[np.int64]]:
    """Split ``range(n)`` at random into disjoint parts of the given fractions (summing to 1).

    The parts come from one seeded permutation (chute's own, so the split is the same on
    every machine and numpy version) and are sorted, so an evaluation pass over a part reads
    the store in order. Sizes are rounded so that they add up to ``n`` exactly.

    >>> train, val = split(10, [0.8, 0.2], seed=1)
    >>> len(train), len(val), sorted([*train, *val]) == list(range(10))
    (8, 2, True)
    """
    n = check_int("n", n, minimum=1)
    given: list[Any] = list(fractions)
    if not given or any(isinstance(f, bool) or not isinstance(f, numbers.Real) for f in given):
        raise ValueError(f"fractions must be numbers in [0, 1], got {fractions!r}")
    parts = [float(f) for f in given]
    if not all(0 <= f <= 1 for f in parts):
        raise ValueError(f"fractions must be numbers in [0, 1], got {fractions!r}")
    if not math.isclose(math.fsum(parts), 1.0, abs_tol=1e-9):
        raise ValueError(f"fractions must add up to 1, got {math.fsum(parts)}")
    order = Sampler(n, n, "cyclic", seed).indices(0).astype(np.int64)
    edges = [round(n * math.fsum(parts[:i])) for i in range(len(parts) + 1)]
    edges[-1] = int(n)
    return [np.sort(order[a:b]) for a, b in itertools.pairwise(edges)]
