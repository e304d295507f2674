"""Variable-length records: sequences that share a dtype and a row shape but not a length.

A batch comes back packed, as ``(values, row_splits)``: every record's rows end to end in one
flat array, record i being ``values[row_splits[i]:row_splits[i + 1]]``. Padding to a dense
batch is a separate, visible step (`pad`), usually the loader's collate transform. The layout
on disk (one byte record per sequence, ``schema.json`` with ``"ragged": true``) is loaderx's,
so either library opens the other's stores.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.renamed import legacy_arguments
from chute.datasets._view import StoreView
from chute.errors import CorruptStoreError

__all__ = ["Packed", "RaggedDataset", "pad"]

Packed = tuple[npt.NDArray[Any], npt.NDArray[np.int64]]
"""``(values, row_splits)``: all rows of a batch end to end, and the n+1 record edges."""


def _pad_width(lengths: npt.NDArray[np.int64], max_len: int | None) -> int:
    """The padded width: the longest record, or ``max_len``, which no record may exceed."""
    longest = int(lengths.max()) if lengths.size else 0
    width = longest if max_len is None else int(max_len)
    if width < 0:
        raise ValueError(f"max_len must be non-negative, got {max_len}")
    if longest > width:
        raise ValueError(f"a record has {longest} rows, over max_len={width}")
    return width


@legacy_arguments(positional=("max_len", "pad_value"))
def pad(
    values: npt.NDArray[Any],
    row_splits: npt.ArrayLike,
    *,
    max_len: int | None = None,
    pad_value: Any = 0,
) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """A packed batch as a dense ``(n, max_len, *item_shape)`` array plus each record's rows.

    ``max_len`` defaults to the longest record; a record longer than ``max_len`` is an error,
    never silently cut.

    >>> import numpy as np
    >>> padded, lengths = pad(np.array([5, 6, 7, 8, 9]), [0, 3, 4, 5], max_len=4, pad_value=-1)
    >>> padded.tolist(), lengths.tolist()
    ([[5, 6, 7, -1], [8, -1, -1, -1], [9, -1, -1, -1]], [3, 1, 1])
    """
    values = np.asarray(values)
    splits = np.asarray(row_splits)
    if splits.ndim != 1 or splits.size == 0 or not np.issubdtype(splits.dtype, np.integer):
        raise ValueError("row_splits must be a non-empty 1-D integer array of record edges")
    splits = splits.astype(np.int64)
    lengths = np.diff(splits)
    if values.ndim == 0:
        raise ValueError("values must have at least one axis (rows)")
    if splits[0] != 0 or splits[-1] != len(values) or (lengths < 0).any():
        raise ValueError(
            f"row_splits must rise from 0 to len(values)={len(values)}, "
            f"got {splits[0]}..{splits[-1]}"
        )
    width = _pad_width(lengths, max_len)
    padded = np.full((lengths.size, width, *values.shape[1:]), pad_value, dtype=values.dtype)
    padded[np.arange(width) < lengths[:, None]] = values
    return padded, lengths


class RaggedDataset(StoreView):
    """A read-only store of variable-length records written by `write_ragged` (or loaderx).

    ``ds[i]`` is record i, ``(rows, *item_shape)``; ``ds[indices]``, ``ds[a:b]`` and
    ``__getitems__`` return a packed batch ``(values, row_splits)`` from one native gather.
    It is a loader stream as it is: ``DataLoader({"tokens": ds, ...}, transform=collate)``.

    >>> import tempfile, numpy as np
    >>> from chute import RaggedDataset, write_ragged
    >>> path = tempfile.mkdtemp() + "/tokens.zr"
    >>> write_ragged(path, [np.arange(3), np.arange(1), np.arange(2)]).close()
    >>> ds = RaggedDataset(path)
    >>> values, row_splits = ds[[0, 2]]  # a packed batch
    >>> values.tolist(), row_splits.tolist(), ds.lengths([0, 1, 2]).tolist()
    ([0, 1, 2, 0, 1], [0, 3, 5], [3, 1, 2])
    >>> ds.getitems_padded([1, 2])[0].tolist()  # or padded, in one native call
    [[0, 0], [0, 1]]
    >>> ds.close()
    """

    _ragged = True

    def _check(self) -> None:
        self._row_bytes = self._dtype.itemsize * math.prod(self._item_shape)
        if self._row_bytes == 0:
            raise CorruptStoreError(f"{self._path}/schema.json describes zero-byte rows")

    def _rows(self, byte_counts: npt.NDArray[Any], what: str) -> npt.NDArray[np.int64]:
        rows, rest = np.divmod(byte_counts.astype(np.int64), self._row_bytes)
        if rest.any():
            raise CorruptStoreError(
                f"{self._path}: {what} is not a whole number of {self._row_bytes}-byte rows "
                f"of {self._dtype}{list(self._item_shape)}"
            )
        return rows

    def __getitems__(self, indices: Any) -> Packed:
        """The packed batch ``(values, row_splits)`` of a flat sequence of indices."""
        values, offsets = self._store.gather_packed(self._indices(indices))
        row_splits = self._rows(offsets, "a record")
        return values.view(self._dtype).reshape(-1, *self._item_shape), row_splits

    def __getitem__(self, key: Any) -> npt.NDArray[Any] | Packed:
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            values, _ = self.__getitems__([key])
            return values
        return self.__getitems__(key)

    def lengths(self, indices: Any) -> npt.NDArray[np.int64]:
        """Rows per record, from the record table alone (no data read): for bucketing."""
        return self._rows(self._store.lengths(self._indices(indices)), "a record")

    def getitems_padded(
        self, indices: Any, max_len: int | None = None, pad_value: Any = 0
    ) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        """Gather and pad in one step: ``(padded (n, max_len, *item_shape), lengths)``.

        Each record decodes straight into its row of the padded batch: one native call, no
        packed intermediate.
        """
        idx = self._indices(indices)
        lengths = self._rows(self._store.lengths(idx), "a record")
        width = _pad_width(lengths, max_len)
        padded = np.full((idx.size, width, *self._item_shape), pad_value, dtype=self._dtype)
        slot = width * self._row_bytes
        self._store.gather_into(idx, padded, np.arange(idx.size, dtype=np.uint64) * slot)
        return padded, lengths

    def __repr__(self) -> str:
        return (
            f"RaggedDataset({str(self._path)!r}, records={len(self)}, dtype={self._dtype}, "
            f"item_shape={self._item_shape})"
        )
