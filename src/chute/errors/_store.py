"""Errors of the record layer: stores, datasets, their files and object storage."""

from __future__ import annotations

from chute.errors._base import ChuteError


class StoreError(ChuteError, RuntimeError):
    """A store cannot be opened or used as asked: not found, locked, closed, changed, damaged,
    full, or of another kind. A RuntimeError, as loaderx's ``ZrecordError`` is for the same
    failures, so code catching that keeps working; the narrower classes add the built-in
    that fits (`StoreNotFoundError` is a FileNotFoundError, `StoreClosedError` a ValueError).

    >>> import chute
    >>> [c.__name__ for c in (chute.StoreLockedError, chute.CorruptStoreError)
    ...  if issubclass(c, chute.StoreError)]
    ['StoreLockedError', 'CorruptStoreError']
    """


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path holds no store (and the mode does not create one).

    >>> import tempfile, chute
    >>> try:
    ...     chute.RecordStore(tempfile.mkdtemp() + "/missing.zr", mode="r")
    ... except FileNotFoundError as e:
    ...     print(type(e).__name__)
    StoreNotFoundError
    """


class StoreLockedError(StoreError):
    """Another writer (handle or process) holds the store.

    >>> import tempfile, chute
    >>> path = tempfile.mkdtemp() + "/s.zr"
    >>> with chute.RecordStore(path, mode="w") as writer:
    ...     try:
    ...         chute.RecordStore(path, mode="a")
    ...     except chute.StoreLockedError:
    ...         print("locked")
    locked
    """


class StoreClosedError(StoreError, ValueError):
    """The store was closed.

    >>> import tempfile, numpy as np, chute
    >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/x.zr", np.arange(3))
    >>> ds.close()
    >>> try:
    ...     ds[0]
    ... except ValueError as e:
    ...     print(type(e).__name__)
    StoreClosedError
    """


class StoreChangedError(StoreError):
    """A delete, compaction or reset changed the store since this reader opened it (or
    while it read): the records it would return may be gone or moved. Reopen the store.

    >>> import tempfile, chute
    >>> path = tempfile.mkdtemp() + "/s.zr"
    >>> with chute.RecordStore(path, mode="w") as writer:
    ...     _ = writer.append([b"a", b"b", b"c"])
    >>> reader = chute.RecordStore(path)
    >>> with chute.RecordStore(path, mode="a") as writer:
    ...     writer.delete([0])  # record 2 moves into slot 0
    >>> try:
    ...     reader.gather_packed([0])
    ... except chute.StoreChangedError:
    ...     reader.close(); reader = chute.RecordStore(path)  # reopen: the new state
    >>> reader.gather_packed([0])[0].tobytes(), len(reader)
    (b'c', 2)
    >>> reader.close()
    """


class CorruptStoreError(StoreError):
    """Bytes on disk contradict the format: a damaged table, chunk, frame or dictionary.

    ``index`` is the record index that exposed the damage, when one did.

    >>> import os, tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/x.zr"
    >>> chute.write_dataset(path, np.arange(100), codec="raw").close()
    >>> os.truncate(path + "/0.zr", 400)  # cut the chunk file: records 50.. are gone
    >>> try:
    ...     chute.Dataset(path)[[10, 90]]
    ... except chute.CorruptStoreError as e:
    ...     print(e.index)
    90
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class ChecksumError(CorruptStoreError):
    """A record decoded cleanly but its bytes differ from the CRC-32C written with it.

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/x.zr"
    >>> chute.write_dataset(path, np.zeros((4, 8), np.uint8), codec="raw").close()
    >>> with open(path + "/0.zr", "r+b") as f:  # flip one bit of record 2
    ...     _ = f.seek(17); _ = f.write(b"\x01")
    >>> chute.Dataset(path)[2].tolist()  # without verify the damage reads as data
    [0, 1, 0, 0, 0, 0, 0, 0]
    >>> try:
    ...     chute.Dataset(path, verify=True)[2]
    ... except chute.ChecksumError as e:
    ...     print("record", e.index)
    record 2
    """


class IncompleteDatasetError(CorruptStoreError):
    """A sharded dataset whose write has not finished: shards on disk but no manifest yet.

    >>> import os, tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/big"
    >>> chute.write_dataset(path, np.arange(10), shard_records=4).close()
    >>> os.remove(path + "/dataset.json")  # as if the writer died before committing
    >>> try:
    ...     chute.Dataset(path)
    ... except chute.IncompleteDatasetError as e:
    ...     print(str(e).split(": ", 1)[1])
    its write did not finish (write it again with overwrite=True)
    """


class StoreKindError(StoreError, ValueError):
    """The store holds the other kind of records: fixed-shape for `RaggedDataset`, or
    variable-length for `Dataset` (a ValueError, as in loaderx).

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/tokens.zr"
    >>> chute.write_ragged(path, [np.arange(3), np.arange(5)]).close()
    >>> try:
    ...     chute.Dataset(path)
    ... except chute.StoreKindError as e:
    ...     print(str(e).split(": ")[-1])
    open it with RaggedDataset
    """


