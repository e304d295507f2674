"""Batch output arrays, reused once nothing outside the ring references them.

A fresh multi-megabyte array costs the kernel a page fault and a zeroed page for every
page the gather then writes: on the benchmark workload about a tenth of the loader's CPU.
And page-locked memory (what a fast host-to-device copy needs) is far dearer to allocate.
So both loaders (`chute.DataLoader` once given a ring, and ``chute.insitu``) gather into
arrays handed out here, and an array handed out earlier whose memory only this ring still
references is rewritten instead of allocating. A batch the caller still holds, or anything
sharing its memory (a view, a tensor made through DLPack or ``torch.from_numpy``, a copy to
a device still in flight that holds the batch), keeps a reference and is never reused.

Each allocation is a flat ``uint8`` *root* that numpy views collapse to (it owns its memory,
or its base is not an ndarray: a ``torch`` tensor for page-locked memory), so every view of
a handed-out array counts against its root, however it was derived.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.tree import tree_map

__all__ = ["Allocate", "BatchBuffers"]

Allocate = Callable[[int], npt.NDArray[np.uint8]]
"""``nbytes -> flat uint8 array`` that owns its memory (or whose base is not an ndarray)."""


def plain(nbytes: int) -> npt.NDArray[np.uint8]:
    """Ordinary (pageable) memory."""
    return np.empty(nbytes, np.uint8)


def _refs(held: deque[Any], i: int) -> int:
    return sys.getrefcount(held[i])


# what _refs reports for an object that only the deque holds (differs between CPythons)
_ALONE = _refs(deque([object()]), 0)


class BatchBuffers:
    """Hands out arrays for batches, recycling those nothing else references any more.

    ``keep`` bounds how many recently handed-out roots are remembered for reuse; one still
    referenced elsewhere when it is forgotten is simply never recycled. ``allocate`` makes
    new roots (default: ordinary memory).

    >>> ring = BatchBuffers(keep=4)
    >>> a = ring.empty((2, 3), np.dtype(np.float32))
    >>> b = ring.empty((2, 3), np.dtype(np.float32))  # ``a`` is held: fresh memory
    >>> np.shares_memory(a, b)
    False
    >>> pointer = a.ctypes.data
    >>> del a
    >>> ring.empty((6,), np.dtype(np.float32)).ctypes.data == pointer  # same bytes, reused
    True
    """

    def __init__(self, keep: int, allocate: Allocate = plain) -> None:
        if keep < 1:
            raise ValueError(f"keep must be positive, got {keep}")
        self._held: deque[npt.NDArray[np.uint8]] = deque(maxlen=keep)  # most recent last
        self._lock = threading.Lock()
        self._allocate = allocate

    @property
    def allocate(self) -> Allocate:
        return self._allocate

    @allocate.setter
    def allocate(self, allocate: Allocate) -> None:
        """Switch where new roots come from; roots made the old way are not reused."""
        with self._lock:
            self._allocate = allocate
            self._held.clear()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        """An array of ``shape`` and ``dtype`` with arbitrary contents, for the caller to fill."""
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError(f"dtype {dtype} holds Python objects: no raw buffer can hold it")
        nbytes = int(math.prod(shape)) * dtype.itemsize  # no numpy call: this runs per batch
        with self._lock:
            held, allocate = self._held, self._allocate
            root = None
            for i in range(len(held)):
                if held[i].nbytes == nbytes and _refs(held, i) <= _ALONE:
                    root = held[i]
                    del held[i]
                    break
        if root is None:  # allocate outside the lock: page-locked memory is slow to get
            root = allocate(nbytes)
            _check_root(root, nbytes)
        with self._lock:
            if allocate is self._allocate:
                self._held.append(root)
        return root.view(dtype).reshape(shape)

    def owns(self, array: npt.NDArray[Any]) -> bool:
        """Whether ``array`` is (a view of) memory handed out by this ring."""
        base = array if array.base is None else array.base
        with self._lock:
            return any(base is root for root in self._held)

    def adopt(self, tree: Any) -> Any:
        """``tree`` with every numpy array not already in this ring's memory copied into it
        (arrays of Python objects pass through), so that all of a batch is in ring memory."""

        def leaf(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
            if array.dtype.hasobject or self.owns(array):
                return array
            out = self.empty(array.shape, array.dtype)
            np.copyto(out, array)
            return out

        return tree_map(tree, leaf)


def _check_root(root: npt.NDArray[Any], nbytes: int) -> None:
    if not isinstance(root, np.ndarray) or root.dtype != np.uint8 or root.shape != (nbytes,):
        raise TypeError(f"an allocator must return a flat uint8 array of {nbytes} bytes")
    if isinstance(root.base, np.ndarray):  # views of it would not count against it
        raise TypeError("an allocator must return an array that owns its memory, not a view")
