"""The on-disk chunk pool: decoded slabs in files under ``cache_dir``, shared by processes.

Every process on a host that opens the same archive (same resolved location, the same
metadata documents, byte for byte and by their file stamps, the same variables, geometry
and chunk transforms) with the same ``cache_dir`` joins one directory,
``cache_dir/chute-<digest>/``, whose ``identity`` file (the whole SHA-256 of the identity)
each joiner checks against its own.
An archive rewritten in place, or a ``latest.zarr`` link moved, has another identity, so
its readers get another pool and never the old archive's slabs. The first process to need
a slab takes its lock, decodes it and publishes it as a file; the others wait for the file
and map it, so each slab is decoded once per host and the processes that did not decode it
share its pages.

The folder itself (membership, the identity check, the byte budget and least-recently-used
eviction, reservations published by rename) is `chute._util.shared_folder`, the mechanism
the block cache of remote objects (`chute._objects._cache`) shares; its docstring gives the
crash-safety argument. What is the pool's own:

- A slab file is trusted for nothing: it must be a regular file inside the pool, its header
  must name this slab of this pool, a dtype without Python objects and the shape (and, with
  no chunk transform, the dtype) the geometry gives, its size must match, and a CRC-32C over
  its header and data must hold. Anything else is damage: the file is removed under the
  slab's lock and the slab decoded again from the archive (the pool is a cache).
- A slab is stale when the chunk files it was decoded from changed since (data rewritten
  without touching the metadata, which the identity covers): its header records their
  stamp (``chunk_stamp``, taken before they were read, so a change during the read shows
  too), and a loader whose stamp of them now differs treats the file as damaged.
- A slab's lock is the folder's lock on its name; a waiter whose decoder died takes it and
  decodes the slab itself.

A removed file that a process still maps stays readable to it (the kernel keeps its pages
until unmapped); the disk space is freed when the last mapping goes.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
from typing import Any

import numpy as np

from chute._native import crc32c
from chute._util.shared_folder import SharedFolder
from chute.errors import UnsafeFileError

from ._pool import SlabKey

_HEADER = 256  # bytes before the data: magic, CRC-32C, then JSON, space-padded
_MAGIC = b"CHUTESL2"
_CRC_END = len(_MAGIC) + 4  # the CRC covers the header from here on, then the data


class _Damaged(Exception):
    """A slab file that is not what its name promises."""


class SharedChunks:
    """A host-wide pool of decoded slabs under ``cache_dir`` for one archive identity."""

    def __init__(self, cache_dir: str, identity: str, budget_bytes: int) -> None:
        if not os.path.isdir(cache_dir):
            raise FileNotFoundError(f"cache_dir {cache_dir!r} is not a directory")
        full = hashlib.sha256(identity.encode()).hexdigest()
        self.digest = full[:20]
        self.root = os.path.join(cache_dir, f"chute-{self.digest}")
        self.budget_bytes = budget_bytes
        self.discarded = 0  # damaged or stale slab files this member removed
        self._folder = SharedFolder(
            self.root,
            full.encode(),  # what the folder's ``identity`` file must hold
            budget_bytes,
            suffix=".slab",
            holds="the slabs of another archive",
        )

    def close(self) -> None:
        """Leave; the last member to leave removes the directory."""
        self._folder.close()

    # -- slabs -----------------------------------------------------------------------

    def _name(self, key: SlabKey) -> str:
        return f"{hashlib.sha256(key[0].encode()).hexdigest()[:16]}-{key[1]}"

    def published(self, key: SlabKey) -> bool:
        """Whether the slab has a published file (one ``lstat``: cheap enough for the event
        loop; `load` then checks it)."""
        return os.path.lexists(self._folder.path(self._name(key)))

    def load(
        self,
        key: SlabKey,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | None,
        source: str,
        *,
        held: bool = False,
    ) -> np.ndarray | None:
        """The published slab, mapped read-only and checked; ``None`` if absent, damaged or
        stale.

        ``shape`` is what the geometry gives for the slab, ``dtype`` too unless a chunk
        transform may change it (``None``); ``source`` is the stamp of its chunks now
        (``chunk_stamp``), which the file's must match. With ``held`` (the caller holds the
        slab's lock, so nobody publishes it meanwhile) a damaged or stale file is removed,
        to be decoded again.
        """
        name = self._name(key)
        try:
            return self._map(name, shape, dtype, source)
        except FileNotFoundError:
            return None
        except (_Damaged, UnsafeFileError):
            if held:
                self._folder.discard(name)
                self.discarded += 1
            return None

    def _map(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | None,
        source: str,
    ) -> np.ndarray:
        path = self._folder.path(name)
        fd = self._folder.open(name)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, _HEADER, 0)
            found = self._check_header(head, name, shape, dtype, source)
            if size != _HEADER + math.prod(shape) * found.itemsize:
                raise _Damaged(f"{path}: its size does not match its header")
            if size == _HEADER:
                data = np.zeros(shape, dtype=found)
            else:
                view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
                data = np.frombuffer(view, found, math.prod(shape), _HEADER).reshape(shape)
            if crc32c(_bytes_of(data), crc32c(head[_CRC_END:])) != _stored_crc(head):
                raise _Damaged(f"{path}: its checksum does not match")
            self._folder.touch(fd)  # most recently used
            return data
        finally:
            os.close(fd)

    def _check_header(
        self,
        head: bytes,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | None,
        source: str,
    ) -> np.dtype[Any]:
        """The dtype a slab file's header names, if the header describes this slab as
        decoded from its chunks as they are now."""
        if len(head) != _HEADER or not head.startswith(_MAGIC):
            raise _Damaged(f"{name}: no slab header")
        try:
            meta = json.loads(head[_CRC_END:])
            found = np.dtype(meta["dtype"]) if isinstance(meta, dict) else None
            said = tuple(int(n) for n in meta["shape"]) if isinstance(meta, dict) else ()
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            raise _Damaged(f"{name}: unreadable header ({exc})") from None
        if found is None or meta.get("slab") != name or meta.get("pool") != self.digest:
            raise _Damaged(f"{name}: the file of another slab or pool")
        if found.hasobject or found.subdtype is not None or said != shape:
            raise _Damaged(f"{name}: header says {found} {said}, the geometry {shape}")
        if dtype is not None and found.newbyteorder("<") != dtype.newbyteorder("<"):
            raise _Damaged(f"{name}: header says {found}, the geometry {dtype}")
        if meta.get("source", "") != source:
            raise _Damaged(f"{name}: stale, its chunks changed since it was decoded")
        return found

    def try_lock(self, key: SlabKey) -> int | None:
        """Take the slab's decode lock without waiting: its fd, or ``None`` if held."""
        return self._folder.try_lock(self._name(key))

    @staticmethod
    def unlock(fd: int) -> None:
        SharedFolder.unlock(fd)

    def publish(self, key: SlabKey, data: np.ndarray, source: str) -> None:
        """Write ``data``, decoded from chunks whose stamp was ``source`` before they were
        read, for the other processes (the publisher goes on with its own copy, whose
        buffer its pool recycles). A slab that cannot be kept within the budget, or a full
        disk or file-size limit, is not published."""
        data = np.ascontiguousarray(data)
        name = self._name(key)
        head = _header(name, self.digest, data, source)
        if head is not None:  # else too many axes to describe in a header: not cached on disk
            self._folder.publish(name, [head, _bytes_of(data).data])


def _bytes_of(data: np.ndarray) -> np.ndarray:
    """A contiguous array's bytes, as flat uint8 (any dtype without objects)."""
    return data.reshape(-1).view(np.uint8)


def _stored_crc(head: bytes) -> int:
    return int.from_bytes(head[len(_MAGIC) : _CRC_END], "little")


def _header(name: str, pool: str, data: np.ndarray, source: str) -> bytes | None:
    """The header naming slab ``name`` of ``pool``, ``data``'s dtype and shape and the
    stamp of the chunks it was decoded from, with the CRC-32C of its own text and the data;
    ``None`` if that does not fit in the header."""
    meta = {"slab": name, "pool": pool, "dtype": data.dtype.str, "shape": list(data.shape)}
    text = json.dumps({**meta, "source": source} if source else meta).encode()
    if _CRC_END + len(text) > _HEADER:
        return None
    body = text.ljust(_HEADER - _CRC_END, b" ")
    crc = crc32c(_bytes_of(data), crc32c(body))
    return _MAGIC + crc.to_bytes(4, "little") + body
