"""Turn a URL into a read-only zarr store, and count what is read through it."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import urlparse

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import ObjectStore, WrapperStore

from chute._objects import open_location

from ._files import METADATA_NAMES, ArchiveFiles, archive_files

StoreLike = str | os.PathLike[str] | Store | Any
"""A URL or path, a zarr ``Store``, or an Icechunk ``Session`` (its store is read)."""


def session_of(url: StoreLike) -> Any | None:
    """The Icechunk session ``url`` is or reads through, else ``None``."""
    if hasattr(url, "snapshot_id") and hasattr(url, "store"):
        return url
    session = getattr(url, "session", None)
    return session if hasattr(session, "snapshot_id") else None


def store_name(url: StoreLike) -> str:
    """The last part of a URL or path, less ``.zarr`` (the name of an array stored at the root)."""
    if not isinstance(url, (str, os.PathLike)):
        return ""
    tail = os.path.basename(urlparse(os.fspath(url)).path.rstrip("/"))
    return tail.removesuffix(".zarr")


def open_store(url: StoreLike, **store_kwargs: Any) -> Store:
    """A read-only store for ``url``.

    ``s3://bucket/prefix``, ``gs://``, ``az://``, ``http(s)://``, ``file:///path`` and plain
    paths read through obstore, resolved as every chute URL is (`chute._objects`): the
    keyword arguments go to its store, e.g. ``endpoint=``, ``region=``,
    ``client_options={"allow_http": True}``. A zarr ``Store`` instance is used as is, so
    any backend zarr supports works through zarr's own store API. An Icechunk session
    (read-only, at a branch, tag or snapshot) is read through its store.
    """
    session = session_of(url)
    if session is not None and not isinstance(url, Store):
        url = session.store
    if isinstance(url, Store):
        if store_kwargs:
            raise TypeError(f"store options {sorted(store_kwargs)} given with a Store instance")
        return url
    if not isinstance(url, (str, os.PathLike)):
        raise TypeError(
            f"expected a URL, a path, a zarr Store or an Icechunk session, got {type(url).__name__}"
        )
    text = os.fspath(url)
    location = open_location(text, **store_kwargs)
    if location.local is None:
        return ObjectStore(location.store, read_only=True)
    if not os.path.isdir(location.local):
        raise FileNotFoundError(f"no Zarr directory at {location.local!r}")
    from obstore.store import LocalStore

    return ObjectStore(LocalStore(location.local), read_only=True)


class CountingStore(WrapperStore[Store]):
    """Wraps a store and counts the reads (per key), bytes and seconds spent in ``get``.

    A local archive's files are read through `ArchiveFiles` (``files``), whatever reads
    them (zarr's codec pipeline, its metadata, the direct reader): only regular files
    inside the store's folder, each read with a bound.
    """

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.files = archive_files(store)
        self._lock = threading.Lock()
        self.gets: Counter[str] = Counter()
        self.bytes_read = 0
        self.seconds = 0.0

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        start = time.perf_counter()
        if self.files is not None:
            data = await asyncio.to_thread(self.files.read, key, byte_range)
            out = None if data is None else prototype.buffer.from_bytes(data)
        else:
            out = await self._store.get(key, prototype, byte_range)
        if out is not None and byte_range is None and key.rsplit("/", 1)[-1] in METADATA_NAMES:
            _check_json(key, out.to_bytes(), self.files)
        self.record(key, 0 if out is None else len(out), time.perf_counter() - start)
        return out

    @property
    def wrapped(self) -> Store:
        return self._store

    def record(self, key: str, nbytes: int, seconds: float) -> None:
        """Count a read of ``key`` made around the store (a direct local read)."""
        with self._lock:
            self.gets[key] += 1
            self.bytes_read += nbytes
            self.seconds += seconds


def _check_json(key: str, data: bytes, files: ArchiveFiles | None) -> None:
    """A metadata document that is not JSON is an error naming it (zarr's own names
    neither the file nor the array)."""
    try:
        json.loads(data)
    except ValueError as exc:
        where = key if files is None else os.path.join(files.root, key)
        raise ValueError(f"the Zarr metadata document {where} is damaged: {exc}") from None
