"""RecordStore: a directory of byte records in the Zrecord format.

Crash-safety order, for every mutation (the one place it is argued):

* append: record bytes go past the frontier of the tail chunk (nothing refers to them),
  then their checksums and table entries go into slots past ``length`` (nothing reads
  them), then one 10-byte write of the header publishes ``tail_chunk``, ``tail_offset`` and
  ``length`` together. A kill before that last write leaves the store as it was; after it,
  the records are committed. With ``durable=True`` each step is also fsynced before the next,
  so the same holds across power loss.
* delete: per target, highest first, the tail entry is copied into the hole and then
  ``length`` drops by one. A kill between the two leaves the tail record present twice and
  the target gone; every record not being deleted stays readable.
* compact: records move down in physical order. A record whose new place overlaps its old
  bytes is first copied past the frontier and the table pointed there, so the table never
  names bytes that are being overwritten. Re-running finishes an interrupted compaction.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, Self, TypeVar

import numpy as np
import numpy.typing as npt

from chute import _native
from chute.errors import (
    ChecksumError,
    CorruptStoreError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
)
from chute.store import _format as fmt
from chute.store._codec import (
    digest_for_reading,
    digest_for_writing,
    sample_rows,
    train_dictionary,
)
from chute.store._io import (
    fsync_dir,
    lock_exclusive,
    pread_exact,
    pwrite_all,
    write_file_atomic,
)

Mode = Literal["r", "a", "w"]
IndexLike = int | Sequence[int] | npt.NDArray[np.integer[Any]]

_PAGE = mmap.PAGESIZE
_MIN_CAPACITY = 1024
_APPEND_SLICE = 64 << 20  # source bytes compressed and written per step


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(
    method: Callable[Concatenate[RecordStore, _P], _R],
) -> Callable[Concatenate[RecordStore, _P], _R]:
    """Serialise a method that changes the handle's state, so threads may share a store."""

    def wrapper(self: RecordStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    functools.update_wrapper(wrapper, method)
    return wrapper


def default_threads() -> int:
    return len(os.sched_getaffinity(0))


class RecordStore:
    """A persistent store of byte records with batch gather straight into numpy buffers.

    Records are addressed by a dense index ``0..len(store)``; deleting swaps the last record
    into the hole. Each record is compressed on its own (``"raw"``, ``"zstd"``, or
    ``"zstd_dict"`` against a dictionary trained with `train_dict`), so random access costs
    one read and one decode per record, spread over the cores.

    >>> import tempfile, numpy as np
    >>> from chute import RecordStore
    >>> with RecordStore(tempfile.mkdtemp() + "/s.zr", mode="w") as store:
    ...     first = store.append([b"hello", b"", b"world"])
    ...     store.gather_packed([2, 0])[0].tobytes()
    b'worldhello'

    Args:
        path: the store's directory.
        mode: ``"r"`` reads an existing store and never creates or changes a file; ``"a"``
            opens for appending, creating the store if missing; ``"w"`` starts an empty
            store, replacing the records of any store at ``path``.
        codec: the default codec of `append`.
        level: zstd level; defaults to 3 for ``"zstd"`` and 19 for ``"zstd_dict"``.
        verify: check every returned record against the CRC-32C written with it.
        threads: cores used by gather and compression (default: all this process may use).
        durable: fsync between the steps of every write (survives power loss, slower).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        mode: Mode = "r",
        *,
        codec: str | fmt.Codec = "zstd",
        level: int | None = None,
        verify: bool = False,
        threads: int | None = None,
        durable: bool = False,
    ) -> None:
        if mode not in ("r", "a", "w"):
            raise ValueError(f"mode must be 'r', 'a' or 'w', got {mode!r}")
        self._path = Path(path)
        self._mode: Mode = mode
        self._writable = mode != "r"
        self._codec = fmt.parse_codec(codec)
        self._level = level
        self._verify = verify
        self._threads = threads if threads and threads > 0 else default_threads()
        self._durable = durable
        self._closed = True
        self._lock = threading.RLock()
        self._meta_fd = -1
        self._sums_fd = -1
        self._chunk_fds: list[int] = []
        self._chunk_maps: Any = None
        self._meta: mmap.mmap | None = None
        self._sums_map: mmap.mmap | None = None
        self._table = np.empty(0, fmt.LOC_DTYPE)
        self._sums: npt.NDArray[np.void] | None = None
        self._ddict: Any = None
        self._cdict: Any = None
        self._dictionary: bytes | None = None
        self._open()

    # ---- opening -------------------------------------------------------------------

    def _open(self) -> None:
        meta_path = self._path / fmt.META_FILE
        if self._mode == "w" and self._path.exists():
            self._remove_store_files()
        if not meta_path.exists():
            if self._mode == "r":
                if not self._path.exists():
                    raise StoreNotFoundError(f"no store at {self._path}: the path does not exist")
                if not self._path.is_dir():
                    raise StoreError(f"{self._path} is a file, not a store directory")
                raise StoreNotFoundError(f"{self._path} is not a Zrecord store: it has no meta.zr")
            self._create()
        flags = os.O_RDWR if self._writable else os.O_RDONLY
        self._meta_fd = os.open(meta_path, flags)
        self._closed = False
        try:
            if self._writable:
                lock_exclusive(self._meta_fd, self._path)
            self._tail_chunk, self._tail_offset, self._length = self._map_meta()
            self._open_chunks(self._tail_chunk, self._tail_offset)
            self._open_dict()
            self._open_sums()
            if self._writable:
                self._drop_uncommitted_tail()
        except BaseException:
            self.close()
            raise

    def _remove_store_files(self) -> None:
        if not self._path.is_dir():
            raise StoreError(f"{self._path} exists and is not a directory")
        for entry in self._path.iterdir():
            name = entry.name
            stem = name[:-3] if name.endswith(".zr") else ""
            if name in (fmt.META_FILE, fmt.DICT_FILE, fmt.SUMS_FILE) or stem.isdigit():
                entry.unlink()

    def _create(self) -> None:
        self._path.mkdir(parents=True, exist_ok=True)
        (self._path / fmt.chunk_file(0)).touch()
        header = fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, 0, 0, 0)
        meta = header + bytes(fmt.meta_size(_MIN_CAPACITY) - len(header))
        write_file_atomic(self._path / fmt.META_FILE, meta, durable=self._durable)

    def _read_header(self, meta: mmap.mmap | None = None) -> tuple[int, int, int]:
        m = meta if meta is not None else self._meta
        assert m is not None
        magic, version, tail_chunk, tail_offset, length = fmt.HEADER.unpack_from(m, 0)
        if magic != fmt.MAGIC:
            raise CorruptStoreError(f"{self._path} is not a Zrecord store: bad magic {magic!r}")
        if version != fmt.VERSION:
            raise StoreError(f"{self._path}: Zrecord version {version} is not supported (want 3)")
        return int(tail_chunk), int(tail_offset), int(length)

    def _map_meta(self) -> tuple[int, int, int]:
        """Map meta.zr whole and return its header state. The new table is in place before
        the old mapping goes, so threads reading the table never see it missing."""
        size = os.fstat(self._meta_fd).st_size
        if size < fmt.HEADER_SIZE:
            raise CorruptStoreError(
                f"{self._path}/meta.zr is truncated: {size} bytes, the header alone is 16"
            )
        access = mmap.ACCESS_WRITE if self._writable else mmap.ACCESS_READ
        meta = mmap.mmap(self._meta_fd, size, access=access)
        try:
            tail_chunk, tail_offset, length = self._read_header(meta)
            capacity = (size - fmt.HEADER_SIZE) // fmt.LOC_SIZE
            if length > capacity:
                raise CorruptStoreError(
                    f"{self._path}/meta.zr is truncated: header says {length} records, "
                    f"the file holds {capacity} table entries"
                )
            if tail_chunk >= fmt.MAX_CHUNKS:
                raise CorruptStoreError(f"{self._path}: tail chunk {tail_chunk} is past the limit")
        except BaseException:
            meta.close()
            raise
        old = self._meta
        self._meta = meta
        self._table = np.frombuffer(
            meta, dtype=fmt.LOC_DTYPE, count=capacity, offset=fmt.HEADER_SIZE
        )
        if old is not None:
            _release(old)
        return tail_chunk, tail_offset, length

    def _unmap_meta(self) -> None:
        self._table = np.empty(0, fmt.LOC_DTYPE)
        if self._meta is not None:
            _release(self._meta)
            self._meta = None

    def _open_chunks(self, tail_chunk: int, tail_offset: int) -> None:
        """Open chunk files up to ``tail_chunk`` and publish their readable limits, then their
        maps: a thread that sees a new length (published after this) sees both."""
        flags = os.O_RDWR if self._writable else os.O_RDONLY
        known = len(self._chunk_fds)
        while len(self._chunk_fds) <= tail_chunk:
            c = len(self._chunk_fds)
            try:
                self._chunk_fds.append(os.open(self._path / fmt.chunk_file(c), flags))
            except FileNotFoundError:
                raise CorruptStoreError(
                    f"{self._path}: chunk file {fmt.chunk_file(c)} is missing "
                    f"(the header names chunks 0..{tail_chunk})"
                ) from None
        self._limits = self._chunk_limits(tail_chunk, tail_offset)
        if self._chunk_maps is None or known != len(self._chunk_fds):
            self._chunk_maps = _native.map_chunks(self._chunk_fds)

    def _chunk_limits(self, tail_chunk: int, tail_offset: int) -> npt.NDArray[np.uint64]:
        """Bytes readable in each chunk: its file size, and in the tail, up to the frontier."""
        limits = np.empty(len(self._chunk_fds), np.uint64)
        for c, fd in enumerate(self._chunk_fds):
            limits[c] = min(os.fstat(fd).st_size, fmt.CHUNK_LIMIT)
        limits[tail_chunk] = min(int(limits[tail_chunk]), tail_offset)
        return limits

    def _open_dict(self) -> None:
        path = self._path / fmt.DICT_FILE
        if not path.exists():
            return
        data = path.read_bytes()
        try:
            self._ddict = digest_for_reading(data)
        except ValueError:
            raise CorruptStoreError(f"{path} is damaged: zstd rejects it as a dictionary") from None
        self._dictionary = data

    def _open_sums(self) -> None:
        path = self._path / fmt.SUMS_FILE
        if not path.exists():
            if not self._writable:
                if self._verify:
                    warnings.warn(
                        f"{self._path} has no checksums (written by another tool); "
                        "verify=True checks that records decode, not their bytes",
                        stacklevel=4,
                    )
                return
            header = fmt.SUMS_HEADER.pack(fmt.SUMS_MAGIC, fmt.SUMS_VERSION, *self._state())
            write_file_atomic(path, header, durable=self._durable)
        self._sums_fd = os.open(path, os.O_RDWR if self._writable else os.O_RDONLY)
        self._map_sums(len(self._table))
        if self._writable and not self._sums_in_step():
            self._resync_sums()

    def _state(self) -> tuple[int, int, int]:
        return self._tail_chunk, self._tail_offset, self._length

    def _sums_in_step(self) -> bool:
        """True when no other tool has written since the sidecar was last stamped."""
        if self._sums_map is None or self._sums is None:
            return False
        stamp = fmt.STATE.unpack_from(self._sums_map, fmt.STATE_OFFSET)
        return bool(stamp == self._state())

    def _resync_sums(self) -> None:
        """After another tool's writes (or a crash mid-commit), forget checksums whose record
        has moved, so that from here on any mismatch means damage."""
        if self._sums is None:
            return
        sums, live = self._sums[: self._length], self._table[: self._length]
        moved = (
            (sums["offset"] != live["offset"])
            | (sums["chunk_id"] != live["chunk_id"])
            | (sums["phys_length"] != live["phys_length"])
            | (sums["codec"] != live["codec"])
        )
        sums["valid"][moved] = 0
        self._stamp_sums()

    def _stamp_sums(self, in_step: bool = True) -> None:
        """Record that the sidecar matches the table (or, before a multi-step edit of both,
        that it may not, so a crash midway reads as 'unchecked' rather than damage)."""
        if self._sums_map is not None:
            state = self._state() if in_step else _NO_STATE
            fmt.STATE.pack_into(self._sums_map, fmt.STATE_OFFSET, *state)

    def _map_sums(self, capacity: int) -> None:
        size = fmt.SUMS_HEADER.size + capacity * fmt.SUMS_DTYPE.itemsize
        if self._writable and os.fstat(self._sums_fd).st_size < size:
            os.ftruncate(self._sums_fd, size)
        have = os.fstat(self._sums_fd).st_size
        self._sums = None
        if self._sums_map is not None:
            _release(self._sums_map)
            self._sums_map = None
        if have < fmt.SUMS_HEADER.size:
            return  # a damaged sidecar only costs the ability to check
        access = mmap.ACCESS_WRITE if self._writable else mmap.ACCESS_READ
        self._sums_map = mmap.mmap(self._sums_fd, have, access=access)
        magic = bytes(self._sums_map[:4])
        if magic != fmt.SUMS_MAGIC:
            return
        count = (have - fmt.SUMS_HEADER.size) // fmt.SUMS_DTYPE.itemsize
        self._sums = np.frombuffer(
            self._sums_map, dtype=fmt.SUMS_DTYPE, count=count, offset=fmt.SUMS_HEADER.size
        )

    def _drop_uncommitted_tail(self) -> None:
        """Cut what a crashed writer left past the frontier: bytes and whole chunk files."""
        fd = self._chunk_fds[self._tail_chunk]
        if os.fstat(fd).st_size > self._tail_offset:  # never extend: a short chunk is damage
            os.ftruncate(fd, self._tail_offset)
        c = self._tail_chunk + 1
        while (self._path / fmt.chunk_file(c)).exists():
            (self._path / fmt.chunk_file(c)).unlink()
            c += 1

    # ---- state ---------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def has_dict(self) -> bool:
        return self._dictionary is not None

    @property
    def has_checksums(self) -> bool:
        return self._sums is not None

    def __len__(self) -> int:
        self._check_open()
        if not self._writable:
            self.refresh()
        return self._length

    @_locked
    def refresh(self) -> int:
        """See records a writer committed since this reader opened; returns the length."""
        self._check_open()
        if self._writable:
            return self._length
        state = self._read_header()
        if state == (self._tail_chunk, self._tail_offset, self._length):
            return self._length
        tail_chunk, tail_offset, length = state
        if length > len(self._table):
            self._map_meta()
        self._open_chunks(tail_chunk, tail_offset)
        if self._sums is not None and len(self._sums) < length:
            self._map_sums(0)
        self._tail_chunk, self._tail_offset = tail_chunk, tail_offset
        self._length = length  # last: whoever sees it sees the table, limits and maps for it
        return length

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self._path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if not self._writable:
            raise StoreError(f"{self._path} is open read-only (mode='r')")

    # ---- reading -------------------------------------------------------------------

    def _as_indices(self, indices: IndexLike) -> npt.NDArray[np.int64]:
        arr = np.asarray(indices)
        if arr.dtype.kind not in "iu":  # bool is kind "b": not an index here
            if arr.size == 0:
                return np.empty(0, np.int64)
            raise TypeError(f"record indices must be integers, got {arr.dtype}")
        if arr.dtype == np.int64 and arr.ndim == 1 and arr.flags.c_contiguous:
            return arr
        return np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)

    def lengths(self, indices: IndexLike) -> npt.NDArray[np.uint32]:
        """Logical (decoded) byte size of each record."""
        self._check_open()
        idx = self._as_indices(indices)
        self._check_range(idx)
        return self._table["logic_length"][idx]

    def _check_range(self, idx: npt.NDArray[np.int64]) -> None:
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self._length):
            if not self._writable:
                self.refresh()
            bad = idx[(idx < 0) | (idx >= self._length)]
            if bad.size:
                raise IndexError(
                    f"record index {int(bad[0])} is out of range for {self._length} records"
                )

    def gather(self, indices: IndexLike, out: npt.NDArray[Any] | None = None) -> npt.NDArray[Any]:
        """Decode equal-size records into rows of ``out`` (a new (n, size) uint8 array if None).

        ``out`` may be any C-contiguous array of ``n * size`` bytes, so records land directly
        in a batch of the caller's dtype and shape.
        """
        self._check_open()
        idx = self._as_indices(indices)
        n = len(idx)
        if out is None:
            self._check_range(idx[:1])
            size = int(self._table["logic_length"][idx[0]]) if n else 0
            out = np.empty((n, size), np.uint8)
        elif not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be a writeable C-contiguous array")
        if n == 0:
            return out
        if out.nbytes % n:
            raise ValueError(f"out has {out.nbytes} bytes, not a multiple of {n} records")
        self._gather(idx, out, out.nbytes // n, None)
        return out

    def gather_packed(
        self, indices: IndexLike
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
        """Decode records of any sizes end to end: ``(values, offsets)`` with n+1 offsets."""
        self._check_open()
        idx = self._as_indices(indices)
        self._check_range(idx)
        values, offsets, _ = self._packed(idx, self._verify)
        return values, offsets

    def _packed(
        self, idx: npt.NDArray[np.int64], verify: bool
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64], int]:
        """Records end to end, their n+1 offsets, and how many had no checksum to match."""
        offsets = np.zeros(len(idx) + 1, np.uint64)
        np.cumsum(self._table["logic_length"][idx], out=offsets[1:])
        values = np.empty(int(offsets[-1]), np.uint8)
        unchecked = self._gather(idx, values, 0, offsets, verify) if len(idx) else 0
        return values, offsets, unchecked

    def gather_into(
        self,
        indices: IndexLike,
        out: npt.NDArray[Any],
        offsets: npt.NDArray[np.integer[Any]] | Sequence[int],
    ) -> npt.NDArray[Any]:
        """Decode record i to byte ``offsets[i]`` of ``out`` (C-contiguous), in one native call.

        A slot may be larger than its record (the rest is left as it was), so a padded batch
        is filled in place: fill ``out`` with the pad value, then gather into it.
        """
        self._check_open()
        idx = self._as_indices(indices)
        offs = np.ascontiguousarray(offsets, dtype=np.uint64).reshape(-1)
        if offs.size != idx.size:
            raise ValueError(f"{idx.size} indices but {offs.size} offsets")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be a writeable C-contiguous array")
        if idx.size:
            self._gather(idx, out, 0, offs)
        return out

    def _gather(
        self,
        idx: npt.NDArray[np.int64],
        dst: npt.NDArray[Any],
        stride: int,
        offsets: npt.NDArray[np.uint64] | None,
        verify: bool | None = None,
    ) -> int:
        """One native call; raises on the first bad record. Returns how many went unchecked."""
        check = self._verify if verify is None else verify
        for attempt in (0, 1):
            sums = self._sums[: self._length] if check and self._sums is not None else None
            strict = sums is not None and self._sums_in_step()
            code, pos, detail, unchecked = _native.gather(
                self._table[: self._length],
                self._limits,
                self._chunk_maps,
                idx,
                dst,
                stride,
                offsets,
                self._ddict,
                sums,
                strict,
                self._threads,
            )
            if code == 0:
                return unchecked
            if code == _GE_INDEX and attempt == 0 and not self._writable:
                self.refresh()  # a writer may have committed more since we looked
                continue
            raise self._gather_error(code, int(idx[pos]), detail, stride)
        raise AssertionError("unreachable")

    def _gather_error(self, code: int, index: int, detail: int, stride: int) -> Exception:
        if code == _GE_INDEX:
            return IndexError(f"record index {index} is out of range for {self._length} records")
        if code == _GE_NOMEM:
            return MemoryError("out of memory while gathering records")
        loc = self._table[index]
        where = f"{self._path}: record {index} (chunk {loc['chunk_id']}, offset {loc['offset']})"
        if code == _GE_DST:
            return ValueError(
                f"record {index} holds {loc['logic_length']} bytes, but its slot in the batch "
                f"is {stride} bytes: the record does not match the requested size or schema"
            )
        if code == _GE_TABLE:
            return CorruptStoreError(
                f"{where}: the table entry differs from the one written with the record's "
                "checksum: meta.zr is damaged",
                index,
            )
        if code == _GE_CHECKSUM:
            return ChecksumError(
                f"{where}: bytes differ from the checksum written with them (CRC-32C "
                f"{detail:#010x} != {int(self._sums[index]['crc']):#010x})"  # type: ignore[index]
                if self._sums is not None
                else f"{where}: checksum mismatch",
                index,
            )
        messages = {
            _GE_CHUNK: f"names chunk {detail}, but the store has {len(self._chunk_fds)} chunks",
            _GE_BOUNDS: (
                f"ends at byte {detail}, past the end of its chunk "
                f"({int(self._limits[min(int(loc['chunk_id']), len(self._limits) - 1)])} "
                "bytes): the chunk is truncated or the table is damaged"
            ),
            _GE_TOO_LARGE: f"claims {detail} bytes, over the format's 1 MiB record cap",
            _GE_CODEC: f"has unknown codec tag {detail}",
            _GE_NO_DICT: "is zstd_dict-compressed, but the store has no dict.zr",
            _GE_DECODE: "has a damaged zstd frame",
            _GE_LENGTH: (
                f"decodes to {detail} bytes, but the table says {loc['logic_length']} "
                f"(stored {loc['phys_length']})"
            ),
        }
        return CorruptStoreError(f"{where} {messages.get(code, f'failed (code {code})')}", index)

    # ---- writing -------------------------------------------------------------------

    def append(
        self,
        records: Iterable[bytes | bytearray | memoryview | npt.NDArray[Any]] | npt.NDArray[Any],
        codec: str | fmt.Codec | None = None,
    ) -> int:
        """Append records; returns the index of the first. A 2-D uint8 array is one per row."""
        self._check_writable()
        if isinstance(records, np.ndarray) and records.ndim == 2:
            rows = np.ascontiguousarray(records).view(np.uint8).reshape(len(records), -1)
            lengths = np.full(len(rows), rows.shape[1], np.uint64)
            return self.append_packed(rows.reshape(-1), lengths, codec)
        data, lengths = _concat(records)
        return self.append_packed(data, lengths, codec)

    @_locked
    def append_packed(
        self,
        data: npt.NDArray[Any],
        lengths: Sequence[int] | npt.NDArray[np.integer[Any]],
        codec: str | fmt.Codec | None = None,
    ) -> int:
        """Append records laid end to end in ``data``, record i being ``lengths[i]`` bytes."""
        self._check_writable()
        c = self._codec if codec is None else fmt.parse_codec(codec)
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lens.size and int(lens.min()) < 0:
            raise ValueError("record lengths must be non-negative")
        if lens.size and int(lens.max()) > fmt.MAX_RECORD:
            i = int(np.argmax(lens > fmt.MAX_RECORD))
            raise ValueError(
                f"record {i} is {int(lens[i])} bytes; the Zrecord format caps a record at 1 MiB"
            )
        if int(lens.sum()) != flat.size:
            raise ValueError(f"lengths add up to {int(lens.sum())} bytes, data has {flat.size}")
        if self._length + lens.size > fmt.MAX_RECORDS:
            raise StoreError(f"a store holds at most {fmt.MAX_RECORDS} records")
        if c is fmt.Codec.ZSTD_DICT and self._dictionary is None:
            raise StoreError("codec 'zstd_dict' needs a dictionary: call train_dict() first")
        first = self._length
        ends = np.cumsum(lens, dtype=np.uint64)
        starts = ends - lens.astype(np.uint64)
        i = 0
        while i < lens.size:
            j = max(i + 1, int(np.searchsorted(ends, int(starts[i]) + _APPEND_SLICE, "right")))
            self._append_slice(flat, starts[i:j], lens[i:j].astype(np.uint64), c)
            i = j
        return first

    def _level_for(self, codec: fmt.Codec) -> int:
        if self._level is not None:
            return self._level
        return fmt.ZSTD_DICT_LEVEL if codec is fmt.Codec.ZSTD_DICT else fmt.ZSTD_LEVEL

    def _append_slice(
        self,
        data: npt.NDArray[np.uint8],
        starts: npt.NDArray[np.uint64],
        lens: npt.NDArray[np.uint64],
        codec: fmt.Codec,
    ) -> None:
        n = lens.size
        phys = np.empty(n, np.uint32)
        codecs = np.empty(n, np.uint8)
        crcs = np.empty(n, np.uint32)
        if codec is fmt.Codec.ZSTD_DICT and self._cdict is None:
            assert self._dictionary is not None
            self._cdict = digest_for_writing(self._dictionary, self._level_for(codec))
        packed = _native.compress(
            data, starts, lens, int(codec), self._level_for(codec), self._cdict,
            self._threads, phys, codecs, crcs,
        )  # fmt: skip
        if packed is None:  # raw records, already end to end in the source: write it as is
            first = int(starts[0]) if n else 0
            view = data[first : first + int(lens.sum())].data
        else:
            view = memoryview(packed)
        chunk_ids, offsets, writes, end = _place(phys, self._tail_chunk, self._tail_offset)
        touched = set()
        for chunk, file_offset, a, b in writes:
            fd = self._chunk_fd_for_write(chunk)
            pwrite_all(fd, view[a:b], file_offset)
            touched.add(fd)
        if self._durable:
            for fd in touched:
                os.fdatasync(fd)
        self._ensure_capacity(self._length + n)
        rows = np.zeros(n, fmt.LOC_DTYPE)
        rows["offset"], rows["phys_length"], rows["logic_length"] = offsets, phys, lens
        rows["chunk_id"], rows["codec"] = chunk_ids, codecs
        self._table[self._length : self._length + n] = rows
        assert self._sums is not None
        sums = self._sums[self._length : self._length + n]
        sums["crc"], sums["offset"], sums["phys_length"] = crcs, offsets, phys
        sums["chunk_id"], sums["codec"], sums["valid"] = chunk_ids, codecs, 1
        self._flush_maps(self._length, n)
        self._commit(end[0], end[1], self._length + n)

    def _chunk_fd_for_write(self, chunk: int) -> int:
        while len(self._chunk_fds) <= chunk:
            c = len(self._chunk_fds)
            if c >= fmt.MAX_CHUNKS:
                raise StoreError(f"the store is full: {fmt.MAX_CHUNKS} chunks of 4 GiB")
            path = self._path / fmt.chunk_file(c)
            self._chunk_fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
            self._limits = np.append(self._limits, np.uint64(0))
            self._chunk_maps = _native.map_chunks(self._chunk_fds)
        return self._chunk_fds[chunk]

    def _ensure_capacity(self, needed: int) -> None:
        capacity = len(self._table)
        if needed <= capacity:
            return
        new = max(needed, capacity * 2, _MIN_CAPACITY)
        new = min(max(new, needed), fmt.MAX_RECORDS)
        os.ftruncate(self._meta_fd, fmt.meta_size(new))
        self._map_meta()
        self._map_sums(new)

    def _flush_maps(self, first: int, n: int) -> None:
        if not self._durable:
            return
        assert self._meta is not None and self._sums_map is not None
        _msync(self._meta, fmt.HEADER_SIZE + first * fmt.LOC_SIZE, n * fmt.LOC_SIZE)
        item = fmt.SUMS_DTYPE.itemsize
        _msync(self._sums_map, fmt.SUMS_HEADER.size + first * item, n * item)

    def _commit(self, tail_chunk: int, tail_offset: int, length: int) -> None:
        """Publish the frontier and the length in one write: the commit point."""
        assert self._meta is not None
        fmt.STATE.pack_into(self._meta, fmt.STATE_OFFSET, tail_chunk, tail_offset, length)
        if self._durable:
            self._meta.flush(0, _PAGE)
        self._limits = self._chunk_limits(tail_chunk, tail_offset)
        self._tail_chunk, self._tail_offset = tail_chunk, tail_offset
        self._length = length
        self._stamp_sums()

    @_locked
    def delete(self, indices: IndexLike) -> None:
        """Remove records, keeping the index space dense: the last record fills each hole.

        Indices of survivors may change. Duplicates and any order are accepted. Only the
        table changes; the bytes stay on disk until `compact`.
        """
        self._check_writable()
        idx = np.unique(self._as_indices(indices))
        self._check_range(idx)
        assert self._meta is not None and self._sums is not None
        self._stamp_sums(in_step=False)
        for i in idx[::-1].tolist():
            last = self._length - 1
            if i != last:
                self._table[i] = self._table[last]
                self._sums[i] = self._sums[last]
            fmt.STATE.pack_into(
                self._meta, fmt.STATE_OFFSET, self._tail_chunk, self._tail_offset, last
            )
            self._length = last
        self._stamp_sums()
        if self._durable:
            self.sync()

    @_locked
    def train_dict(
        self,
        samples: Iterable[bytes | npt.NDArray[Any]] | npt.NDArray[Any],
        dict_size: int | None = None,
    ) -> int:
        """Train the store's zstd dictionary on sample records and save it as dict.zr.

        Returns the dictionary's size. A store keeps one dictionary for life: replacing it
        would make its ``zstd_dict`` records unreadable, so a second call is an error.
        """
        self._check_writable()
        if self._dictionary is not None:
            raise StoreError(f"{self._path} already has a dictionary (dict.zr)")
        if isinstance(samples, np.ndarray) and samples.ndim == 2:
            rows = np.ascontiguousarray(samples).view(np.uint8).reshape(len(samples), -1)
            pick = rows[sample_rows(len(rows), rows.shape[1], dict_size)]
            data, lens = pick.reshape(-1), np.full(len(pick), pick.shape[1], np.uint64)
        else:
            data, lens = _concat(samples)
        dictionary = train_dictionary(data, lens, dict_size)
        write_file_atomic(self._path / fmt.DICT_FILE, dictionary, durable=True)
        self._dictionary = dictionary
        self._ddict = digest_for_reading(dictionary)
        self._cdict = None
        return len(dictionary)

    @_locked
    def compact(self) -> int:
        """Reclaim the bytes deleted records left behind, in place; returns bytes freed.

        Safe to interrupt at any point; running it again finishes the job.
        """
        self._check_writable()
        before = self._used_bytes()
        live = self._table[: self._length]
        order = np.lexsort((live["offset"], live["chunk_id"]))
        phys = live["phys_length"][order]
        new_chunk, new_off, _, end = _place(phys, 0, 0)
        old_chunk, old_off = live["chunk_id"][order], live["offset"][order]
        moved = (new_chunk != old_chunk) | (new_off != old_off)
        overlap = moved & (new_chunk == old_chunk) & (new_off.astype(np.int64) + phys > old_off)
        bounce = self._reserve_bounce(int(phys[overlap].max()) if overlap.any() else 0)
        self._stamp_sums(in_step=False)
        for k in np.flatnonzero(moved).tolist():
            self._move(int(order[k]), int(new_chunk[k]), int(new_off[k]), bool(overlap[k]), bounce)
        self.sync()
        self._commit(end[0], end[1], self._length)
        for c in range(len(self._chunk_fds) - 1, end[0], -1):
            os.close(self._chunk_fds.pop())
            (self._path / fmt.chunk_file(c)).unlink()
        # Every chunk now ends where its packed records end (earlier chunks keep the slack
        # of a record that did not fit): cut the files there.
        ends = np.zeros(end[0] + 1, np.uint64)
        np.maximum.at(ends, new_chunk, new_off.astype(np.uint64) + phys)
        ends[end[0]] = end[1]
        for c, fd in enumerate(self._chunk_fds):
            if os.fstat(fd).st_size > int(ends[c]):
                os.ftruncate(fd, int(ends[c]))
        self._chunk_maps = _native.map_chunks(self._chunk_fds)
        self._limits = self._chunk_limits(end[0], end[1])
        fsync_dir(self._path)
        return before - self._used_bytes()

    def _reserve_bounce(self, size: int) -> tuple[int, int]:
        """Commit ``size`` spare bytes past the frontier, where a record whose new place
        overlaps its old bytes waits while it moves; a fresh chunk if the last one is full.
        Returns the area's (chunk, offset)."""
        chunk, start = self._tail_chunk, self._tail_offset
        if size == 0:
            return chunk, start
        if start + size > fmt.CHUNK_LIMIT:
            chunk, start = chunk + 1, 0
            self._chunk_fd_for_write(chunk)
        os.ftruncate(self._chunk_fds[chunk], start + size)
        self._commit(chunk, start + size, self._length)
        return chunk, start

    def _move(
        self, index: int, chunk: int, offset: int, overlap: bool, bounce: tuple[int, int]
    ) -> None:
        loc = self._table[index]
        size, old_chunk, old_off = int(loc["phys_length"]), int(loc["chunk_id"]), int(loc["offset"])
        try:
            data = pread_exact(self._chunk_fds[old_chunk], size, old_off)
        except EOFError:
            raise CorruptStoreError(
                f"{self._path}: record {index} lies past the end of chunk {old_chunk}", index
            ) from None
        if overlap:
            pwrite_all(self._chunk_fds[bounce[0]], data, bounce[1])
            self._relocate(index, *bounce)
        pwrite_all(self._chunk_fds[chunk], data, offset)
        self._relocate(index, chunk, offset)

    def _relocate(self, index: int, chunk: int, offset: int) -> None:
        sums, table = self._sums, self._table
        assert sums is not None
        if sums["valid"][index] and _same_place(sums[index], table[index]):
            sums["chunk_id"][index], sums["offset"][index] = chunk, offset
        table["chunk_id"][index], table["offset"][index] = chunk, offset

    def _used_bytes(self) -> int:
        return sum(int(x) for x in self._limits)

    def stats(self) -> dict[str, Any]:
        """Record count, bytes live vs. bytes in chunk files, and records per codec."""
        self._check_open()
        live = self._table[: len(self)]
        counts = np.bincount(live["codec"], minlength=3)
        live_bytes = int(live["phys_length"].sum(dtype=np.uint64))
        logical = int(live["logic_length"].sum(dtype=np.uint64))
        chunk_bytes = self._used_bytes()
        return {
            "records": int(self._length),
            "live_bytes": live_bytes,
            "logical_bytes": logical,
            "chunk_bytes": chunk_bytes,
            "reclaimable": chunk_bytes - live_bytes,
            "chunks": self._tail_chunk + 1,
            "codecs": {fmt.codec_name(c): int(counts[c]) for c in fmt.Codec},
            "other_codecs": int(counts[3:].sum()),
            "ratio": logical / live_bytes if live_bytes else 1.0,
            "has_dict": self.has_dict,
            "has_checksums": self.has_checksums,
        }

    def verify(self, batch: int = 4096) -> dict[str, Any]:
        """Decode every record and check its checksum; report, rather than raise, damage."""
        self._check_open()
        damaged: list[tuple[int, str]] = []
        unchecked = 0
        n = len(self)
        start = 0
        while start < n:
            idx = np.arange(start, min(start + batch, n), dtype=np.int64)
            try:
                unchecked += self._packed(idx, True)[2]
                start = int(idx[-1]) + 1
            except CorruptStoreError as e:
                if e.index is None:
                    raise
                damaged.append((e.index, str(e)))
                unchecked += self._packed(idx[: e.index - start], True)[2]  # those before it
                start = e.index + 1
        if self._sums is None:
            unchecked = n
        return {"records": n, "damaged": damaged, "unchecked": unchecked}

    # ---- lifetime ------------------------------------------------------------------

    def sync(self) -> None:
        """Make everything written so far durable (fsync data, table, checksums)."""
        self._check_open()
        for fd in self._chunk_fds:
            if self._writable:
                os.fdatasync(fd)
        if self._writable and self._meta is not None:
            self._meta.flush()
            if self._sums_map is not None:
                self._sums_map.flush()

    @_locked
    def close(self) -> None:
        """Release files and mappings; the store can no longer be used. Idempotent."""
        self._closed = True
        self._sums = None
        self._ddict = self._cdict = self._chunk_maps = None
        if self._sums_map is not None:
            _release(self._sums_map)
            self._sums_map = None
        self._unmap_meta()
        for fd in (*self._chunk_fds, self._sums_fd, self._meta_fd):
            if fd >= 0:
                os.close(fd)
        self._chunk_fds = []
        self._sums_fd = self._meta_fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._length} records"
        return f"RecordStore({str(self._path)!r}, mode={self._mode!r}, {state})"


