"""RecordStore: the public front of a Zrecord store directory.

Reading runs over an immutable `Snapshot` (`_files`, `_read`); writing, locking and the
crash-safety order live in `_write`. This class checks arguments, picks the snapshot, and
turns native failures into exceptions.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt

from chute._native import codes
from chute._objects import local_path, reads_remotely
from chute._util.checks import check_optional_int
from chute._util.closing import Closing
from chute._util.cores import usable_cores
from chute._util.fs import lock_shared_wait, unlock
from chute._util.renamed import call_threads, legacy_arguments
from chute._util.safe_open import open_regular
from chute.errors import (
    CorruptStoreError,
    StoreChangedError,
    StoreClosedError,
    StoreError,
    StoreNotFoundError,
)
from chute.store import _format as fmt
from chute.store import _read
from chute.store._bytes import bytes_of, concat, record_lengths
from chute.store._codec import sample_rows
from chute.store._files import Snapshot, StoreFiles, empty_snapshot
from chute.store._index import IndexLike, as_indices, flat_int64
from chute.store._opening import open_for_writing
from chute.store._out import out_stride
from chute.store._read import InPlace, VerifyReport
from chute.store._write import APPEND_SLICE, Writer

Mode = Literal["r", "a", "w"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


def _locked(
    method: Callable[Concatenate[RecordStore, _P], _R],
) -> Callable[Concatenate[RecordStore, _P], _R]:
    """Serialise a method that changes the handle's state, so threads may share a store."""

    def wrapper(self: RecordStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    functools.update_wrapper(wrapper, method)
    return wrapper


class RecordStore(Closing):
    """A persistent store of byte records with batch gather straight into numpy buffers.

    Records are addressed by a dense index ``0..len(store)``; deleting swaps the last record
    into the hole. Each record is compressed on its own (``"raw"``, ``"zstd"``, or
    ``"zstd_dict"`` against a dictionary trained with `train_dict`), so random access costs
    one read and one decode per record, spread over the cores.

    A reader sees records appended since it opened after `refresh` (or ``len``). After a
    `delete`, `compact` or a ``mode="w"`` reset by any chute writer, a reader opened before
    it raises `StoreChangedError` on its next read: reopen it (see docs/store.md).

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
            store, replacing the records of any store at ``path`` (after taking the lock).
        codec: the default codec of `append`.
        level: zstd level; defaults to 3 for ``"zstd"`` and 19 for ``"zstd_dict"``.
        verify: check every returned record against the CRC-32C written with it.
        num_threads: cores used by gather and compression (default: all this process may
            use); each read method takes its own ``num_threads=`` for one call.
        durable: fsync between the steps of every write (survives power loss, slower).
    """

    _remote: type[RecordStore] | None = None  # the class that reads a store at a URL

    def __init_subclass__(cls, *, remote: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if remote:
            RecordStore._remote = cls

    def __new__(cls, path: Any = None, *args: Any, **kwargs: Any) -> RecordStore:
        """A store at a URL (or an obstore store) is read by the remote store class
        (`chute.store._remote.RemoteStore`, a subclass), so ``RecordStore(url)`` opens one."""
        if cls is RecordStore and cls._remote is not None and reads_remotely(path):
            return super().__new__(cls._remote)
        return super().__new__(cls)

    @legacy_arguments(renamed={"threads": "num_threads"})
    def __init__(
        self,
        path: str | os.PathLike[str],
        mode: Mode = "r",
        *,
        codec: str | fmt.Codec = "zstd",
        level: int | None = None,
        verify: bool = False,
        num_threads: int | None = None,
        durable: bool = False,
    ) -> None:
        if mode not in ("r", "a", "w"):
            raise ValueError(f"mode must be 'r', 'a' or 'w', got {mode!r}")
        self._path = Path(local_path(path))
        self._mode: Mode = mode
        self._writable = mode != "r"
        self._codec = fmt.parse_codec(codec)
        self._level = _check_level(level)
        self._verify = verify
        self._threads = check_optional_int("num_threads", num_threads, minimum=1) or usable_cores()
        self._durable = durable
        self._closed = True
        self._lock = threading.RLock()
        self._writer: Writer | None = None
        self._snap = empty_snapshot()
        # the current snapshot's in_place(), made on its first use
        self._in_place: tuple[Snapshot | None, InPlace | None] = (None, None)
        if self._writable:
            self._files = open_for_writing(self._path, reset=mode == "w", durable=durable)
            self._closed = False
            try:
                self._writer = Writer(self._files, durable=durable, threads=self._threads)
            except BaseException:
                self.close()
                raise
            self._snap = self._writer.snap
        else:
            self._files = StoreFiles(self._path, writable=False)
            self._snap = self._open_reader()

    def _open_reader(self) -> Snapshot:
        path, files = self._path, self._files
        meta = path / fmt.META_FILE
        try:
            files.meta_fd = open_regular(meta, path)  # a FIFO would hang; a link out
        except FileNotFoundError:
            if not path.exists():
                raise StoreNotFoundError(f"no store at {path}: the path does not exist") from None
            if not path.is_dir():
                raise StoreError(f"{path} is a file, not a store directory") from None
            raise StoreNotFoundError(f"{path} is not a Zrecord store: it has no meta.zr") from None
        except NotADirectoryError:
            raise StoreError(f"{path} is a file, not a store directory") from None
        self._closed = False
        try:
            guarded = files.open_gen()
            if guarded:  # a delete or compaction in progress finishes before we look
                lock_shared_wait(files.gen_fd)
            try:
                generation = files.generation()
                state = files.map_meta()
                files.open_chunks(state[0])
                files.open_dict()
                if not files.open_sums() and self._verify:
                    self._check_sums_lost()
                    warnings.warn(
                        f"{path} has no checksums (written by another tool); "
                        "verify=True checks that records decode, not their bytes",
                        stacklevel=4,
                    )
                return files.snapshot(state, generation)
            finally:
                if guarded:
                    unlock(files.gen_fd)
        except BaseException:
            self.close()
            raise

    def _check_sums_lost(self) -> None:
        """A store chute wrote always has its checksums: without them it is damaged, not
        a store another tool wrote, and checking it is impossible, so it is an error."""
        lost = self._files.lost_sums()
        if lost is not None:
            raise CorruptStoreError(
                f"{lost}: the records' checksums are lost, so they cannot be verified "
                "(open without verify=True to read them unchecked)"
            )

    # ---- state ---------------------------------------------------------------------

    @property
    def path(self) -> Path | str:
        """The store's folder (a `Path`), or its URL for a store in object storage."""
        return self._path

    @property
    def writable(self) -> bool:
        return self._writable

    @property
    def supports_writes(self) -> bool:
        """Whether records can be appended or deleted through this handle (``mode`` not ``"r"``)."""
        return self._writable

    @property
    def supports_growth(self) -> bool:
        """True: the length may grow while open (a reader sees a writer's appends)."""
        return True

    @property
    def has_dict(self) -> bool:
        return self._files.dictionary is not None

    @property
    def has_checksums(self) -> bool:
        return self._files.sums is not None

    def __len__(self) -> int:
        self._check_open()
        if not self._writable:
            return self.refresh()
        return self._current().length

    def _current(self) -> Snapshot:
        return self._writer.snap if self._writer is not None else self._snap

    @_locked
    def refresh(self) -> int:
        """See records a writer committed since this reader opened; returns the length.

        Raises `StoreChangedError` once a delete, compaction or reset changed the store.
        """
        self._check_open()
        snap = self._current()
        if self._writable:
            return snap.length
        self._check_generation(snap)
        state = self._files.read_state()
        if state != snap.state:
            if self._files.dictionary is None:  # trained since we opened?
                self._files.open_dict()
            self._files.open_chunks(state[0])
            new = self._files.snapshot(state, snap.generation)
            self._check_generation(new)  # the state may be a delete's, half done
            self._snap = new
        return self._snap.length

    def _check_generation(self, snap: Snapshot) -> None:
        if self._files.generation() != snap.generation:
            raise StoreChangedError(
                f"{self._path} was changed by a delete, compaction or reset since this handle "
                "read it (its records may have moved or gone): reopen the store"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self._path} is closed")

    def _check_writable(self) -> Writer:
        self._check_open()
        if self._writer is None:
            raise StoreError(f"{self._path} is open read-only (mode='r')")
        return self._writer

    # ---- reading -------------------------------------------------------------------

    def _as_indices(self, indices: IndexLike) -> npt.NDArray[np.int64]:
        """Flat int64 indices; their range is checked against the snapshot each read uses."""
        return flat_int64(as_indices(indices))

    def _read(self, idx: npt.NDArray[np.int64], stride: int, read: Callable[[Snapshot], _T]) -> _T:
        """Run ``read`` over the current snapshot, checking the generation before and after.

        A reader retries once, against a fresh snapshot, when an index is past its length
        (a writer may have committed more) or the bytes looked damaged (a torn view of a
        commit would look so); a second failure is reported.
        """
        self._check_open()
        for attempt in (0, 1):
            snap = self._current()
            self._check_generation(snap)
            try:
                result = read(snap)
            except _read.GatherFailed as failed:
                self._check_generation(snap)
                retry = failed.code == codes.GE_INDEX or failed.code in _read.DAMAGE
                if attempt == 0 and retry and not self._writable:
                    self.refresh()
                    continue
                raise _read.error_for(snap, self._path, failed, idx, stride) from None
            self._check_generation(snap)
            return result
        raise AssertionError("unreachable")

    def _decode(
        self,
        snap: Snapshot,
        idx: npt.NDArray[np.int64],
        dst: Any,
        stride: int,
        offsets: npt.NDArray[np.uint64] | None,
        *,
        verify: bool,
        threads: int,
    ) -> int:
        """The one native gather of the read methods (`_read.gather` over the mapped chunks);
        a store in object storage fetches the records first."""
        return _read.gather(snap, idx, dst, stride, offsets, verify=verify, threads=threads)

    def in_place(self) -> InPlace | None:
        """The current snapshot as the compiled core reads it, for its readers beyond the
        gather family (the token reader): ``where`` is ``(table, limits, chunks, ddict, sums
        or None, strict)``; call ``check()`` after reading (a delete, compaction or reset
        since the snapshot, before or during the read, is `StoreChangedError`). None where
        the records are not mapped here. Made once per snapshot."""
        self._check_open()
        snap = self._current()
        made_for, made = self._in_place
        if made_for is not snap or made is None:
            where = _read.native_store(snap, self._verify)
            gen = self._files.gen_map  # None: no gen.chute yet, check() looks for it each time
            made = InPlace(where, self._threads, functools.partial(self._check_generation, snap),
                           None if gen is None else (gen, snap.generation))  # fmt: skip
            self._in_place = (snap, made)
        return made

    def lengths(self, indices: IndexLike) -> npt.NDArray[np.uint32]:
        """Logical (decoded) byte size of each record."""
        idx = self._as_indices(indices)

        def read(snap: Snapshot) -> npt.NDArray[np.uint32]:
            _read.check_range(snap, idx)
            return snap.table["logic_length"][idx]

        return self._read(idx, 0, read)

    def gather(
        self,
        indices: IndexLike,
        out: npt.NDArray[Any] | None = None,
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> npt.NDArray[Any]:
        """Decode equal-size records into rows of ``out`` (a new (n, size) uint8 array if None)
        on ``num_threads`` cores (default: the handle's).

        ``out`` may be any writeable C-contiguous array of a plain dtype (no Python objects)
        holding ``n * size`` bytes, so records land directly in a batch of the caller's dtype
        and shape.
        """
        cores = call_threads("RecordStore.gather", num_threads, threads, self._threads)
        self._check_open()
        idx = self._as_indices(indices)
        n = len(idx)
        if out is None:
            size = int(self.lengths(idx[:1])[0]) if n else 0
            out = np.empty((n, size), np.uint8)
        if n == 0:
            return out
        stride = out_stride(out, n)
        dst = out
        self._read(
            idx, stride,
            lambda s: self._decode(s, idx, dst, stride, None, verify=self._verify,
                                   threads=cores),
        )  # fmt: skip
        return out

    def gather_packed(
        self,
        indices: IndexLike,
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
        """Decode records of any sizes end to end: ``(values, offsets)`` with n+1 offsets."""
        cores = call_threads("RecordStore.gather_packed", num_threads, threads, self._threads)
        idx = self._as_indices(indices)
        values, offsets, _ = self._read(
            idx,
            0,
            lambda s: _read.packed(s, idx, verify=self._verify, threads=cores, decode=self._decode),
        )
        return values, offsets

    def gather_into(
        self,
        indices: IndexLike,
        out: npt.NDArray[Any],
        offsets: npt.NDArray[np.integer[Any]] | Sequence[int],
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> npt.NDArray[Any]:
        """Decode record i to byte ``offsets[i]`` of ``out`` (C-contiguous, plain dtype), in
        one native call on ``num_threads`` cores (default: the handle's).

        A slot may be larger than its record (the rest is left as it was), so a padded batch
        is filled in place: fill ``out`` with the pad value, then gather into it.
        """
        cores = call_threads("RecordStore.gather_into", num_threads, threads, self._threads)
        self._check_open()
        idx = self._as_indices(indices)
        offs = np.ascontiguousarray(offsets, dtype=np.uint64).reshape(-1)
        if offs.size != idx.size:
            raise ValueError(f"{idx.size} indices but {offs.size} offsets")
        if idx.size:
            self._read(
                idx, 0,
                lambda s: self._decode(s, idx, out, 0, offs, verify=self._verify,
                                       threads=cores),
            )  # fmt: skip
        return out

    def stats(self) -> dict[str, Any]:
        """Record count, bytes live vs. bytes in chunk files, records per codec, and the
        bytes on disk (``table_bytes``, ``checksum_bytes``, and ``disk_bytes`` for every
        file of the store)."""
        self._check_open()
        if not self._writable:
            self.refresh()
        report = _read.stats(
            self._current(), has_dict=self.has_dict, has_checksums=self.has_checksums
        )
        return {**report, **self._files.disk_usage()}

    def verify(
        self, batch: int = 4096, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Decode every record and check its checksum; report, rather than raise, damage.

        Returns a `VerifyReport`: ``records``, ``checked`` (decoded and matched a checksum),
        ``unchecked`` (decoded, no checksum to match: written by another tool) and
        ``damaged``, a list of ``(index, message)``; the three counts add up to ``records``.
        A store chute wrote whose checksum sidecar is damaged or gone raises
        `CorruptStoreError`. ``progress(done, total)``, if given, gets the decoded bytes
        after every step of about 16 MiB.
        """
        self._check_open()
        if not self._writable:
            self.refresh()
        self._check_sums_lost()
        snap = self._current()
        self._check_generation(snap)
        report = _read.verify(
            snap, self._path, batch=batch, threads=self._threads, progress=progress
        )
        self._check_generation(snap)
        return report

    # ---- writing -------------------------------------------------------------------

    def append(
        self,
        records: Iterable[bytes | bytearray | memoryview | npt.NDArray[Any]] | npt.NDArray[Any],
        codec: str | fmt.Codec | None = None,
    ) -> int:
        """Append records; returns the index of the first. A 2-D uint8 array is one per row."""
        self._check_writable()
        if isinstance(records, np.ndarray) and records.ndim == 2:
            rows = bytes_of(records).reshape(len(records), -1)
            lengths = np.full(len(rows), rows.shape[1], np.uint64)
            return self.append_packed(rows.reshape(-1), lengths, codec)
        data, lengths = concat(records)
        return self.append_packed(data, lengths, codec)

    @_locked
    def append_packed(
        self,
        data: npt.NDArray[Any],
        lengths: Sequence[int] | npt.NDArray[np.integer[Any]],
        codec: str | fmt.Codec | None = None,
    ) -> int:
        """Append records laid end to end in ``data``, record i being ``lengths[i]`` bytes."""
        writer = self._check_writable()
        c = self._codec if codec is None else fmt.parse_codec(codec)
        flat = bytes_of(data)
        lens = record_lengths(lengths)
        if int(lens.sum()) != flat.size:
            raise ValueError(f"lengths add up to {int(lens.sum())} bytes, data has {flat.size}")
        if writer.length + lens.size > fmt.MAX_RECORDS:
            raise StoreError(f"a store holds at most {fmt.MAX_RECORDS} records")
        if c is fmt.Codec.ZSTD_DICT and not self.has_dict:
            raise StoreError("codec 'zstd_dict' needs a dictionary: call train_dict() first")
        first = writer.length
        ends = np.cumsum(lens, dtype=np.uint64)
        starts = ends - lens.astype(np.uint64)
        level = self._level_for(c)
        i = 0
        while i < lens.size:
            j = max(i + 1, int(np.searchsorted(ends, int(starts[i]) + APPEND_SLICE, "right")))
            writer.append_slice(flat, starts[i:j], lens[i:j].astype(np.uint64), c, level)
            i = j
        return first

    def _level_for(self, codec: fmt.Codec) -> int:
        if self._level is not None:
            return self._level
        return fmt.ZSTD_DICT_LEVEL if codec is fmt.Codec.ZSTD_DICT else fmt.ZSTD_LEVEL

    @_locked
    def delete(self, indices: IndexLike) -> None:
        """Remove records, keeping the index space dense: the last record fills each hole.

        Indices of survivors may change. Duplicates and any order are accepted. Only the
        table changes; the bytes stay on disk until `compact`. Readers opened before raise
        `StoreChangedError` on their next read.
        """
        writer = self._check_writable()
        idx = np.unique(self._as_indices(indices))
        try:
            _read.check_range(writer.snap, idx)
        except _read.GatherFailed as failed:
            raise _read.error_for(writer.snap, self._path, failed, idx, 0) from None
        writer.delete(idx)

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
        writer = self._check_writable()
        if isinstance(samples, np.ndarray) and samples.ndim == 2:
            rows = bytes_of(samples).reshape(len(samples), -1)
            pick = rows[sample_rows(len(rows), rows.shape[1], dict_size)]
            data, lens = pick.reshape(-1), np.full(len(pick), pick.shape[1], np.uint64)
        else:
            data, lens = concat(samples)
        return writer.train_dict(data, lens, dict_size)

    @_locked
    def compact(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Reclaim the bytes deleted records left behind; returns bytes freed.

        Safe to interrupt at any point; running it again finishes the job. Files are cut by
        renaming fresh copies over them, so open readers never lose a mapped page; they
        raise `StoreChangedError` on their next read. ``progress(done, total)``, if given,
        gets bytes moved and copied about every 4 MiB.
        """
        return self._check_writable().compact(progress)

    # ---- lifetime ------------------------------------------------------------------

    def sync(self) -> None:
        """Make everything written so far durable (fsync data, table, checksums)."""
        self._check_open()
        if self._writer is not None:
            self._writer.sync()

    @_locked
    def close(self) -> None:
        """Release files and mappings; the store can no longer be used. Idempotent."""
        self._closed = True
        self._writer = None
        self._snap = empty_snapshot()  # let go of the mappings, so they unmap now
        self._files.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._current().length} records"
        return f"RecordStore({str(self._path)!r}, mode={self._mode!r}, {state})"


def _check_level(level: int | None) -> int | None:
    low, high = codes.ZSTD_MIN_LEVEL, codes.ZSTD_MAX_LEVEL
    if level is None:
        return None
    if (
        isinstance(level, bool)
        or not isinstance(level, int | np.integer)
        or not low <= level <= high
    ):
        raise ValueError(f"level must be an integer zstd level from {low} to {high}, got {level!r}")
    return int(level)
