"""Turn a URL into a read-only zarr store, and count what is read through it."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import urlparse

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import ObjectStore, WrapperStore

StoreLike = str | os.PathLike[str] | Store


def open_store(url: StoreLike, **store_kwargs: Any) -> Store:
    """A read-only store for ``url``.

    ``s3://bucket/prefix``, ``file:///path`` and plain paths read through obstore (the
    keyword arguments go to its store, e.g. ``endpoint=``, ``region=``,
    ``client_options={"allow_http": True}``). A zarr ``Store`` instance is used as is, so
    any backend zarr supports works through zarr's own store API.
    """
    if isinstance(url, Store):
        if store_kwargs:
            raise TypeError(f"store options {sorted(store_kwargs)} given with a Store instance")
        return url
    from obstore.store import LocalStore, S3Store

    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"s3 URL without a bucket: {text!r}")
        prefix = parsed.path.strip("/") or None
        return ObjectStore(S3Store(parsed.netloc, prefix=prefix, **store_kwargs), read_only=True)
    if parsed.scheme in ("file", ""):
        path = os.path.abspath(parsed.path if parsed.scheme == "file" else text)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no Zarr directory at {path!r}")
        return ObjectStore(LocalStore(path, **store_kwargs), read_only=True)
    raise ValueError(
        f"unsupported URL scheme {parsed.scheme!r} in {text!r}: use s3://, file://, a local "
        "path, or pass a zarr Store instance"
    )


class CountingStore(WrapperStore[Store]):
    """Wraps a store and counts the reads (per key), bytes and seconds spent in ``get``."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._lock = threading.Lock()
        self.gets: Counter[str] = Counter()
        self.bytes_read = 0
        self.seconds = 0.0

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        start = time.perf_counter()
        out = await self._store.get(key, prototype, byte_range)
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
