"""Fixed-shape tensors over a record store: `write_dataset` and `Dataset`."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from chute._schema import WriteMode, check_plain_dtype, open_for_writing
from chute._util.progress import STEP_BYTES, Progress
from chute._view import StoreView, check_indices, index_bounds
from chute.datasets._append import write_sharded
from chute.datasets._write import check_sharding, replacing_shards
from chute.errors import OutBufferError
from chute.ragged import BYTES, RaggedDataset, write_ragged
from chute.store import Codec
from chute.store._internal import MAX_RECORD, sample_rows

__all__ = ["Dataset", "write_dataset"]


BytesRecords = Sequence[bytes | bytearray | memoryview]
"""A list (or tuple) of byte strings: `write_dataset` stores them as variable-length records."""


@overload
def write_dataset(
    path: str | os.PathLike[str],
    array: BytesRecords,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    *,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    shard_records: int | None = None,
    workers: int | None = None,
) -> RaggedDataset: ...
@overload
def write_dataset(
    path: str | os.PathLike[str],
    array: Any,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    *,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    shard_records: int | None = None,
    workers: int | None = None,
) -> Dataset: ...
def write_dataset(
    path: str | os.PathLike[str],
    array: Any,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    *,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    shard_records: int | None = None,
    workers: int | None = None,
) -> Dataset | RaggedDataset:
    r"""Write ``array`` as one record per slice along axis 0 and return it opened.

    ``array`` is anything with ``shape``, ``dtype`` and slicing (a memory-mapped ``.npy``,
    an h5py or zarr array); it is read ``chunk_bytes`` at a time, never whole. A 1-D array
    becomes a dataset of scalars. ``codec`` is ``"zstd"`` (level 3), ``"raw"`` or
    ``"zstd_dict"`` (a dictionary of at most ``dict_size`` bytes trained on a spread of rows,
    then level 19); the default is ``"zstd"``, or the store's own codec when appending.
    ``progress`` shows a bar (in MiB, moving at least every second or so, dictionary
    training included); by default only for writes over 256 MiB.

    ``mode="w"`` writes a new store and refuses an existing one unless ``overwrite=True``;
    ``mode="a"`` appends to an existing store (or creates it), after checking that the
    array's dtype and row shape are the store's (`SchemaMismatchError` otherwise).

    ``shard_records=N`` writes a sharded dataset (stores of N records each and a manifest,
    see `chute.datasets`), ``workers`` shards at a time in a process pool; ``mode="a"``
    on a sharded dataset appends to it (`chute.append_dataset`).

    A list or tuple of ``bytes`` (``bytearray``, ``memoryview``) is stored byte for byte as
    variable-length records (`write_ragged` of ``uint8`` records): the call returns a
    `RaggedDataset`, where ``ds[i].tobytes()`` is record i and ``ds[indices]`` a packed
    batch ``(values, row_splits)``. A fixed-width bytes array (numpy dtype ``S<n>``) is stored
    only when passed as a numpy array, and then as numpy's NUL-padded type: every record is
    n bytes, and numpy drops trailing NUL bytes when it reads one.

    >>> import tempfile, numpy as np
    >>> rows = np.arange(12, dtype=np.int16).reshape(4, 3)
    >>> ds = write_dataset(tempfile.mkdtemp() + "/x.zr", rows)
    >>> ds[1:3].tolist()
    [[3, 4, 5], [6, 7, 8]]
    >>> blobs = write_dataset(tempfile.mkdtemp() + "/b.zr", [b"ab\x00", b"c", b"\x00\x00"])
    >>> [blobs[i].tobytes() for i in range(len(blobs))]
    [b'ab\x00', b'c', b'\x00\x00']
    """
    if _is_bytes_records(array):
        return write_ragged(
            path, array, np.uint8, (),
            codec, chunk_bytes, dict_size, mode=mode, level=level, overwrite=overwrite,
            shard_records=shard_records, workers=workers, progress=progress,
        )  # fmt: skip
    path = Path(path)
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        array = np.asarray(array)
    dtype = np.dtype(array.dtype)
    shape = tuple(int(d) for d in array.shape)
    if not shape:
        raise ValueError("write_dataset needs an array with at least one axis (a record per row)")
    check_plain_dtype(dtype)
    row_bytes = dtype.itemsize * math.prod(shape[1:])
    if row_bytes > MAX_RECORD:
        raise ValueError(f"one row is {row_bytes} bytes; the Zrecord format caps a record at 1 MiB")
    check_sharding(shard_records, workers)
    options = {"codec": codec, "chunk_bytes": chunk_bytes, "dict_size": dict_size, "level": level}
    if write_sharded(
        path, "fixed", array, mode=mode, overwrite=overwrite,
        shard_records=shard_records, workers=workers, options=options,
    ):  # fmt: skip
        return Dataset(path)
    n = shape[0]
    rows_per_read = max(1, chunk_bytes // max(row_bytes, 1))
    rows_per_step = max(1, min(chunk_bytes, STEP_BYTES) // max(row_bytes, 1))
    fields = {"dtype": dtype.str, "shape": list(shape[1:])}
    with replacing_shards(path, overwrite=overwrite):
        store, c = open_for_writing(
            path, fields, mode=mode, overwrite=overwrite, codec=codec, level=level
        )
    with store, Progress(n * row_bytes, f"write {path.name}", show=progress) as bar:
        if c is Codec.ZSTD_DICT and not store.has_dict and n:
            picks = sample_rows(n, row_bytes, dict_size)
            samples = _rows_as_bytes(np.asarray(array[picks]), len(picks))
            bar.while_running(
                "training zstd dictionary", lambda: store.train_dict(samples, dict_size)
            )
        for start in range(0, n, rows_per_read):
            rows = _rows_as_bytes(np.asarray(array[start : start + rows_per_read]), -1)
            for k in range(0, len(rows), rows_per_step):  # small steps: a bar that moves
                store.append(rows[k : k + rows_per_step])
                bar.advance(len(rows[k : k + rows_per_step]) * row_bytes)
    return Dataset(path)


def _is_bytes_records(array: Any) -> bool:
    """A list or tuple of byte strings (which numpy would make a NUL-padded ``S`` array)."""
    return (
        isinstance(array, (list, tuple))
        and len(array) > 0
        and all(isinstance(item, BYTES) for item in array)
    )


def _rows_as_bytes(rows: npt.NDArray[Any], n: int) -> npt.NDArray[np.uint8]:
    n = len(rows) if n < 0 else n
    return np.ascontiguousarray(rows).reshape(n, -1).view(np.uint8).reshape(n, -1)


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

    def _flat(self, indices: Any) -> npt.NDArray[np.int64]:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            if idx.size:
                raise TypeError(f"dataset indices must be integers, got {idx.dtype}")
            idx = idx.astype(np.int64)
        flat = idx.reshape(-1)
        n = self._seen
        bounds = index_bounds(flat) if flat.size else None
        if bounds is None or bounds[0] < 0 or bounds[1] >= n:
            # only then ask the store (a writer may have appended since): the batch path
            # skips re-reading the header when every index is below a length already seen
            self._seen = n = len(self)
        return check_indices(flat, n, bounds)

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
                    raise IndexError(f"boolean mask of shape {idx.shape} does not match ({n},)")
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
