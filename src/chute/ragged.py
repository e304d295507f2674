"""Variable-length records: sequences that share a dtype and a row shape but not a length.

A batch comes back packed, as ``(values, row_splits)``: every record's rows end to end in one
flat array, record i being ``values[row_splits[i]:row_splits[i + 1]]``. Padding to a dense
batch is a separate, visible step (`pad`), usually the loader's collate transform. The layout
on disk (one byte record per sequence, ``schema.json`` with ``"ragged": true``) is loaderx's,
so either library opens the other's stores.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._schema import WriteMode, check_plain_dtype, open_for_writing
from chute._util.progress import STEP_BYTES, Progress
from chute._view import StoreView, check_indices
from chute.datasets._append import write_sharded
from chute.datasets._write import check_sharding, replacing_shards
from chute.errors import CorruptStoreError
from chute.store import Codec, RecordStore
from chute.store._internal import MAX_RECORD

__all__ = ["RaggedDataset", "pad", "write_ragged"]

BYTES = (bytes, bytearray, memoryview)
"""Records given as byte strings: stored as ``uint8`` rows, byte for byte."""

Packed = tuple[npt.NDArray[Any], npt.NDArray[np.int64]]
"""``(values, row_splits)``: all rows of a batch end to end, and the n+1 record edges."""


def _records(
    arrays: Iterable[Any], dtype: np.dtype[Any] | None, item_shape: tuple[int, ...] | None
) -> Iterator[tuple[npt.NDArray[Any], np.dtype[Any], tuple[int, ...]]]:
    """Each record as a contiguous array, checked against the dtype and row shape of the set
    (taken from the first record where not given)."""
    for i, item in enumerate(arrays):
        # bytes as they are, every byte: np.asarray would make a NUL-stripping S scalar
        record = (
            np.frombuffer(bytes(item), np.uint8) if isinstance(item, BYTES) else np.asarray(item)
        )
        if dtype is None:
            dtype = record.dtype
        if item_shape is None:
            item_shape = record.shape[1:]
        if record.ndim != 1 + len(item_shape) or record.shape[1:] != item_shape:
            expected = ", ".join(["rows", *map(str, item_shape)])
            raise ValueError(
                f"record {i} has shape {record.shape}; records of this set are ({expected})"
            )
        if record.dtype != dtype:
            if not np.can_cast(record.dtype, dtype, "same_kind"):
                raise TypeError(f"record {i} has dtype {record.dtype}, the set is {dtype}")
            record = record.astype(dtype)
        yield np.ascontiguousarray(record), dtype, item_shape


def write_ragged(
    path: str | os.PathLike[str],
    arrays: Iterable[Any],
    dtype: npt.DTypeLike | None = None,
    item_shape: tuple[int, ...] | None = None,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    *,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    shard_records: int | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> RaggedDataset:
    """Write an iterable of variable-length arrays, one record each, and return it opened.

    Every array is ``(rows, *item_shape)`` of one dtype; both are taken from the first array
    unless given (a plain 1-D array is a sequence of scalar rows; ``bytes``, ``bytearray``
    and ``memoryview`` records are ``uint8`` rows, stored byte for byte). Records are appended
    ``chunk_bytes`` at a time, so a generator is never held whole. ``codec`` is ``"zstd"``,
    ``"raw"`` or ``"zstd_dict"`` (the dictionary is trained on the first chunk's records);
    the default is ``"zstd"``, or the store's own codec when appending. ``mode`` is as in
    `write_dataset`: ``"a"`` appends records of the store's dtype and row shape.
    ``shard_records=N`` writes a sharded dataset of N records per store, ``workers`` shards
    at a time in a process pool (see `chute.datasets`); ``mode="a"`` on a sharded dataset
    appends to it (`chute.append_ragged`).
    ``progress`` shows a bar in MiB; by default once more than 256 MiB were written.

    >>> import tempfile, numpy as np
    >>> tokens = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])]
    >>> ds = write_ragged(tempfile.mkdtemp() + "/tokens.zr", tokens, dtype=np.int32)
    >>> len(ds), ds[0].tolist(), ds.dtype
    (3, [5, 6, 7], dtype('int32'))
    >>> ds.close()
    """
    path = Path(path)
    want_dtype = None if dtype is None else np.dtype(dtype)
    want_shape = None if item_shape is None else tuple(int(d) for d in item_shape)
    check_sharding(shard_records, workers)
    records = _records(arrays, want_dtype, want_shape)
    first = next(records, None)
    if first is None and (want_dtype is None or want_shape is None):
        raise ValueError("no records to write, and no dtype and item_shape to describe them")
    set_dtype = first[1] if first else want_dtype
    set_shape = first[2] if first else want_shape
    assert set_dtype is not None and set_shape is not None
    check_plain_dtype(set_dtype)
    options = {
        "codec": codec, "chunk_bytes": chunk_bytes, "dict_size": dict_size, "level": level,
        "dtype": set_dtype, "item_shape": set_shape,
    }  # fmt: skip
    rest = _within_cap(chain([first[0]] if first else [], (r for r, _, _ in records)))
    if write_sharded(
        path, "ragged", rest, mode=mode, overwrite=overwrite,
        shard_records=shard_records, workers=workers, options=options,
    ):  # fmt: skip
        return RaggedDataset(path)
    fields = {"ragged": True, "dtype": set_dtype.str, "item_shape": list(set_shape)}
    with replacing_shards(path, overwrite=overwrite):
        store, c = open_for_writing(
            path, fields, mode=mode, overwrite=overwrite, codec=codec, level=level
        )
    with store, Progress(None, f"write {path.name}", show=progress) as bar:
        pending: list[npt.NDArray[Any]] = [first[0]] if first else []
        size = pending[0].nbytes if pending else 0
        written = 0
        for record, _, _ in records:
            if size + record.nbytes > chunk_bytes and pending:
                written = _flush(store, pending, written, c, dict_size, bar)
                pending, size = [], 0
            pending.append(record)
            size += record.nbytes
        _flush(store, pending, written, c, dict_size, bar)
    return RaggedDataset(path)


def _within_cap(records: Iterable[npt.NDArray[Any]]) -> Iterator[npt.NDArray[Any]]:
    """The records, checked against the format's record cap by their index in the set."""
    for i, record in enumerate(records):
        if record.nbytes > MAX_RECORD:
            raise ValueError(
                f"record {i} is {record.nbytes} bytes; the Zrecord format caps a record at 1 MiB"
            )
        yield record


