"""The public writers of the typed layer: `write_dataset`, `write_ragged` (one store, or a
sharded dataset with ``shard_records``) and `append_dataset`, `append_ragged` (to a sharded
dataset). They check their arguments, pick the path (`write_sharded` or one store through
`chute.datasets._one_store`) and return the dataset opened; nothing below them calls back up.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from chute._objects import Location, check_options, is_remote_url, open_location
from chute._util.progress import Progress
from chute._util.renamed import legacy_arguments
from chute.datasets._fixed import Dataset
from chute.datasets._one_store import (
    BYTES,
    WriteMode,
    append_records,
    check_kept_codec,
    check_write_mode,
    checked_records,
    describe_rows,
    occupied_error,
    rows_as_bytes,
    within_cap,
    write_records,
    write_rows,
)
from chute.datasets._ragged import RaggedDataset
from chute.datasets._remote_write import append_url, check_writable, survey, write_url
from chute.datasets._schema import RecordSchema, check_plain_dtype
from chute.datasets._sharded_manifest import Manifest, is_sharded
from chute.datasets._sharded_write import (
    Rows,
    append_shards,
    check_appendable,
    check_sharding,
    clear,
    fixed_payloads,
    occupied,
    ragged_payloads,
    replacing_shards,
    undone_on_failure,
    write_shards,
    writer_lock,
)
from chute.errors import StoreError
from chute.store import Codec, RecordStore
from chute.store._internal import MAX_RECORDS, parse_codec

__all__ = ["append_dataset", "append_ragged", "write_dataset", "write_ragged"]

#: Rows are read and appended to the last shard this many bytes at a time.
_STEP_BYTES = 64 << 20


BytesRecords = Sequence[bytes | bytearray | memoryview]
"""A list (or tuple) of byte strings: `write_dataset` stores them as variable-length records."""


@overload
def write_dataset(
    path: str | os.PathLike[str],
    array: BytesRecords,
    *,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    shard_records: int | None = None,
    workers: int | None = None,
    break_lock: bool = False,
    **store_options: Any,
) -> RaggedDataset: ...
@overload
def write_dataset(
    path: str | os.PathLike[str],
    array: Any,
    *,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    shard_records: int | None = None,
    workers: int | None = None,
    break_lock: bool = False,
    **store_options: Any,
) -> Dataset: ...
@legacy_arguments(positional=("codec", "chunk_bytes", "dict_size"))
def write_dataset(
    path: str | os.PathLike[str],
    array: Any,
    *,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    shard_records: int | None = None,
    workers: int | None = None,
    break_lock: bool = False,
    **store_options: Any,
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

    ``path`` may be a URL, ``s3://bucket/prefix``, ``gs://``, ``az://`` (or an obstore
    store): the dataset is written there in the sharded layout (``shard_records`` records
    per shard, by default up to 2**24 in one), staged locally a few shards at a time and
    uploaded, the manifest last (see docs/scale.md). ``store_options`` (``region=``,
    ``endpoint=``, credentials ...) go to the store, as `chute.Dataset` takes them; a
    misspelt one is a ``TypeError`` naming the nearest. One writer at a time: a second is
    refused (`StoreLockedError`) where the store has conditional writes; ``break_lock=True``
    takes over the lock of a writer you know is dead. A write to a URL returns the dataset
    opened by that URL with the same ``store_options`` (it pickles as them, as a
    `chute.Dataset` of a URL does).

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
            path, array, dtype=np.uint8, item_shape=(), codec=codec, chunk_bytes=chunk_bytes,
            dict_size=dict_size, mode=mode, level=level, overwrite=overwrite,
            shard_records=shard_records, workers=workers, progress=progress,
            break_lock=break_lock, **store_options,
        )  # fmt: skip
    target = _target(path, store_options, write_dataset, break_lock)
    array, _, _, _ = describe_rows(array)
    options: dict[str, Any] = {
        "codec": codec, "chunk_bytes": chunk_bytes, "dict_size": dict_size, "level": level
    }  # fmt: skip
    if isinstance(target, Location):
        _write_url(
            target, "fixed", array, mode=mode, overwrite=overwrite,
            shard_records=shard_records, workers=workers, options=options, break_lock=break_lock,
        )  # fmt: skip
        return _opened_url(Dataset, target, store_options)
    path = target
    shard_records, workers = check_sharding(shard_records, workers)
    with undone_on_failure(path, mode):
        if not write_sharded(
            path, "fixed", array, mode=mode, overwrite=overwrite,
            shard_records=shard_records, workers=workers, options=options,
        ):  # fmt: skip
            write_rows(
                path, array, mode=mode, overwrite=overwrite, progress=progress,
                guard=replacing_shards(path, overwrite=overwrite), **options,
            )  # fmt: skip
    return Dataset(path)


def _is_bytes_records(array: Any) -> bool:
    """A list or tuple of byte strings (which numpy would make a NUL-padded ``S`` array)."""
    return (
        isinstance(array, (list, tuple))
        and len(array) > 0
        and all(isinstance(item, BYTES) for item in array)
    )


@legacy_arguments(positional=("dtype", "item_shape", "codec", "chunk_bytes", "dict_size"))
def write_ragged(
    path: str | os.PathLike[str],
    arrays: Iterable[Any],
    *,
    dtype: npt.DTypeLike | None = None,
    item_shape: tuple[int, ...] | None = None,
    codec: str | None = None,
    chunk_bytes: int = 64 << 20,
    dict_size: int | None = None,
    mode: WriteMode = "w",
    level: int | None = None,
    overwrite: bool = False,
    shard_records: int | None = None,
    workers: int | None = None,
    progress: bool | None = None,
    break_lock: bool = False,
    **store_options: Any,
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
    ``path`` may be a URL (``s3://`` ...), with ``store_options`` and ``break_lock`` as in
    `write_dataset`.

    >>> import tempfile, numpy as np
    >>> tokens = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])]
    >>> ds = write_ragged(tempfile.mkdtemp() + "/tokens.zr", tokens, dtype=np.int32)
    >>> len(ds), ds[0].tolist(), ds.dtype
    (3, [5, 6, 7], dtype('int32'))
    >>> ds.close()
    """
    target = _target(path, store_options, write_ragged, break_lock)
    want_dtype = None if dtype is None else np.dtype(dtype)
    want_shape = None if item_shape is None else tuple(int(d) for d in item_shape)
    if not isinstance(target, Location):
        shard_records, workers = check_sharding(shard_records, workers)
    records = checked_records(_arrays_only(arrays), want_dtype, want_shape)
    first = next(records, None)
    if first is None and (want_dtype is None or want_shape is None):
        raise ValueError("no records to write, and no dtype and item_shape to describe them")
    set_dtype = first[1] if first else want_dtype
    set_shape = first[2] if first else want_shape
    assert set_dtype is not None and set_shape is not None
    check_plain_dtype(set_dtype)
    options: dict[str, Any] = {
        "codec": codec, "chunk_bytes": chunk_bytes, "dict_size": dict_size, "level": level
    }  # fmt: skip
    rest = within_cap(chain([first[0]] if first else [], (r for r, _, _ in records)))
    if isinstance(target, Location):
        _write_url(
            target, "ragged", rest, mode=mode, overwrite=overwrite, shard_records=shard_records,
            workers=workers, options={**options, "dtype": set_dtype, "item_shape": set_shape},
            break_lock=break_lock,
        )  # fmt: skip
        return _opened_url(RaggedDataset, target, store_options)
    path = target
    with undone_on_failure(path, mode):
        if not write_sharded(
            path, "ragged", rest, mode=mode, overwrite=overwrite, shard_records=shard_records,
            workers=workers, options={**options, "dtype": set_dtype, "item_shape": set_shape},
        ):  # fmt: skip
            write_records(
                path, rest, set_dtype, set_shape, mode=mode, overwrite=overwrite,
                progress=progress, guard=replacing_shards(path, overwrite=overwrite), **options,
            )  # fmt: skip
    return RaggedDataset(path)