_NO_STATE = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)  # matches no real header

# Error codes of chute._native.gather (gather.h).
(
    _GE_INDEX, _GE_CHUNK, _GE_BOUNDS, _GE_TOO_LARGE, _GE_CODEC, _GE_NO_DICT,
    _GE_DECODE, _GE_LENGTH, _GE_DST, _GE_CHECKSUM, _GE_NOMEM, _GE_TABLE,
) = range(1, 13)  # fmt: skip


def _place(
    phys: npt.NDArray[np.uint32], chunk: int, offset: int
) -> tuple[
    npt.NDArray[np.uint16],
    npt.NDArray[np.uint32],
    list[tuple[int, int, int, int]],
    tuple[int, int],
]:
    """Lay records of the given sizes densely from (chunk, offset), rolling to a fresh chunk
    when one would cross the 4 GiB limit. Returns per-record chunk ids and offsets, the
    contiguous runs to write as (chunk, file offset, start, end) into the packed bytes, and
    the new frontier."""
    n = phys.size
    chunk_ids = np.empty(n, np.uint16)
    offsets = np.empty(n, np.uint32)
    runs: list[tuple[int, int, int, int]] = []
    i = pos = 0
    while i < n:
        cum = np.cumsum(phys[i:], dtype=np.uint64)
        fit = int(np.searchsorted(cum + np.uint64(offset), fmt.CHUNK_LIMIT, side="right"))
        if fit == 0:
            chunk, offset = chunk + 1, 0
            if chunk >= fmt.MAX_CHUNKS:
                raise StoreError(f"the store is full: {fmt.MAX_CHUNKS} chunks of 4 GiB")
            continue
        offsets[i] = offset
        offsets[i + 1 : i + fit] = offset + cum[: fit - 1]
        chunk_ids[i : i + fit] = chunk
        size = int(cum[fit - 1])
        runs.append((chunk, offset, pos, pos + size))
        pos += size
        offset += size
        i += fit
    return chunk_ids, offsets, runs, (chunk, offset)


def _concat(
    records: Iterable[bytes | bytearray | memoryview | npt.NDArray[Any]],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
    """Lay byte-like records end to end; returns the bytes and each record's length."""
    parts = [
        np.ascontiguousarray(r).reshape(-1).view(np.uint8)
        if isinstance(r, np.ndarray)
        else np.frombuffer(r, np.uint8)
        for r in records
    ]
    lengths = np.array([p.size for p in parts], np.uint64)
    return (np.concatenate(parts) if parts else np.empty(0, np.uint8)), lengths


def _same_place(s: np.void, loc: np.void) -> bool:
    return bool(
        s["chunk_id"] == loc["chunk_id"]
        and s["offset"] == loc["offset"]
        and s["phys_length"] == loc["phys_length"]
        and s["codec"] == loc["codec"]
    )


def _release(m: mmap.mmap) -> None:
    """Unmap now, or, while a view (say, in a traceback) still holds it, when that view dies."""
    with contextlib.suppress(BufferError):
        m.close()


def _msync(m: mmap.mmap, start: int, size: int) -> None:
    if size <= 0:
        return
    first = start - start % _PAGE
    m.flush(first, start + size - first)
