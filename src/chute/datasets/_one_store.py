"""Writing one store of typed records: the one place the typed layer writes records into a
`RecordStore`, for the public writers (`chute.write_dataset`, `chute.write_ragged`) and for
each shard of a sharded dataset alike.

Fixed-shape rows go in as their bytes, one record per row (`write_rows`); variable-length
records one per sequence (`write_records`). Both are appended in steps of a few MiB so a
progress bar moves, the first chunk training the zstd dictionary where the codec has one,
and schema.json is written when the store is created (`open_for_writing`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from chute._util.progress import STEP_BYTES, Progress
from chute.datasets._schema import RecordSchema, check_plain_dtype
from chute.errors import SchemaMismatchError, StoreKindError
from chute.store import Codec, RecordStore
from chute.store._internal import check_record_bytes, codec_name, parse_codec, sample_rows

BYTES = (bytes, bytearray, memoryview)
"""Records given as byte strings: stored as ``uint8`` rows, byte for byte."""

WriteMode = Literal["w", "a"]
"""``"w"`` writes a new store (an existing one only with ``overwrite=True``); ``"a"`` appends."""


def check_write_mode(mode: str, overwrite: bool) -> None:
    """The one check of a writer's ``mode`` and ``overwrite`` (one store or sharded)."""
    if mode not in ("w", "a"):
        raise ValueError(f"mode must be 'w' (write a new store) or 'a' (append), got {mode!r}")
    if mode == "a" and overwrite:
        raise ValueError("overwrite=True replaces the dataset and mode='a' appends to it: pick one")


def occupied_error(path: Path) -> FileExistsError:
    """The one refusal to write over an existing dataset without ``overwrite=True``."""
    return FileExistsError(
        f"{path} exists and is not empty; pass mode='a' to append to it or overwrite=True "
        "to replace it"
    )


def check_kept_codec(path: Path | str, stored: str, codec: str | None) -> Codec:
    """The codec an append to a dataset written with ``stored`` uses: its own (``codec``,
    where given, must name it)."""
    if codec is not None and codec_name(parse_codec(codec)) != stored:
        raise ValueError(
            f"{path} is written with codec {stored!r}; appending keeps it (leave codec= out)"
        )
    return parse_codec(stored)


def open_for_writing(
    path: Path,
    schema: RecordSchema,
    *,
    mode: WriteMode,
    overwrite: bool,
    codec: str | None,
    level: int | None,
) -> tuple[RecordStore, Codec]:
    """The store at ``path`` open for appending records described by ``schema`` (its codec
    aside), and its codec.

    A new store gets ``schema`` (with the codec) as its schema.json. With ``mode="a"`` an
    existing store must have the same kind, dtype and record shape, and keeps its codec.
    """
    check_write_mode(mode, overwrite)
    fresh = not path.exists() or (path.is_dir() and not any(path.iterdir()))
    if mode == "a" and not fresh:
        existing = RecordSchema.read(path)
        if existing.ragged != schema.ragged:
            opener = "write_ragged" if existing.ragged else "write_dataset"
            raise StoreKindError(f"{path} holds {existing.describe()}: append with {opener}")
        if not existing.same_records(schema):
            raise SchemaMismatchError(
                f"{path} holds {existing.describe()}; cannot append {schema.describe()}"
            )
        c = check_kept_codec(path, existing.codec, codec)
        return RecordStore(path, mode="a", codec=c, level=level), c
    if not fresh and not overwrite:
        raise occupied_error(path)
    c = parse_codec("zstd" if codec is None else codec)
    store = RecordStore(path, mode="w", codec=c, level=level)
    try:
        schema.with_codec(codec_name(c)).write(path)
    except BaseException:
        store.close()
        raise
    return store, c


def describe_rows(array: Any) -> tuple[Any, np.dtype[Any], tuple[int, ...], int]:
    """``array`` (as an array where it is not one), its dtype, shape and bytes per row,
    checked: at least one axis, plain data, a row within the format's record cap."""
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        array = np.asarray(array)
    dtype = np.dtype(array.dtype)
    shape = tuple(int(d) for d in array.shape)
    if not shape:
        raise ValueError("write_dataset needs an array with at least one axis (a record per row)")
    check_plain_dtype(dtype)
    row_bytes = dtype.itemsize * math.prod(shape[1:])
    check_record_bytes(row_bytes, what="one row")
    return array, dtype, shape, row_bytes


