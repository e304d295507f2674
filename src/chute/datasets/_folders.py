"""Where a sharded dataset's files are: a folder on this machine, or a prefix in object
storage. `ShardedStore` reads its manifest, notices an overwrite and opens its shards through
one of these, so the sharded reader is written once for both.

A local folder is checked as it always was: its gen.chute before and after every read, its
identity (a folder renamed over it is another dataset), each shard inside it. In object
storage every read of a shard's chunks is pinned to the version its shard saw first (ETag),
so a per-read check would only cost a request; the dataset's gen.chute is read again each
time a shard opens, so an overwrite is noticed before a shard of the new dataset is mixed
with those of the old.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from chute._objects import (
    ObjectReader,
    check_options,
    local_path,
    open_reader,
    reads_remotely,
)
from chute._util.safe_open import inside
from chute.datasets._schema import MAX_SCHEMA_BYTES, RecordSchema
from chute.datasets._sharded_manifest import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    Manifest,
    parse_manifest,
    read_manifest,
)
from chute.errors import (
    CorruptStoreError,
    RemoteNotFoundError,
    StoreChangedError,
    StoreNotFoundError,
    UnsafeFileError,
)
from chute.store import RecordStore
from chute.store._internal import (
    GEN_FILE,
    META_FILE,
    SCHEMA_FILE,
    Found,
    RemoteStore,
    StoreFiles,
    generation_of,
)

_T = TypeVar("_T")
_R = TypeVar("_R")

#: Keywords a dataset opened by URL takes besides the store's options (for the hint of a
#: misspelt one).
KEYWORDS = ("verify", "num_threads")


class Folder(Protocol):
    """A sharded dataset's files, as `ShardedStore` reads them."""

    @property
    def path(self) -> Path | str:
        """The folder, or the dataset's URL."""
        ...

    @property
    def fanout(self) -> int:
        """How many shards to read (or open) side by side: 1 where reads are bound by the
        cores, more where they wait on the network."""
        ...

    def manifest(self) -> Manifest: ...

    def changed(self) -> bool:
        """Whether the dataset was overwritten since it was opened (cheap: every read)."""
        ...

    def open_shard(
        self, name: str, schema: RecordSchema, *, verify: bool, num_threads: int
    ) -> RecordStore:
        """Shard ``name``, read-only, after checking it belongs to this dataset."""
        ...

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        """``fn`` over ``items``, side by side as far as `fanout` allows."""
        ...

    def close(self) -> None: ...


def open_folder(path: Any, options: Mapping[str, Any], owner: str) -> Folder:
    """The folder ``path`` names: a `RemoteFolder` for a URL of object storage (or an obstore
    store), else a `LocalFolder` (which takes no store options)."""
    if not reads_remotely(path):
        check_options(path, options, owner, KEYWORDS)
        return LocalFolder(Path(local_path(path)))
    return RemoteFolder.open(path, options, owner)


class LocalFolder:
    """A sharded dataset in a folder on this machine."""

    def __init__(self, path: Path) -> None:
        self._path = path
        # gen.chute before the manifest: an overwrite removes the manifest before it raises
        # the generation, so a manifest read after this is of this generation or later
        self._gen = StoreFiles(path, writable=False)  # used for its gen.chute alone
        self._generation = self._gen.generation()
        self._identity = _identity(path)  # a folder renamed over this one is another

    @property
    def path(self) -> Path:
        return self._path

    @property
    def fanout(self) -> int:
        return 1

    def manifest(self) -> Manifest:
        return read_manifest(self._path)

    def changed(self) -> bool:
        return self._gen.generation() != self._generation

    def open_shard(
        self, name: str, schema: RecordSchema, *, verify: bool, num_threads: int
    ) -> RecordStore:
        where = self._path / name
        inside(where, self._path)  # it may have become a link out since the manifest was read
        if _identity(self._path) != self._identity:
            raise StoreChangedError(
                f"{self._path} is another folder than this reader opened (one was renamed over "
                "it): its shards belong to another dataset; reopen the dataset"
            )
        try:
            own = RecordSchema.read(where)
        except StoreNotFoundError:  # the shard gone since the manifest was read, or its schema
            gone = f"shard {name} of the manifest is missing"
            if (where / META_FILE).exists():
                gone = f"{SCHEMA_FILE} of shard {name} is missing: the shard is damaged"
            raise CorruptStoreError(f"{self._path}: {gone}") from None
        if not own.same_records(schema):
            raise CorruptStoreError(f"{where}/schema.json disagrees with the dataset's manifest")
        return RecordStore(where, mode="r", verify=verify, num_threads=num_threads)

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        return [fn(item) for item in items]

    def close(self) -> None:
        self._gen.close()


