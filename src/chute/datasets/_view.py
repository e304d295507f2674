"""What `Dataset` and `RaggedDataset` share: a read-only store (or sharded dataset) with a
dtype and a row shape."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from chute._util.checks import check_optional_int
from chute._util.closing import Closing
from chute._util.renamed import legacy_arguments
from chute.datasets._schema import read_schema
from chute.datasets._sharded_manifest import is_sharded
from chute.datasets._sharded_store import ShardedStore
from chute.errors import StoreKindError
from chute.store import RecordStore


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
        schema = sharded.schema if sharded is not None else read_schema(path)
        if bool(schema.get("ragged")) != self._ragged:
            kind, opener = (
                ("variable-length", "RaggedDataset")
                if schema.get("ragged")
                else ("fixed-shape", "Dataset")
            )
            raise StoreKindError(f"{path} holds {kind} records: open it with {opener}")
        self._path = path
        self._seen = 0  # a length this view has seen: indices below it need no refresh
        self._opened_at = path.absolute()  # what a pickled copy reopens, whatever its cwd
        self._verify = verify
        self._threads = threads
        self._schema = schema
        self._dtype: np.dtype[Any] = schema["dtype"]
        self._item_shape: tuple[int, ...] = schema.get(
            "item_shape" if self._ragged else "shape", ()
        )
        self._store: RecordStore | ShardedStore = (
            sharded
            if sharded is not None
            else RecordStore(path, mode="r", verify=verify, num_threads=threads)
        )

    @property
    def path(self) -> Path:
        return self._path

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._dtype

    @property
    def codec(self) -> str:
        """The codec named in schema.json (what the records were written with)."""
        return str(self._schema.get("codec", "zstd"))

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one record (of one row, for variable-length records)."""
        return self._item_shape

    @property
    def store(self) -> RecordStore | ShardedStore:
        """The underlying record store, or the shards of a sharded dataset (read-only)."""
        return self._store

    def __len__(self) -> int:
        return len(self._store)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as its path and options: the copy (in a worker process, say) reopens the
        store by path, so the store must be reachable there."""
        return (_reopen, (type(self), str(self._opened_at), self._verify, self._threads))

    def close(self) -> None:
        self._store.close()