class SchemaMismatchError(StoreError, ValueError):
    """Records to append differ from the store's schema.json in dtype or record shape (a
    ValueError, as in loaderx).

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/x.zr"
    >>> chute.write_dataset(path, np.zeros((4, 3), np.float32)).close()
    >>> try:
    ...     chute.write_dataset(path, np.zeros((2, 5), np.float32), mode="a")
    ... except chute.SchemaMismatchError as e:
    ...     print(str(e).split("; ")[-1])
    cannot append float32 records of shape (5,)
    """


class OutBufferError(ChuteError, ValueError, TypeError):
    """An ``out=`` array a gather cannot write into: read-only, not C-contiguous, of a dtype
    that holds Python objects, or of the wrong dtype, shape or size for the batch; the
    message says which. A ValueError and a TypeError, which is what such an array raised
    before, so code catching either keeps working.

    >>> import tempfile, numpy as np, chute
    >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/x.zr", np.arange(6).reshape(3, 2))
    >>> try:
    ...     ds.gather_into([0, 1], np.empty((2, 2), ds.dtype)[:, ::-1])
    ... except chute.OutBufferError as e:
    ...     print(str(e).split(":")[0], isinstance(e, ValueError))
    out is not C-contiguous (a strided view, a transpose or Fortran order) True
    """


class RecordIndexError(ChuteError, IndexError, RuntimeError):
    """A record index outside the dataset. An IndexError, as in numpy; also a RuntimeError,
    which is what loaderx raises for it, so code catching either keeps working.

    >>> import tempfile, numpy as np, chute
    >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/x.zr", np.arange(4))
    >>> try:
    ...     ds[[0, 4]]
    ... except IndexError as e:
    ...     print(type(e).__name__, e)
    RecordIndexError record index 4 is out of range for a dataset of 4 records
    >>> ds.close()
    """


class RecordDecodeError(ChuteError, ValueError):
    """A record read intact whose content cannot be decoded as asked (an `ImageDataset`
    record that is no image Pillow can read, or a truncated one): the store is fine, the
    record's bytes are not what the reader expects. A ValueError; ``index`` is the record's
    index in the dataset.

    >>> import tempfile, chute
    >>> path = tempfile.mkdtemp() + "/images"
    >>> chute.write_ragged(path, [b"not an image"]).close()
    >>> try:
    ...     chute.ImageDataset(path)[0]
    ... except chute.errors.RecordDecodeError as e:
    ...     print(e.index, isinstance(e, ValueError))
    0 True
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class UnsafeFileError(ChuteError, OSError):
    """A file chute was pointed at is not one it will read: its path resolves outside the
    folder it was given (a symlink out), it is not a regular file (a FIFO, a device, a
    folder), or it is larger than its format allows. Nothing of it was read as data.

    >>> import os, tempfile
    >>> import chute
    >>> from chute._util.safe_open import read_regular
    >>> root = tempfile.mkdtemp()
    >>> os.mkfifo(root + "/config.json")
    >>> try:
    ...     read_regular(root + "/config.json", root, limit=1 << 20)
    ... except chute.ChuteError as e:
    ...     print(type(e).__name__, isinstance(e, OSError))
    UnsafeFileError True
    """


class ColumnTypeError(ChuteError, TypeError):
    """A column of a dataset being converted holds rows of different types in different
    blocks (another dtype, another row shape, or fixed rows beside variable-length ones):
    joining them would change values (int64 beside float64 rounds above 2**53), so the
    conversion stops and names the column and both types. A TypeError, as before.

    >>> import numpy as np
    >>> from chute.errors import ColumnTypeError
    >>> from chute.ray._layout import check_column_types
    >>> try:
    ...     check_column_types("ids", [np.array([2**53 + 1]), np.array([0.5])])
    ... except ColumnTypeError as e:
    ...     print(e)
    column 'ids' changes type across blocks: int64 then float64
    """


class RemoteError(ChuteError, OSError):
    """A request to object storage (or a web server) failed for good: denied, throttled or
    dropped after the bounded retries, or answered with something other than what was asked.
    The message names the URL (and the record, for a read); nothing wrong was returned.

    >>> from chute.errors import RemoteError
    >>> err = RemoteError("s3://bucket/d/chunk-00000.zr: 403 Forbidden (record 7)")
    >>> isinstance(err, OSError), "record 7" in str(err)
    (True, True)
    """


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """An object a dataset needs is not at its URL (a dataset not there, or a file of it
    missing).

    >>> from chute.errors import RemoteNotFoundError
    >>> isinstance(RemoteNotFoundError("s3://bucket/d/meta.zr"), FileNotFoundError)
    True
    """


class RemoteChangedError(RemoteError, StoreChangedError):
    """An object changed since the dataset was opened (its ETag or size differs from the one
    read at open): its bytes now may not match the table read then, so they are not used.
    Reopen the dataset to read the new version.

    >>> from chute.errors import RemoteChangedError, StoreChangedError
    >>> isinstance(RemoteChangedError("s3://b/d/chunk-00000.zr changed"), StoreChangedError)
    True
    """


class CacheTooSmallError(ChuteError, ValueError):
    """A local cache whose ``cache_bytes`` cannot hold what one batch needs at once: it would
    evict blocks the batch still needs (or wait for ever). Raised at open, naming both sizes.

    >>> from chute.errors import CacheTooSmallError
    >>> isinstance(CacheTooSmallError("cache_bytes=1024 ..."), ValueError)
    True
    """
