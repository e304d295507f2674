"""What `Dataset` and `RaggedDataset` share: a read-only `RecordSource` (one store, or a
sharded dataset) with a `RecordSchema`, and their indices checked by the one normaliser."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from chute._objects import check_options, local_path, reads_remotely
from chute._util.checks import check_optional_int
from chute._util.closing import Closing
from chute._util.renamed import legacy_arguments
from chute.datasets._folders import KEYWORDS, RemoteFolder
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import is_sharded
from chute.datasets._sharded_store import ShardedStore
from chute.datasets._source import RecordSource
from chute.errors import RemoteNotFoundError, StoreKindError
from chute.store import RecordStore
from chute.store._internal import SCHEMA_FILE, as_indices, check_indices, index_bounds


def _reopen(
    cls: type[StoreView],
    path: Any,
    verify: bool,
    threads: int | None,
    options: dict[str, Any] | None = None,
) -> StoreView:
    return cls(path, verify=verify, num_threads=threads, **(options or {}))


class StoreView(Closing):
    """Opens a store read-only after checking that its schema.json is of this view's kind:
    a folder, or a URL of object storage (``s3://``, ``gs://``, ``az://``, ``http(s)://``,
    or an obstore store), whose store options (``region=``, ``endpoint=`` ...) come as
    keywords."""

    _ragged: ClassVar[bool]
    _bare: ClassVar[RecordSchema | None] = None
    """What the records of a bare store (no schema.json) are taken to be; None: refused."""

    @legacy_arguments(renamed={"threads": "num_threads"})
    def __init__(
        self,
        path: Any,
        *,
        verify: bool = False,
        num_threads: int | None = None,
        **store_options: Any,
    ) -> None:
        threads = check_optional_int("num_threads", num_threads, minimum=1)
        source, schema = _open(
            path, type(self).__name__, verify, threads, store_options, self._bare
        )
        if schema.ragged != self._ragged:
            kind, opener = (
                ("variable-length", "RaggedDataset")
                if schema.ragged
                else ("fixed-shape", "Dataset")
            )
            source.close()
            raise StoreKindError(f"{source.path} holds {kind} records: open it with {opener}")
        self._path: Path | str = source.path
        self._seen = 0  # a length this view has seen: indices below it need no refresh
        # what a pickled copy reopens, whatever its cwd
        self._opened_at = source.path.absolute() if isinstance(source.path, Path) else path
        self._options = store_options
        self._verify = verify
        self._threads = threads
        self._schema = schema
        self._dtype: np.dtype[Any] = schema.dtype
        self._item_shape: tuple[int, ...] = schema.item_shape
        self._store: RecordSource = source
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        """Refuse records this view cannot read (a subclass's own checks, run at open)."""

    def _flat(self, indices: Any) -> npt.NDArray[np.int64]:
        """Record indices (any shape, negatives from the end) as flat int64, through the one
        normaliser; the length is asked of the source (which re-reads the header) only when
        an index is not below one already seen, so the batch path skips it."""
        flat = as_indices(indices).reshape(-1)
        bounds = index_bounds(flat) if flat.size else None
        n = self._seen
        if bounds is None or bounds[0] < 0 or bounds[1] >= n:
            self._seen = n = len(self)
        return check_indices(flat, n, bounds)

    def _indices(self, key: Any) -> npt.NDArray[np.int64]:
        """``_flat`` of ``key``, or the records a slice names."""
        if isinstance(key, slice):
            return np.arange(len(self), dtype=np.int64)[key]
        return self._flat(key)

    def readahead(self, indices: Any) -> bool:
        """Start fetching, in the background, what a later read of ``indices`` would wait
        for (the shards of a dataset in object storage, opened ahead), and return at once;
        whether that does anything for this dataset (not on local disk). The loader calls it
        for the steps it queues."""
        ahead = getattr(self._store, "readahead", None)
        return bool(ahead(indices)) if ahead is not None else False

    @property
    def path(self) -> Path | str:
        """The dataset's folder, or its URL."""
        return self._path

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def codec(self) -> str:
        """The codec named in schema.json (what the records were written with)."""
        return self._schema.codec

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one record (of one row, for variable-length records)."""
        return self._item_shape

    @property
    def schema(self) -> RecordSchema:
        """What the records are: dtype, record shape, kind and codec (from schema.json)."""
        return self._schema

    @property
    def store(self) -> RecordSource:
        """The `RecordSource` the records come from: a `chute.RecordStore`, or the shards of a
        sharded dataset (read-only)."""
        return self._store

    @property
    def shard_lengths(self) -> npt.NDArray[np.int64] | None:
        """Records per shard, in index order, for a sharded dataset (None for one store): the
        groups `chute.ShardWindowSampler` (``DataLoader(sampler="window")``) shuffles by."""
        lengths: npt.NDArray[np.int64] | None = getattr(self._store, "shard_lengths", None)
        return lengths

    def __len__(self) -> int:
        return len(self._store)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as its path (or URL) and options: the copy (in a worker process, say)
        reopens the store by path, so the store must be reachable there."""
        where = str(self._opened_at) if isinstance(self._opened_at, Path) else self._opened_at
        args = (type(self), where, self._verify, self._threads)
        return (_reopen, (*args, self._options) if self._options else args)

    def close(self) -> None:
        self._store.close()


def _open(
    path: Any,
    owner: str,
    verify: bool,
    threads: int | None,
    options: dict[str, Any],
    bare: RecordSchema | None = None,
) -> tuple[RecordSource, RecordSchema]:
    """The records at ``path`` and their schema: a sharded dataset's shards or one store, in
    a folder or at a URL (whose dataset.json and schema.json are read in one round trip).
    A store without schema.json is refused, or read as ``bare`` records where given."""
    if not reads_remotely(path):
        check_options(path, options, owner, KEYWORDS)
        local = Path(local_path(path))
        if is_sharded(local):
            sharded = ShardedStore(local, verify=verify, num_threads=threads)
            return sharded, sharded.schema
        if bare is not None and not (local / SCHEMA_FILE).exists():
            schema = bare  # a bare store: RecordStore refuses a folder that is not one
        else:
            schema = RecordSchema.read(local)
        return RecordStore(local, mode="r", verify=verify, num_threads=threads), schema
    folder = RemoteFolder.open(path, options, owner)
    if folder.sharded:
        sharded = ShardedStore.over(folder, verify=verify, num_threads=threads)
        return sharded, sharded.schema
    try:
        schema = folder.schema()
    except RemoteNotFoundError:
        if bare is None:
            folder.close()
            raise
        schema = bare  # a bare store: opening it fails if there is none
    except BaseException:
        folder.close()
        raise
    return folder.store(verify=verify, num_threads=threads), schema
