"""A store's open files and mappings, and the immutable read snapshot built from them.

`StoreFiles` owns descriptors and mappings; it is changed only under its handle's lock. A
`Snapshot` captures, as one object, everything a read needs: the table up to the length, the
chunk limits and chunk maps for that same state, the checksums and the generation. A handle
moves to a new state by swapping its snapshot whole, so a gather racing an append (or a chunk
rollover) in another thread sees the old state or the new one, never limits of one and a table
of the other.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from chute import _native
from chute._util.fs import unlock
from chute._util.safe_open import open_regular, read_regular
from chute.errors import CorruptStoreError, StoreError
from chute.store import _format as fmt
from chute.store._codec import dict_sum, digest_for_reading

State = tuple[int, int, int]  # tail_chunk, tail_offset, length
NO_STATE: State = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)  # matches no real header


@dataclass(frozen=True, eq=False)
class Snapshot:
    """One consistent state of the store, as the gather family reads it."""

    table: npt.NDArray[np.void]  # entries 0..length
    tail_chunk: int
    tail_offset: int
    limits: npt.NDArray[np.uint64]  # readable bytes of each chunk in this state
    maps: Any  # the chunk files, mapped by the compiled core
    sums: npt.NDArray[np.void] | None  # the checksum sidecar's entries, if it has any
    strict: bool  # the sidecar was in step with this state: a mismatch is damage
    ddict: Any
    generation: int

    @property
    def length(self) -> int:
        return len(self.table)

    @property
    def state(self) -> State:
        return self.tail_chunk, self.tail_offset, self.length


def empty_snapshot() -> Snapshot:
    """What a closed handle holds: no records, no mappings."""
    return Snapshot(
        table=np.empty(0, fmt.LOC_DTYPE), tail_chunk=0, tail_offset=0,
        limits=np.empty(0, np.uint64), maps=None, sums=None, strict=False, ddict=None,
        generation=-1,
    )  # fmt: skip


class StoreFiles:
    """Descriptors and mappings of one handle's view of a store directory."""

    def __init__(self, path: Path, writable: bool) -> None:
        self.path = path
        self.writable = writable
        self.meta_fd = -1
        self.meta: mmap.mmap | None = None
        self.table = np.empty(0, fmt.LOC_DTYPE)  # every slot of meta.zr, past length too
        self.sums_fd = -1
        self.sums_map: mmap.mmap | None = None
        self.sums: npt.NDArray[np.void] | None = None
        self.chunk_fds: list[int] = []
        self.maps: Any = None
        self.gen_fd = -1
        self.gen_map: mmap.mmap | None = None
        self._gen_lock = threading.Lock()
        self.dictionary: bytes | None = None
        self.ddict: Any = None

    # ---- meta.zr -------------------------------------------------------------------

    def map_meta(self) -> State:
        """Map meta.zr whole and return its header state. The new table is in place before
        the old mapping goes, so threads reading the old table never see it vanish."""
        size = os.fstat(self.meta_fd).st_size
        if size < fmt.HEADER_SIZE:
            raise CorruptStoreError(
                f"{self.path}/meta.zr is truncated: {size} bytes, the header alone is 16"
            )
        access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
        meta = mmap.mmap(self.meta_fd, size, access=access)
        try:
            state = self._check_header(meta, (size - fmt.HEADER_SIZE) // fmt.LOC_SIZE)
        except BaseException:
            meta.close()
            raise
        old, self.meta = self.meta, meta
        capacity = (size - fmt.HEADER_SIZE) // fmt.LOC_SIZE
        self.table = np.frombuffer(meta, fmt.LOC_DTYPE, count=capacity, offset=fmt.HEADER_SIZE)
        if old is not None:
            release(old)
        return state

    def _check_header(self, meta: mmap.mmap, capacity: int) -> State:
        return check_header(str(self.path), meta, capacity)

    def read_state(self) -> State:
        """The header state as last published (one atomic read, see zrecord_module.c)."""
        assert self.meta is not None
        state = _native.load_state(self.meta)
        tail_chunk, _, length = state
        if length > len(self.table):  # meta.zr grew: map it again
            return self.map_meta()
        if tail_chunk >= fmt.MAX_CHUNKS:
            raise CorruptStoreError(f"{self.path}: tail chunk {tail_chunk} is past the limit")
        return state

    # ---- chunks --------------------------------------------------------------------

    def open_chunks(self, tail_chunk: int) -> None:
        """Open chunk files up to ``tail_chunk`` and map them (again, when that adds any)."""
        known = len(self.chunk_fds)
        while len(self.chunk_fds) <= tail_chunk:
            c = len(self.chunk_fds)
            try:  # a regular file in the store's own folder: no symlink to another store
                fd = open_regular(self.path / fmt.chunk_file(c), self.path, write=self.writable)
                self.chunk_fds.append(fd)
            except FileNotFoundError:
                raise CorruptStoreError(
                    f"{self.path}: chunk file {fmt.chunk_file(c)} is missing "
                    f"(the header names chunks 0..{tail_chunk})"
                ) from None
        if self.maps is None or known != len(self.chunk_fds):
            self.maps = _native.map_chunks(self.chunk_fds)

    def remap_chunks(self) -> None:
        self.maps = _native.map_chunks(self.chunk_fds)

    def limits(self, tail_chunk: int, tail_offset: int) -> npt.NDArray[np.uint64]:
        """Bytes readable in each chunk: its file size, and in the tail, up to the frontier.
        Files a reader maps never shrink in place, so these stay readable for its life."""
        sizes = [os.fstat(fd).st_size for fd in self.chunk_fds]
        return chunk_limits(sizes, tail_chunk, tail_offset)

    # ---- dict.zr -------------------------------------------------------------------

    def open_dict(self) -> None:
        """Load dict.zr, if there is one, and check it: against the size and CRC-32C that
        dict.chute recorded when chute trained it, and by zstd's own parse. A dictionary
        another tool trained has no dict.chute; zstd's parse is then the only check."""
        path = self.path / fmt.DICT_FILE
        if not os.path.lexists(path):
            return
        data = read_regular(path, self.path, limit=fmt.MAX_DICT)
        try:
            stamp: bytes | None = read_regular(
                self.path / fmt.DICT_SUM_FILE, self.path, limit=fmt.DICT_SUM.size
            )
        except FileNotFoundError:
            stamp = None
        self.dictionary, self.ddict = data, load_dict(str(self.path), data, stamp)

    # ---- crc32c.chute --------------------------------------------------------------

    def open_sums(self) -> bool:
        """Open the checksum sidecar if there is one; True when it is usable."""
        path = self.path / fmt.SUMS_FILE
        try:
            if self.writable:  # the writer's own: it created the file, or replaces it
                self.sums_fd = os.open(path, os.O_RDWR)
            else:
                self.sums_fd = open_regular(path, self.path)
        except FileNotFoundError:
            return False
        self.map_sums(0)
        return self.sums is not None

    def map_sums(self, capacity: int) -> None:
        """Map the sidecar whole, growing it first (never shrinking) to ``capacity`` entries.
        One cut inside its header is left as it is: damage, not a file to fill with zeros."""
        size = fmt.SUMS_HEADER.size + capacity * fmt.SUMS_DTYPE.itemsize
        have = os.fstat(self.sums_fd).st_size
        if self.writable and fmt.SUMS_HEADER.size <= have < size:
            os.ftruncate(self.sums_fd, size)
            have = size
        self.sums = None
        if self.sums_map is not None:
            release(self.sums_map)
            self.sums_map = None
        if have < fmt.SUMS_HEADER.size:
            return  # damaged: see lost_sums
        access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
        self.sums_map = mmap.mmap(self.sums_fd, have, access=access)
        self.sums = parse_sums(self.sums_map)

    def close_sums(self) -> None:
        self.sums = None
        if self.sums_map is not None:
            release(self.sums_map)
            self.sums_map = None
        if self.sums_fd >= 0:
            os.close(self.sums_fd)
            self.sums_fd = -1

    def lost_sums(self) -> str | None:
        """Why the checksums of a store chute wrote cannot be used (damage), or None: they
        can, or no chute ever wrote the store (it has neither crc32c.chute nor gen.chute,
        which every chute writer creates, the sidecar first)."""
        if self.sums is not None:
            return None
        return lost_sums(
            str(self.path),
            os.path.lexists(self.path / fmt.SUMS_FILE),
            os.path.lexists(self.path / fmt.GEN_FILE),
        )

    def sums_stamp(self) -> State | None:
        """The header state the sidecar was last brought in step with."""
        if self.sums_map is None or self.sums is None:
            return None
        return _native.load_state(self.sums_map)

    # ---- gen.chute -----------------------------------------------------------------

    def open_gen(self) -> bool:
        """Open and map gen.chute if it is there and sound; True when it is."""
        path = self.path / fmt.GEN_FILE
        try:  # a FIFO here would hang the open: a regular file in the folder only
            fd = open_regular(path, self.path, write=self.writable)
        except FileNotFoundError:
            return False
        if os.fstat(fd).st_size < fmt.GEN_HEADER.size:
            os.close(fd)
            return False
        access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
        m = mmap.mmap(fd, fmt.GEN_HEADER.size, access=access)
        if not is_generation(m):
            m.close()
            os.close(fd)
            return False
        self.gen_fd, self.gen_map = fd, m
        return True

    def generation(self) -> int:
        """The store's generation now (0 for a store without gen.chute). A reader that
        opened before a chute writer created the file picks it up here."""
        if self.gen_map is None:
            with self._gen_lock:  # threads of one handle check at once: open it once
                if self.gen_map is None and (self.writable or not self.open_gen()):
                    return 0
            assert self.gen_map is not None
        return _native.load_generation(self.gen_map)

    def disk_usage(self) -> dict[str, int]:
        """Apparent bytes of the table and the checksum sidecar, and the bytes every file of
        the store takes on disk (allocated blocks: loaderx's sparse files count as written)."""
        disk = 0
        for entry in os.scandir(self.path):
            if fmt.is_store_file(entry.name):
                disk += entry.stat().st_blocks * 512
        return {
            "table_bytes": os.fstat(self.meta_fd).st_size,
            "checksum_bytes": os.fstat(self.sums_fd).st_size if self.sums_fd >= 0 else 0,
            "disk_bytes": disk,
        }

    # ---- snapshots and lifetime ----------------------------------------------------

    def snapshot(self, state: State, generation: int) -> Snapshot:
        tail_chunk, tail_offset, length = state
        sums = self.sums
        if sums is not None and len(sums) < length and not self.writable:
            self.map_sums(0)  # the writer grew it since
            sums = self.sums
        return Snapshot(
            table=self.table[:length],
            tail_chunk=tail_chunk,
            tail_offset=tail_offset,
            limits=self.limits(tail_chunk, tail_offset),
            maps=self.maps,
            sums=sums,
            strict=sums is not None and self.sums_stamp() == state,
            ddict=self.ddict,
            generation=generation,
        )

    def close(self) -> None:
        """Close everything. The writer lock is released first and explicitly: a mapping
        still viewed elsewhere (a snapshot in a traceback) keeps a duplicate descriptor."""
        if self.writable and self.meta_fd >= 0:
            unlock(self.meta_fd)
        self.sums = None
        self.ddict = self.maps = None
        self.table = np.empty(0, fmt.LOC_DTYPE)
        for m in (self.sums_map, self.meta, self.gen_map):
            if m is not None:
                release(m)
        self.sums_map = self.meta = self.gen_map = None
        for fd in (*self.chunk_fds, self.sums_fd, self.meta_fd, self.gen_fd):
            if fd >= 0:
                os.close(fd)
        self.chunk_fds = []
        self.sums_fd = self.meta_fd = self.gen_fd = -1


# ---- the format's checks, for a store read from files or from object storage -------------


def check_header(where: str, meta: Any, capacity: int) -> State:
    """The state in meta.zr's header (an 8-byte aligned buffer of at least 16 bytes), checked:
    magic, version, a length within the ``capacity`` entries the file holds, the tail chunk
    within the format's. ``where`` names the store in errors."""
    magic, version = bytes(meta[:4]), int.from_bytes(meta[4:6], "little")
    if magic != fmt.MAGIC:
        raise CorruptStoreError(f"{where} is not a Zrecord store: bad magic {magic!r}")
    if version != fmt.VERSION:
        raise StoreError(f"{where}: Zrecord version {version} is not supported (want 3)")
    tail_chunk, tail_offset, length = _native.load_state(meta)
    if length > capacity:
        raise CorruptStoreError(
            f"{where}/meta.zr is truncated: header says {length} records, "
            f"the file holds {capacity} table entries"
        )
    if tail_chunk >= fmt.MAX_CHUNKS:
        raise CorruptStoreError(f"{where}: tail chunk {tail_chunk} is past the limit")
    return tail_chunk, tail_offset, length


def chunk_limits(sizes: list[int], tail_chunk: int, tail_offset: int) -> npt.NDArray[np.uint64]:
    """Bytes readable in each chunk of these sizes: its size (at most the format's span),
    and in the tail chunk, up to the frontier."""
    limits = np.array([min(size, fmt.CHUNK_LIMIT) for size in sizes], np.uint64)
    if tail_chunk < len(limits):
        limits[tail_chunk] = min(int(limits[tail_chunk]), tail_offset)
    return limits


def load_dict(where: str, data: bytes, stamp: bytes | None) -> Any:
    """dict.zr's bytes checked against dict.chute's ``stamp`` (its size and CRC-32C when
    chute trained it; ``None`` where another tool did, with zstd's parse the only check),
    digested for reading."""
    path = f"{where}/{fmt.DICT_FILE}"
    want = dict_sum(data)
    if stamp is not None and stamp != want:
        file = f"{where}/{fmt.DICT_SUM_FILE}"
        if len(stamp) != fmt.DICT_SUM.size or stamp[:6] != want[:6]:
            raise CorruptStoreError(f"{file} is damaged: it is not a record of {fmt.DICT_FILE}")
        _, _, size, crc = fmt.DICT_SUM.unpack(stamp)
        _, _, have, got = fmt.DICT_SUM.unpack(want)
        raise CorruptStoreError(
            f"{path} is damaged: it holds {have} bytes with CRC-32C {got:#010x}, but the "
            f"dictionary chute trained was {size} bytes with CRC-32C {crc:#010x} "
            f"({fmt.DICT_SUM_FILE}); every zstd_dict record would decode wrong"
        )
    try:
        return digest_for_reading(data)
    except ValueError:
        raise CorruptStoreError(f"{path} is damaged: zstd rejects it as a dictionary") from None


def parse_sums(data: Any) -> npt.NDArray[np.void] | None:
    """The entries of a checksum sidecar's bytes (a view), or None if its header is not
    a sidecar's (damage: see `lost_sums`)."""
    if len(data) < fmt.SUMS_HEADER.size:
        return None
    magic, version = fmt.SUMS_HEADER.unpack_from(data)[:2]
    if magic != fmt.SUMS_MAGIC or version != fmt.SUMS_VERSION:
        return None
    count = (len(data) - fmt.SUMS_HEADER.size) // fmt.SUMS_DTYPE.itemsize
    return np.frombuffer(data, fmt.SUMS_DTYPE, count=count, offset=fmt.SUMS_HEADER.size)


def lost_sums(where: str, sums_exist: bool, gen_exists: bool) -> str | None:
    """Why the checksums of a store chute wrote cannot be used, given that its sidecar is not
    usable: it is there but damaged, or gone while gen.chute (which every chute writer creates,
    after the sidecar) says chute wrote the store; None for a store another tool wrote."""
    sums = f"{where}/{fmt.SUMS_FILE}"
    if sums_exist:
        return f"{sums} is damaged (cut short, or its header is not a checksum sidecar's)"
    if gen_exists:
        return f"{sums} is missing, though {fmt.GEN_FILE} says chute wrote this store"
    return None


def is_generation(data: Any) -> bool:
    """Whether ``data`` (16 bytes or more) is gen.chute's header."""
    return len(data) >= fmt.GEN_HEADER.size and bytes(data[:4]) == fmt.GEN_MAGIC


def generation_of(data: bytes | None) -> int:
    """The generation gen.chute's bytes hold (0 for none, or a file that is not one, as a
    local reader takes it)."""
    if data is None or not is_generation(data):
        return 0
    return int(fmt.GEN_HEADER.unpack_from(data)[2])


def release(m: mmap.mmap) -> None:
    """Unmap now, or, while a view (a snapshot, a traceback) still holds it, when it dies."""
    with contextlib.suppress(BufferError):
        m.close()