def write_rows(
    path: Path,
    array: Any,
    *,
    mode: WriteMode = "w",
    overwrite: bool = False,
    codec: str | None = None,
    level: int | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    progress: bool | None = False,
    guard: contextlib.AbstractContextManager[Any] | None = None,
) -> int:
    """Write the rows of ``array`` (read ``chunk_bytes`` at a time) as one store at ``path``;
    returns how many.

    ``guard`` is held while the store is opened (the public writer's removal of a sharded
    dataset the new store replaces)."""
    array, dtype, shape, row_bytes = describe_rows(array)
    n = shape[0]
    rows_per_read = max(1, chunk_bytes // max(row_bytes, 1))
    rows_per_step = max(1, min(chunk_bytes, STEP_BYTES) // max(row_bytes, 1))
    schema = RecordSchema(dtype=dtype, item_shape=shape[1:])
    with guard or contextlib.nullcontext():
        store, c = open_for_writing(
            path, schema, mode=mode, overwrite=overwrite, codec=codec, level=level
        )
    with store, Progress(n * row_bytes, f"write {path.name}", show=progress) as bar:
        if c is Codec.ZSTD_DICT and not store.has_dict and n:
            picks = sample_rows(n, row_bytes, dict_size)
            samples = rows_as_bytes(np.asarray(array[picks]), len(picks))
            bar.while_running(
                "training zstd dictionary", lambda: store.train_dict(samples, dict_size)
            )
        for start in range(0, n, rows_per_read):
            rows = rows_as_bytes(np.asarray(array[start : start + rows_per_read]), -1)
            for k in range(0, len(rows), rows_per_step):  # small steps: a bar that moves
                store.append(rows[k : k + rows_per_step])
                bar.advance(len(rows[k : k + rows_per_step]) * row_bytes)
    return n


def write_records(
    path: Path,
    records: Iterable[npt.NDArray[Any]],
    dtype: np.dtype[Any],
    item_shape: tuple[int, ...],
    *,
    mode: WriteMode = "w",
    overwrite: bool = False,
    codec: str | None = None,
    level: int | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    progress: bool | None = False,
    guard: contextlib.AbstractContextManager[Any] | None = None,
) -> int:
    """Write ``records`` (checked by `checked_records` and `within_cap`) as one store of
    variable-length records at ``path``, ``chunk_bytes`` at a time; returns how many."""
    schema = RecordSchema(dtype=dtype, item_shape=item_shape, ragged=True)
    with guard or contextlib.nullcontext():
        store, c = open_for_writing(
            path, schema, mode=mode, overwrite=overwrite, codec=codec, level=level
        )
    with store, Progress(None, f"write {path.name}", show=progress) as bar:
        pending: list[npt.NDArray[Any]] = []
        size = written = 0
        for record in records:
            if size + record.nbytes > chunk_bytes and pending:
                written += append_records(store, pending, c, dict_size, bar)
                pending, size = [], 0
            pending.append(record)
            size += record.nbytes
        return written + append_records(store, pending, c, dict_size, bar)


def rows_as_bytes(rows: npt.NDArray[Any], n: int) -> npt.NDArray[np.uint8]:
    """Rows as a ``(n, row_bytes)`` byte matrix, one store record per row."""
    n = len(rows) if n < 0 else n
    return np.ascontiguousarray(rows).reshape(n, -1).view(np.uint8).reshape(n, -1)


def checked_records(
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


def within_cap(records: Iterable[npt.NDArray[Any]]) -> Iterator[npt.NDArray[Any]]:
    """The records, checked against the format's record cap by their index in the set."""
    for i, record in enumerate(records):
        check_record_bytes(record.nbytes, i)
        yield record


def append_records(
    store: RecordStore,
    records: list[npt.NDArray[Any]],
    codec: Codec,
    dict_size: int | None,
    bar: Progress,
) -> int:
    """Append one chunk of records (checked by `within_cap`) in small steps, so a bar
    moves; the first chunk of a ``zstd_dict`` store trains its dictionary. Returns how many
    records it appended."""
    if not records:
        return 0
    lengths = np.array([r.nbytes for r in records], np.int64)
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
    return len(records)