def append_dataset(
    path: str | os.PathLike[str],
    array: Any,
    *,
    workers: int | None = None,
    break_lock: bool = False,
    **store_options: Any,
) -> Dataset:
    """Append rows to a sharded dataset and return it opened.

    Rows fill the last shard up to the dataset's ``shard_records``, then go to new shards
    (``workers`` processes at once); the manifest is rewritten last, so a crash at any point
    leaves the dataset as it was before the call, and the next append cleans up after it.
    To a dataset at a URL (``store_options`` and ``break_lock`` as in `write_dataset`), rows
    go to new shards only: an existing shard is never rewritten.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/d"
    >>> _ = chute.write_dataset(path, np.zeros((3, 2), np.int8), shard_records=4)
    >>> ds = chute.append_dataset(path, np.ones((3, 2), np.int8))
    >>> len(ds), ds.store.manifest.shards
    (6, (('part-00000.zr', 4), ('part-00001.zr', 2)))
    """
    target = _target(path, store_options, append_dataset, break_lock)
    if isinstance(target, Location):
        _append_url(target, "fixed", array, workers=workers, break_lock=break_lock)
        return _opened_url(Dataset, target, store_options)
    path = target
    _append_rows(path, array, workers, check_appendable(path, ragged=False))
    return Dataset(path)


