"""Writing to a sharded dataset: `append_dataset` (fixed-shape rows), `append_ragged`, and
the sharded path of `write_dataset` / `write_ragged` (`write_sharded`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from chute.datasets._manifest import is_sharded, read_manifest
from chute.datasets._write import (
    Rows,
    append_shards,
    check_appendable,
    clear,
    fixed_payloads,
    occupied,
    ragged_payloads,
    write_shards,
    writer_lock,
)
from chute.errors import StoreError
from chute.store import Codec, RecordStore
from chute.store._format import codec_name, parse_codec

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
    from chute._util.progress import Progress
    from chute.ragged import RaggedDataset, _flush, _records

    path = Path(path)
    manifest = check_appendable(path, ragged=True)
    schema = manifest.schema
    checked = _records(arrays, schema["dtype"], tuple(schema["item_shape"]))
    records = (record for record, _, _ in checked)

    def fill(store: RecordStore, room: int) -> int:
        with Progress(None, f"append {path.name}", show=False) as bar:
            return _flush(store, list(islice(records, room)), 0, _codec(schema), None, bar)

    def rest(added: int) -> Iterable[Any]:
        return ragged_payloads(records, manifest.shard_records, lazy=workers in (None, 1))

    append_shards(path, "ragged", fill, rest, workers=workers)
    return RaggedDataset(path)


def _codec(schema: dict[str, Any]) -> Codec:
    return parse_codec(str(schema.get("codec", "zstd")))


def write_sharded(
    path: Path,
    kind: str,
    source: Any,
    *,
    mode: str,
    overwrite: bool,
    shard_records: int | None,
    workers: int | None,
    options: dict[str, Any],
) -> bool:
    """The sharded path of `write_dataset` / `write_ragged`; False where the write is of a
    single store, which the caller then makes (inside `replacing_shards`, which removes a
    sharded dataset that ``overwrite=True`` replaces). ``mode="a"`` on a sharded dataset appends
    (`append_dataset` / `append_ragged`); with ``shard_records``, shards of that many
    records are written anew (``source`` is the array, or the checked records)."""
    if mode not in ("w", "a"):
        raise ValueError(f"mode must be 'w' (write a new store) or 'a' (append), got {mode!r}")
    if mode == "a" and overwrite:
        raise ValueError("overwrite=True replaces the dataset and mode='a' appends to it: pick one")
    sharded = is_sharded(path)
    if mode == "a" and sharded:
        manifest = read_manifest(path)
        if shard_records is not None and shard_records != manifest.shard_records:
            raise ValueError(
                f"{path} has shard_records={manifest.shard_records}; appending keeps it"
            )
        stored, codec = str(manifest.schema.get("codec", "zstd")), options.get("codec")
        if codec is not None and codec_name(parse_codec(codec)) != stored:
            raise ValueError(
                f"{path} is written with codec {stored!r}; appending keeps it (leave codec= out)"
            )
        append = append_dataset if kind == "fixed" else append_ragged
        append(path, source, workers=workers).close()
        return True
    if shard_records is None:
        return False
    _refuse_occupied(path, mode, overwrite)
    options = {**options, "codec": options.get("codec") or "zstd"}
    if kind == "fixed":
        payloads: Iterable[Any] = fixed_payloads(source, shard_records)
        empty: Any = np.asarray(source[:0])
    else:
        payloads = ragged_payloads(source, shard_records, lazy=workers in (None, 1))
        empty = []
    path.mkdir(parents=True, exist_ok=True)
    with writer_lock(path):  # taken before anything is removed
        _refuse_occupied(path, mode, overwrite)  # again: another writer may have finished
        clear(path)
        write_shards(
            path, kind, payloads, empty,
            shard_records=shard_records, workers=workers, options=options,
        )  # fmt: skip
    return True


def _refuse_occupied(path: Path, mode: str, overwrite: bool) -> None:
    if not occupied(path):
        return
    if mode == "a":
        raise StoreError(f"{path} holds a single store, not shards: append without shards")
    if not overwrite:
        raise FileExistsError(
            f"{path} exists and is not empty; pass mode='a' to append to it or "
            "overwrite=True to replace it"
        )
