"""What `Dataset` and `RaggedDataset` share: a read-only `RecordSource` (one store, or a
sharded dataset) with a `RecordSchema`, and their indices checked by the one normaliser."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from chute._util.checks import check_optional_int
from chute._util.closing import Closing
from chute._util.renamed import legacy_arguments
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import is_sharded
from chute.datasets._sharded_store import ShardedStore
from chute.datasets._source import RecordSource
from chute.errors import StoreKindError
from chute.store import RecordStore
from chute.store._internal import as_indices, check_indices, index_bounds


def _reopen(cls: type[StoreView], path: str, verify: bool, threads: int | None) -> StoreView:
    return cls(path, verify=verify, num_threads=threads)


class StoreView(Closing):
    """Opens a store read-only after checking that its schema.json is of this view's kind."""

    _ragged: ClassVar[bool]

    @legacy_arguments(renamed={"threads": "num_threads"})
    def __init__(
        self, path: str | os.PathLike[str], *, verify: bool = False, num_threads: int | None = None
    ) -> None:
        threads = check_optional_int("num_threads", num_threads, minimum=1)
        path = Path(path)
        sharded = (
            ShardedStore(path, verify=verify, num_threads=threads) if is_sharded(path) else None
        )
        schema = sharded.schema if sharded is not None else RecordSchema.read(path)
        if schema.ragged != self._ragged:
            kind, opener = (
                ("variable-length", "RaggedDataset")
                if schema.ragged
                else ("fixed-shape", "Dataset")
            )
            if sharded is not None:
                sharded.close()
            raise StoreKindError(f"{path} holds {kind} records: open it with {opener}")
        self._path = path
        self._seen = 0  # a length this view has seen: indices below it need no refresh
        self._opened_at = path.absolute()  # what a pickled copy reopens, whatever its cwd
        self._verify = verify
        self._threads = threads
        self._schema = schema
        self._dtype: np.dtype[Any] = schema.dtype
        self._item_shape: tuple[int, ...] = schema.item_shape
        self._store: RecordSource = (
            sharded
            if sharded is not None
            else RecordStore(path, mode="r", verify=verify, num_threads=threads)
        )

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

    @property
    def path(self) -> Path:
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
        """Pickles as its path and options: the copy (in a worker process, say) reopens the
        store by path, so the store must be reachable there."""
        return (_reopen, (type(self), str(self._opened_at), self._verify, self._threads))

    def close(self) -> None:
        self._store.close()