def _flush(
    store: RecordStore,
    records: list[npt.NDArray[Any]],
    written: int,
    codec: Codec,
    dict_size: int | None,
    bar: Progress,
) -> int:
    """Append one chunk of records (in small steps, so a bar moves); returns how many the
    store holds after it."""
    if not records:
        return written
    lengths = np.array([r.nbytes for r in records], np.int64)
    if int(lengths.max()) > MAX_RECORD:
        i = int(np.argmax(lengths > MAX_RECORD))
        raise ValueError(
            f"record {written + i} is {int(lengths[i])} bytes; "
            "the Zrecord format caps a record at 1 MiB"
        )
    flat = [r.reshape(-1).view(np.uint8) for r in records]
    if codec is Codec.ZSTD_DICT and not store.has_dict:
        bar.while_running("training zstd dictionary", lambda: store.train_dict(flat, dict_size))
    ends = np.cumsum(lengths)
    first = 0
    while first < len(records):
        base = int(ends[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(ends, base + STEP_BYTES, side="right")))
        store.append_packed(np.concatenate(flat[first:last]), lengths[first:last])
        bar.advance(int(ends[last - 1]) - base)
        first = last
    return written + len(records)


def _pad_width(lengths: npt.NDArray[np.int64], max_len: int | None) -> int:
    """The padded width: the longest record, or ``max_len``, which no record may exceed."""
    longest = int(lengths.max()) if lengths.size else 0
    width = longest if max_len is None else int(max_len)
    if width < 0:
        raise ValueError(f"max_len must be non-negative, got {max_len}")
    if longest > width:
        raise ValueError(f"a record has {longest} rows, over max_len={width}")
    return width


def pad(
    values: npt.NDArray[Any],
    row_splits: npt.ArrayLike,
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

    def __init__(
        self, path: str | os.PathLike[str], *, verify: bool = False, threads: int | None = None
    ) -> None:
        super().__init__(path, verify=verify, threads=threads)
        self._row_bytes = self._dtype.itemsize * math.prod(self._item_shape)
        if self._row_bytes == 0:
            self.close()
            raise CorruptStoreError(f"{self._path}/schema.json describes zero-byte rows")

    def _indices(self, key: Any) -> npt.NDArray[np.int64]:
        n = len(self)
        if isinstance(key, slice):
            return np.arange(n, dtype=np.int64)[key]
        idx = np.asarray(key)
        if idx.dtype == np.bool_ or not np.issubdtype(idx.dtype, np.integer):
            if idx.size:
                raise TypeError(f"dataset indices must be integers, got {idx.dtype}")
            return np.empty(0, np.int64)
        return check_indices(idx, n)

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
