"""`Dataset`: fixed-shape records over a store (or a sharded dataset), read as numpy arrays."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from chute.datasets._view import StoreView
from chute.errors import OutBufferError, RecordIndexError
from chute.store._internal import check_indices

__all__ = ["Dataset"]


class Dataset(StoreView):
    """A read-only, numpy-indexable view of a store written by `write_dataset` (or loaderx).

    ``ds[i]``, ``ds[-1]``, ``ds[a:b:s]``, ``ds[[i, j]]``, ``ds[index_array]`` (any shape)
    and ``ds[bool_mask]`` return numpy arrays; every form is one native gather across cores.
    ``verify=True`` checks each returned record against its CRC-32C.

    >>> import tempfile, numpy as np
    >>> from chute import Dataset, write_dataset
    >>> path = tempfile.mkdtemp() + "/x.zr"
    >>> write_dataset(path, np.arange(12, dtype=np.float32).reshape(4, 3)).close()
    >>> with Dataset(path) as ds:
    ...     print(ds.shape, ds.dtype)
    ...     print(ds[-1].tolist(), ds[[2, 0]].tolist())
    (4, 3) float32
    [9.0, 10.0, 11.0] [[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]
    """

    _ragged = False

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self._item_shape)

    @property
    def ndim(self) -> int:
        """Number of axes, the record axis included (as numpy, h5py and zarr arrays)."""
        return 1 + len(self._item_shape)

    @property
    def size(self) -> int:
        """Number of elements in the whole dataset."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Decoded bytes of the whole dataset (not its size on disk)."""
        return self.size * self._dtype.itemsize

    def __getitems__(self, indices: Any) -> npt.NDArray[Any]:
        """A batch ``(n, *item_shape)`` for a flat sequence of indices: one native call."""
        return self._take(self._flat(indices))

    def gather_into(self, indices: Any, out: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """``__getitems__`` written into ``out``, an array of ``(len(indices), *item_shape)``
        and the dataset's dtype (a reused or page-locked buffer); returns ``out``.

        >>> import tempfile, numpy as np
        >>> from chute import write_dataset
        >>> ds = write_dataset(tempfile.mkdtemp() + "/x.zr", np.arange(6).reshape(3, 2))
        >>> ds.gather_into([2, 0], np.empty((2, 2), ds.dtype)).tolist()
        [[4, 5], [0, 1]]
        """
        idx = self._flat(indices)
        want = (len(idx), *self._item_shape)
        if out.dtype != self._dtype:
            raise OutBufferError(f"out has dtype {out.dtype}, the batch is {self._dtype}")
        if out.shape != want:
            raise OutBufferError(f"out has shape {out.shape}, the batch is {want}")
        self._store.gather(idx, out)
        return out

    def __getitem__(self, key: Any) -> npt.NDArray[Any]:
        rest: tuple[Any, ...] = ()
        if isinstance(key, tuple):
            if not key:
                key = slice(None)
            else:
                key, rest = key[0], key[1:]
        n = len(self)
        out: npt.NDArray[Any]
        if isinstance(key, (bool, np.bool_)):
            raise TypeError("a boolean scalar is not a dataset index")
        if isinstance(key, (int, np.integer)):
            k = int(key)
            out = self._take(check_indices(np.array([k]), n, (k, k)))[0]
        elif isinstance(key, slice):
            out = self._take(np.arange(n, dtype=np.int64)[key])
        else:
            idx = np.asarray(key)
            if idx.dtype == np.bool_:
                if idx.shape != (n,):
                    raise RecordIndexError(
                        f"boolean mask of shape {idx.shape} does not match ({n},)"
                    )
                idx = np.flatnonzero(idx)
            elif idx.dtype.kind not in "iu":
                if idx.size or idx.dtype != np.float64:  # [] arrives as an empty float array
                    raise TypeError(
                        f"dataset indices must be integers or a boolean mask, got {idx.dtype}"
                    )
                idx = idx.astype(np.int64)
            out = self._take(check_indices(idx, n)).reshape(*idx.shape, *self._item_shape)
        if rest:  # the remaining axes index within each record, as numpy would
            lead = (slice(None),) * (out.ndim - len(self._item_shape))
            out = out[(*lead, *rest)]
        return out

    def _take(self, idx: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        out = np.empty((len(idx), *self._item_shape), self._dtype)
        self._store.gather(idx, out)
        return out

    def __repr__(self) -> str:
        return f"Dataset({str(self._path)!r}, shape={self.shape}, dtype={self._dtype})"
