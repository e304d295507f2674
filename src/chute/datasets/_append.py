"""Appending to a sharded dataset: `append_dataset` (fixed-shape rows), `append_ragged`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chute.datasets._write import (
    Rows,
    append_shards,
    check_appendable,
    fixed_payloads,
    ragged_payloads,
)
from chute.store import Codec, RecordStore
from chute.store._format import parse_codec

if TYPE_CHECKING:
    from chute.dataset import Dataset
    from chute.ragged import RaggedDataset

__all__ = ["append_dataset", "append_ragged"]

#: Rows are read and appended to the last shard this many bytes at a time.
_STEP_BYTES = 64 << 20


def append_dataset(
    path: str | os.PathLike[str], array: Any, *, workers: int | None = None
) -> Dataset:
    """Append rows to a sharded dataset and return it opened.

    Rows fill the last shard up to the dataset's ``shard_records``, then go to new shards
    (``workers`` processes at once); the manifest is rewritten last, so a crash at any point
    leaves the dataset as it was before the call, and the next append cleans up after it.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/d"
    >>> _ = chute.write_dataset(path, np.zeros((3, 2), np.int8), shard_records=4)
    >>> ds = chute.append_dataset(path, np.ones((3, 2), np.int8))
    >>> len(ds), ds.store.manifest.shards
    (6, (('part-00000.zr', 4), ('part-00001.zr', 2)))
    """
    # Imported here: chute.dataset imports this package for its sharded paths.
    from chute.dataset import Dataset, _rows_as_bytes

    path = Path(path)
    manifest = check_appendable(path, ragged=False)
    schema = manifest.schema
    dtype, item_shape = schema["dtype"], tuple(schema.get("shape", ()))
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        array = np.asarray(array)
    if len(array.shape) == 0 or tuple(array.shape[1:]) != item_shape:
        raise ValueError(
            f"rows of shape {tuple(array.shape[1:])} do not match the dataset's {item_shape}"
        )
    if not np.can_cast(array.dtype, dtype, "same_kind"):
        raise TypeError(f"rows of dtype {array.dtype} cannot join a dataset of {dtype}")
    rows = Rows(array, 0, int(array.shape[0]), dtype)

    def fill(store: RecordStore, room: int) -> int:
        take = min(room, len(rows))
        step = max(1, _STEP_BYTES // max(1, dtype.itemsize * int(np.prod(item_shape))))
        for start in range(0, take, step):
            part = rows[start : min(start + step, take)]
            if _codec(schema) is Codec.ZSTD_DICT and not store.has_dict:
                store.train_dict(_rows_as_bytes(part, len(part)))
            store.append(_rows_as_bytes(part, len(part)))
        return int(take)

    def rest(added: int) -> Iterable[Any]:
        return fixed_payloads(array, manifest.shard_records, start=added, dtype=dtype)

    append_shards(path, "fixed", fill, rest, workers=workers)
    return Dataset(path)


def append_ragged(
    path: str | os.PathLike[str], arrays: Iterable[Any], *, workers: int | None = None
) -> RaggedDataset:
    """Append variable-length records to a sharded ragged dataset, in `append_dataset`'s order.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/r"
    >>> _ = chute.write_ragged(path, [np.arange(2)], shard_records=2)
    >>> ds = chute.append_ragged(path, [np.arange(3), np.arange(1)])
    >>> len(ds), ds[2].tolist()
    (3, [0])
    """
    from chute.ragged import RaggedDataset, _flush, _records

    path = Path(path)
    manifest = check_appendable(path, ragged=True)
    schema = manifest.schema
    checked = _records(arrays, schema["dtype"], tuple(schema["item_shape"]))
    records = (record for record, _, _ in checked)

    def fill(store: RecordStore, room: int) -> int:
        return _flush(store, list(islice(records, room)), 0, _codec(schema), None)

    def rest(added: int) -> Iterable[Any]:
        return ragged_payloads(records, manifest.shard_records, lazy=workers in (None, 1))

    append_shards(path, "ragged", fill, rest, workers=workers)
    return RaggedDataset(path)


def _codec(schema: dict[str, Any]) -> Codec:
    return parse_codec(str(schema.get("codec", "zstd")))
