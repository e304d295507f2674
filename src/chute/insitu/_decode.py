"""A direct read for the common stored-chunk layout: fetch the object, decode into place.

Arrays whose codecs are just ``bytes`` (native byte order) plus optionally ``zstd`` skip
zarr's codec pipeline: the object is fetched and decompressed straight into a buffer the
pool hands out (recycled, so steady state allocates nothing), on the decode thread pool.
Local stores are read with ``readv`` into a per-thread buffer in that same thread job;
other stores through the zarr store API. Everything else, and any chunk that is missing
or at the array edge, goes through zarr.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.core.buffer import default_buffer_prototype

from ._store import CountingStore

_scratch = threading.local()


def reserve_read_buffer(nbytes: int) -> bytearray:
    """This thread's reusable read buffer, grown to at least ``nbytes`` (zero-filled, so
    its pages are mapped now rather than during a read)."""
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _scratch.buf = bytearray(nbytes)
    return buf


def _read_file(path: str) -> memoryview | None:
    """The whole file at ``path`` in this thread's reusable buffer; ``None`` if missing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        view = memoryview(reserve_read_buffer(size))[:size]
        got = 0
        while got < size:
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise OSError(f"{path}: file shrank while reading ({got} of {size} bytes)")
            got += n
        return view
    finally:
        os.close(fd)


class DirectReader:
    """Fetch + decode of one whole stored chunk of a plain or zstd-compressed array."""

    def __init__(
        self,
        array: Any,
        zstd: Any | None,
        counter: CountingStore | None,
        on_decode: Callable[[float], None],
    ) -> None:
        store = array.store_path.store
        self._prefix = f"{array.store_path.path}/" if array.store_path.path else ""
        self._store = store
        self._root = local_root(store)
        self._counter = counter
        self._metadata = array.metadata
        self._zstd = zstd
        self._on_decode = on_decode
        self.chunk_shape = tuple(int(c) for c in array.chunks)
        self.dtype = np.dtype(array.dtype)
        self.nbytes = int(np.prod(self.chunk_shape)) * self.dtype.itemsize

    @property
    def reads_files(self) -> bool:
        """Whether chunks are read from local files into a per-thread read buffer."""
        return self._root is not None

    @classmethod
    def for_array(cls, array: Any, on_decode: Callable[[float], None]) -> DirectReader | None:
        """A reader if ``array``'s codecs allow a direct read, else ``None``;
        ``on_decode(seconds)`` is told the time spent decompressing each chunk."""
        codecs = tuple(array.metadata.codecs)
        if array.shards is not None or not codecs or not isinstance(codecs[0], BytesCodec):
            return None
        endian = getattr(codecs[0].endian, "value", codecs[0].endian)  # an enum before zarr 3.2
        itemsize = np.dtype(array.dtype).itemsize
        if endian is not None and endian != sys.byteorder and itemsize > 1:
            return None
        store = array.store_path.store
        counter = store if isinstance(store, CountingStore) else None
        if len(codecs) == 1:
            return cls(array, None, counter, on_decode)
        if len(codecs) == 2 and isinstance(codecs[1], ZstdCodec):
            from numcodecs import Zstd  # type: ignore[import-untyped]

            return cls(array, Zstd(), counter, on_decode)
        return None

    async def read(
        self, coords: tuple[int, ...], buffer: Callable[[], np.ndarray]
    ) -> np.ndarray | None:
        """The decoded chunk at grid ``coords``, written into ``buffer()`` (flat uint8 of
        ``nbytes``); ``None`` if the object is missing."""
        key = self._prefix + self._metadata.encode_chunk_key(coords)
        loop = asyncio.get_running_loop()
        if self._root is not None:
            return await loop.run_in_executor(None, self._local, key, buffer)
        raw = await self._store.get(key, prototype=default_buffer_prototype())
        if raw is None:
            return None
        return await loop.run_in_executor(None, self._decode, raw.as_numpy_array(), buffer())

    def _local(self, key: str, buffer: Callable[[], np.ndarray]) -> np.ndarray | None:
        assert self._root is not None
        start = time.perf_counter()
        src = _read_file(os.path.join(self._root, key))
        if src is None:
            return None
        if self._counter is not None:
            self._counter.record(key, len(src), time.perf_counter() - start)
        return self._decode(np.frombuffer(src, dtype=np.uint8), buffer())

    def _decode(self, src: np.ndarray, out: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        if self._zstd is None:
            if src.nbytes != out.nbytes:
                raise ValueError(f"stored chunk has {src.nbytes} bytes, expected {out.nbytes}")
            out[...] = src
        else:
            self._zstd.decode(src, out=out)
        self._on_decode(time.perf_counter() - start)
        decoded: np.ndarray = out.view(self.dtype).reshape(self.chunk_shape)
        return decoded


def local_root(store: Any) -> str | None:
    """The directory behind a local store (obstore or zarr), through counting wrappers."""
    from obstore.store import LocalStore as ObstoreLocal
    from zarr.storage import LocalStore, ObjectStore

    if isinstance(store, CountingStore):
        store = store.wrapped
    if isinstance(store, ObjectStore) and isinstance(store.store, ObstoreLocal):
        return os.fspath(store.store.prefix) if store.store.prefix is not None else None
    if isinstance(store, LocalStore):
        return os.fspath(store.root)
    return None