def append_ragged(
    path: str | os.PathLike[str],
    arrays: Iterable[Any],
    *,
    workers: int | None = None,
    break_lock: bool = False,
    **store_options: Any,
) -> RaggedDataset:
    """Append variable-length records to a sharded ragged dataset, in `append_dataset`'s order
    (at a URL too, as `append_dataset`).

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/r"
    >>> _ = chute.write_ragged(path, [np.arange(2)], shard_records=2)
    >>> ds = chute.append_ragged(path, [np.arange(3), np.arange(1)])
    >>> len(ds), ds[2].tolist()
    (3, [0])
    """
    target = _target(path, store_options, append_ragged, break_lock)
    if isinstance(target, Location):
        _append_url(target, "ragged", arrays, workers=workers, break_lock=break_lock)
        return _opened_url(RaggedDataset, target, store_options)
    path = target
    _append_records(path, arrays, workers, check_appendable(path, ragged=True))
    return RaggedDataset(path)


def _append_rows(path: Path, array: Any, workers: int | None, manifest: Manifest) -> None:
    """`append_dataset` to a local sharded dataset, the rows cast to ``manifest``'s schema
    (`append_shards` refuses the append if the manifest under the lock says otherwise)."""
    schema = manifest.schema
    dtype, codec = schema.dtype, parse_codec(schema.codec)
    array = _joining_rows(array, schema)
    rows = Rows(array, 0, int(array.shape[0]), dtype)

    def fill(store: RecordStore, room: int) -> int:
        take = min(room, len(rows))
        step = max(1, _STEP_BYTES // max(1, schema.item_bytes))
        for start in range(0, take, step):
            part = rows[start : min(start + step, take)]
            if codec is Codec.ZSTD_DICT and not store.has_dict:
                store.train_dict(rows_as_bytes(part, len(part)))
            store.append(rows_as_bytes(part, len(part)))
        return int(take)

    def rest(added: int) -> Iterable[Any]:
        return fixed_payloads(array, manifest.shard_records, start=added, dtype=dtype)

    append_shards(path, "fixed", manifest, fill, rest, workers=workers)


def _append_records(
    path: Path, arrays: Iterable[Any], workers: int | None, manifest: Manifest
) -> None:
    """`append_ragged` to a local sharded dataset, as `_append_rows`."""
    schema = manifest.schema
    records = _joining_records(arrays, schema)

    def fill(store: RecordStore, room: int) -> int:
        with Progress(None, f"append {path.name}", show=False) as bar:
            codec = parse_codec(schema.codec)
            return append_records(store, list(islice(records, room)), codec, None, bar)

    def rest(added: int) -> Iterable[Any]:
        return ragged_payloads(records, manifest.shard_records, lazy=workers in (None, 1))

    append_shards(path, "ragged", manifest, fill, rest, workers=workers)


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
    check_write_mode(mode, overwrite)
    sharded = is_sharded(path)
    if mode == "a" and sharded:
        manifest = check_appendable(path, ragged=kind == "ragged")
        if shard_records is not None and shard_records != manifest.shard_records:
            raise ValueError(
                f"{path} has shard_records={manifest.shard_records}; appending keeps it"
            )
        check_kept_codec(path, manifest.schema.codec, options.get("codec"))
        append = _append_rows if kind == "fixed" else _append_records
        append(path, source, workers, manifest)
        return True
    if shard_records is None:
        return False
    _refuse_occupied(path, mode, overwrite)
    options = {**options, "codec": options.get("codec") or "zstd"}
    payloads, empty = _new_payloads(kind, source, shard_records, workers)
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
        raise occupied_error(path)


def _new_payloads(
    kind: str, source: Any, shard_records: int, workers: int | None
) -> tuple[Iterable[Any], Any]:
    """A new sharded dataset's payload per shard, and the payload of its one shard where
    ``source`` is empty (which keeps the schema)."""
    if kind == "fixed":
        return fixed_payloads(source, shard_records), np.asarray(source[:0])
    return ragged_payloads(source, shard_records, lazy=workers in (None, 1)), []


def _joining_rows(array: Any, schema: RecordSchema) -> Any:
    """``array`` (as an array) once its rows are checked to fit a dataset of ``schema``."""
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        array = np.asarray(array)
    if len(array.shape) == 0 or tuple(array.shape[1:]) != schema.item_shape:
        raise ValueError(
            f"rows of shape {tuple(array.shape[1:])} do not match the dataset's {schema.item_shape}"
        )
    if not np.can_cast(array.dtype, schema.dtype, "same_kind"):
        raise TypeError(f"rows of dtype {array.dtype} cannot join a dataset of {schema.dtype}")
    return array


def _arrays_only(arrays: Iterable[Any]) -> Iterator[Any]:
    """The records, each refused by its type where it is no array, sequence or bytes (a
    ``str``, ``None``, a Python number): numpy would make it a 0-d array, reported as a
    shape (as a numpy scalar still is)."""
    for i, item in enumerate(arrays):
        if not isinstance(item, (np.ndarray, np.generic, list, tuple, *BYTES)) and (
            np.ndim(item) == 0
        ):
            what = "None" if item is None else f"a {type(item).__name__}"
            hint = ": encode it to bytes first (text.encode())" if isinstance(item, str) else ""
            raise TypeError(
                f"record {i} is {what}, not an array or bytes (each record is an array of "
                f"rows, or bytes){hint}"
            )
        yield item


def _joining_records(arrays: Iterable[Any], schema: RecordSchema) -> Iterator[Any]:
    """The records of ``arrays``, each checked against ``schema`` as it is read."""
    checked = checked_records(_arrays_only(arrays), schema.dtype, schema.item_shape)
    return within_cap(record for record, _, _ in checked)


def _target(
    path: Any, store_options: dict[str, Any], writer: Callable[..., Any], break_lock: bool
) -> Path | Location:
    """Where ``writer`` writes: a local folder (a path or ``file://``), or a `Location` in
    object storage (a URL or an obstore store), its ``store_options`` checked before any
    request."""
    if isinstance(path, (str, os.PathLike)):
        if store_options:
            params = inspect.signature(writer).parameters
            keywords = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
            check_options(os.fspath(path), store_options, writer.__name__, keywords)
        if not is_remote_url(path):
            if break_lock:
                raise ValueError(
                    "break_lock= is for a dataset in object storage: a local writer's lock "
                    "goes with its process"
                )
            if "://" in os.fspath(path):  # file:///...
                return Path(str(open_location(path).local))
            return Path(path)
    location = open_location(path, **store_options)
    check_writable(location)  # before any request
    return location


View = TypeVar("View", Dataset, RaggedDataset)


def _opened_url(view: type[View], location: Location, store_options: dict[str, Any]) -> View:
    """The dataset a writer returns for what it wrote to a URL: opened by URL with the same
    store options (so it pickles and reopens as any remote dataset), or over the store
    instance it was given."""
    if location.scheme == "memory":
        return view(location.store)
    return view(location.url, **store_options)


def _write_url(
    location: Location,
    kind: str,
    source: Any,
    *,
    mode: str,
    overwrite: bool,
    shard_records: int | None,
    workers: int | None,
    options: dict[str, Any],
    break_lock: bool,
) -> None:
    """`write_sharded` for a URL: always shards (one, up to 2**24 records, by default);
    ``mode="a"`` appends to a dataset there, else writes a new one."""
    check_write_mode(mode, overwrite)
    if mode == "a" and survey(location).manifest is not None:
        _append_url(
            location, kind, source, workers=workers, break_lock=break_lock,
            shard_records=shard_records, codec=options.get("codec"),
        )  # fmt: skip
        return
    cap, workers = check_sharding(MAX_RECORDS if shard_records is None else shard_records, workers)
    assert cap is not None
    payloads, empty = _new_payloads(kind, source, cap, workers)
    write_url(
        location, kind, payloads, empty, mode=mode, overwrite=overwrite, shard_records=cap,
        workers=workers, options={**options, "codec": options.get("codec") or "zstd"},
        break_lock=break_lock,
    )  # fmt: skip


def _append_url(
    location: Location,
    kind: str,
    source: Any,
    *,
    workers: int | None,
    break_lock: bool,
    shard_records: int | None = None,
    codec: str | None = None,
) -> None:
    """`append_dataset` / `append_ragged` for a URL: new shards only."""
    workers = check_sharding(1, workers)[1]

    def payloads(manifest: Manifest) -> Iterable[Any]:
        schema, cap = manifest.schema, manifest.shard_records
        if kind == "fixed":
            return fixed_payloads(_joining_rows(source, schema), cap, dtype=schema.dtype)
        records = _joining_records(source, schema)
        return ragged_payloads(records, cap, lazy=workers in (None, 1))

    append_url(
        location, kind, payloads, workers=workers, break_lock=break_lock,
        shard_records=shard_records, codec=codec,
    )  # fmt: skip