class RemoteFolder:
    """A dataset (sharded, or one store) at a URL, read through one `ObjectReader`: its
    dataset.json, schema.json and gen.chute, read together at open."""

    def __init__(self, reader: ObjectReader) -> None:
        self._reader = reader
        self._url = reader.location.url
        found = reader.read_starts(
            [(MANIFEST_FILE, MAX_MANIFEST_BYTES + 1), (SCHEMA_FILE, MAX_SCHEMA_BYTES + 1),
             (GEN_FILE, 16)],
            missing_ok=True,
        )  # fmt: skip
        manifest, schema, gen = (None if f is None else f[1] for f in found)
        for item, limit in ((found[0], MAX_MANIFEST_BYTES), (found[1], MAX_SCHEMA_BYTES)):
            if item is not None and item[0].size > limit:
                path = reader.url(item[0].path)
                raise UnsafeFileError(f"{path} holds more than the {limit} bytes its format allows")
        self._manifest, self._schema = manifest, schema
        self._generation = generation_of(gen)
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def open(cls, url: Any, options: Mapping[str, Any], owner: str) -> RemoteFolder:
        """The dataset at ``url``; ``options`` are the store's (``max_in_flight=`` aside),
        a misspelt one a ``TypeError`` before any request."""
        reader = open_reader(url, options, owner, KEYWORDS)
        try:
            return cls(reader)
        except BaseException:
            reader.close()
            raise

    @property
    def path(self) -> str:
        return self._url

    @property
    def fanout(self) -> int:
        return self._reader.max_in_flight

    @property
    def reader(self) -> ObjectReader:
        return self._reader

    @property
    def sharded(self) -> bool:
        """Whether a dataset.json is there (else one store is, or nothing)."""
        return self._manifest is not None

    def manifest(self) -> Manifest:
        if self._manifest is None:
            raise StoreNotFoundError(f"no sharded dataset at {self._url}: no {MANIFEST_FILE}")
        return parse_manifest(self._manifest, f"{self._url}/{MANIFEST_FILE}")

    def schema(self) -> RecordSchema:
        """The schema of the one store at the URL."""
        if self._schema is None:
            raise RemoteNotFoundError(
                f"no dataset at {self._url}: neither {MANIFEST_FILE} nor {SCHEMA_FILE} is there"
            )
        return RecordSchema.parse(self._schema, f"{self._url}/{SCHEMA_FILE}")

    def store(self, *, verify: bool, num_threads: int | None) -> RecordStore:
        """The one store at the URL; closing it closes the reader."""
        return RemoteStore.inside(
            self._reader, "", verify=verify, num_threads=num_threads, owns_reader=True
        )

    def changed(self) -> bool:
        return False  # every chunk read is pinned to its ETag; see open_shard

    def open_shard(
        self, name: str, schema: RecordSchema, *, verify: bool, num_threads: int
    ) -> RecordStore:
        where = self._reader.url(name)

        def belongs(found: list[Found]) -> None:
            gen, schema_file = found
            if generation_of(None if gen is None else gen[1]) != self._generation:
                raise StoreChangedError(
                    f"{self._url} was overwritten since this reader opened it (its shards may "
                    "hold another dataset now): reopen the dataset"
                )
            if schema_file is None:  # the shard, or its schema.json alone (one HEAD says)
                gone = f"shard {name} of the manifest is missing"
                if self._reader.head_all([f"{name}/{META_FILE}"], missing_ok=True)[0]:
                    gone = f"{SCHEMA_FILE} of shard {name} is missing: the shard is damaged"
                raise CorruptStoreError(f"{where}: {gone}")
            parsed = RecordSchema.parse(schema_file[1], f"{where}/{SCHEMA_FILE}")
            if not parsed.same_records(schema):
                raise CorruptStoreError(
                    f"{where}/schema.json disagrees with the dataset's manifest"
                )

        return RemoteStore.inside(
            self._reader, name, verify=verify, num_threads=num_threads,
            along=[(GEN_FILE, 16), (f"{name}/{SCHEMA_FILE}", MAX_SCHEMA_BYTES)], check=belongs,
        )  # fmt: skip

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        if len(items) <= 1:
            return [fn(item) for item in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.fanout, "chute-shard-open")
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._reader.close()


def _identity(folder: Path) -> tuple[int, int]:
    """What tells one folder from another at the same path: its device and inode."""
    st = os.stat(folder)
    return st.st_dev, st.st_ino
