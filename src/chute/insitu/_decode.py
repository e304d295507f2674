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

from chute.errors import UnsafeFileError

from ._files import ArchiveFiles, archive_files
from ._store import CountingStore

_scratch = threading.local()


def reserve_read_buffer(nbytes: int) -> bytearray:
    """This thread's reusable read buffer, grown to at least ``nbytes`` (zero-filled, so
    its pages are mapped now rather than during a read)."""
    buf: bytearray | None = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _scratch.buf = bytearray(nbytes)
    return buf


def _read_file(files: ArchiveFiles, key: str, limit: int) -> memoryview | None:
    """The whole file at ``key`` in this thread's reusable buffer; ``None`` if absent.

    Opened by `ArchiveFiles`'s rule, and read only if it holds at most ``limit`` bytes: the
    most a stored chunk of this array can take. Anything else is an `UnsafeFileError`
    naming the file (the scheduler reports it as a `BadChunkError` of its key), before any
    byte is read.
    """
    fd = files.open(key)
    if fd is None:
        return None
    path = os.path.join(files.root, key)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise UnsafeFileError(
                f"{path} holds {size} bytes, more than a chunk of it can ({limit})"
            )
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
        on_time: Callable[[Any, float], None],
    ) -> None:
        store = array.store_path.store
        self._prefix = f"{array.store_path.path}/" if array.store_path.path else ""
        self._store = store
        self._files = store.files if isinstance(store, CountingStore) else archive_files(store)
        self._counter = counter
        self._metadata = array.metadata
        self._zstd = zstd
        self._on_time = on_time
        self.chunk_shape = tuple(int(c) for c in array.chunks)
        self.dtype = np.dtype(array.dtype)
        self.nbytes = int(np.prod(self.chunk_shape)) * self.dtype.itemsize
        # what a stored chunk may hold: its bytes, or zstd's worst case for them
        self._stored_limit = (
            self.nbytes if zstd is None else self.nbytes + self.nbytes // 128 + (1 << 17)
        )

    @property
    def reads_files(self) -> bool:
        """Whether chunks are read from local files into a per-thread read buffer."""
        return self._files is not None

    @classmethod
    def for_array(cls, array: Any, on_time: Callable[[Any, float], None]) -> DirectReader | None:
        """A reader if ``array``'s codecs allow a direct read, else ``None``;
        ``on_time(stage, seconds)`` is told the time each chunk spent decompressing
        (``"decode"``) and waiting for a decode thread (``"queue"``)."""
        if array.metadata.zarr_format != 3:  # v2 chunks are read through zarr
            return None
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
            return cls(array, None, counter, on_time)
        if len(codecs) == 2 and isinstance(codecs[1], ZstdCodec):
            from numcodecs import Zstd  # type: ignore[import-untyped]

            return cls(array, Zstd(), counter, on_time)
        return None

    async def read(
        self, coords: tuple[int, ...], buffer: Callable[[], np.ndarray]
    ) -> np.ndarray | None:
        """The decoded chunk at grid ``coords``, written into ``buffer()`` (flat uint8 of
        ``nbytes``); ``None`` if the object is missing."""
        key = self._prefix + self._metadata.encode_chunk_key(coords)
        loop = asyncio.get_running_loop()
        submitted = time.perf_counter()
        if self._files is not None:
            return await loop.run_in_executor(None, self._local, key, buffer, submitted)
        raw = await self._store.get(key, prototype=default_buffer_prototype())
        if raw is None:
            return None
        submitted = time.perf_counter()
        src = raw.as_numpy_array()
        return await loop.run_in_executor(None, self._decode, src, buffer(), submitted)

    def _local(
        self, key: str, buffer: Callable[[], np.ndarray], submitted: float
    ) -> np.ndarray | None:
        assert self._files is not None
        start = time.perf_counter()
        self._on_time("queue", start - submitted)
        src = _read_file(self._files, key, self._stored_limit)
        if src is None:
            return None
        if self._counter is not None:
            self._counter.record(key, len(src), time.perf_counter() - start)
        return self._decode(np.frombuffer(src, dtype=np.uint8), buffer(), None)

    def _decode(self, src: np.ndarray, out: np.ndarray, submitted: float | None) -> np.ndarray:
        start = time.perf_counter()
        if submitted is not None:
            self._on_time("queue", start - submitted)
        if self._zstd is None:
            if src.nbytes != out.nbytes:
                raise ValueError(
                    f"stored chunk has {src.nbytes} bytes, but chunk shape {self.chunk_shape} "
                    f"of {self.dtype} needs {out.nbytes}"
                )
            out[...] = src
        else:
            size = zstd_content_size(src)
            if size is not None and size != out.nbytes:
                raise ValueError(
                    f"stored chunk decompresses to {size} bytes, but chunk shape "
                    f"{self.chunk_shape} of {self.dtype} needs {out.nbytes}"
                )
            if size is None:  # no size in the frame: decode into a spare byte to see excess
                spare = np.empty(out.nbytes + 1, dtype=np.uint8)
                try:
                    self._zstd.decode(src, out=spare)
                except ValueError:  # "destination buffer too small": the chunk is longer
                    raise ValueError(
                        f"stored chunk decompresses to more than the {out.nbytes} bytes "
                        f"chunk shape {self.chunk_shape} of {self.dtype} needs"
                    ) from None
                out[...] = spare[: out.nbytes]
            else:
                self._zstd.decode(src, out=out)
        self._on_time("decode", time.perf_counter() - start)
        decoded: np.ndarray = out.view(self.dtype).reshape(self.chunk_shape)
        return decoded


_ZSTD_MAGIC = 0xFD2FB528


def zstd_content_size(src: np.ndarray) -> int | None:
    """The decompressed size a single zstd frame declares, or ``None`` if it declares none
    (a frame may omit it).

    The frame header (RFC 8878, 3.1.1): magic, a descriptor byte, an optional window byte,
    an optional dictionary id, then the content size in 0, 1, 2, 4 or 8 bytes.
    """
    head = bytes(src[:18])
    if len(head) < 5 or int.from_bytes(head[:4], "little") != _ZSTD_MAGIC:
        raise ValueError("stored chunk is not a zstd frame")
    descriptor = head[4]
    fcs_flag, single = descriptor >> 6, (descriptor >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or len(head) < pos + width:
        return None
    size = int.from_bytes(head[pos : pos + width], "little")
    return size + 256 if width == 2 else size
