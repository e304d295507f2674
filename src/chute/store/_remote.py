"""RemoteStore: a Zrecord store in object storage (or on a web server), read-only.

At open it reads the table, the checksum sidecar, the dictionary and the generation (the
small files together, in one round trip where they fit), and checks them as a local reader
does, with the same helpers (`_files`). A chunk object is HEADed on first use, and its size and
ETag are kept: every later read of it asks for that version (``If-Match``), so bytes of a
changed object are never decoded against the table read at open.

A batch becomes one ranged GET per record, merged with its neighbours and issued side by side
(`chute._objects.ObjectReader.read_spans`, the one place record bytes are fetched), and is
decoded by the compiled core where the bytes landed (`chute.store._fetched`), with every
check it makes over mapped files. A dataset's shards share one reader, so a batch across
many shards is one round of requests too (`decode_shards`).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from chute import _native
from chute._objects import ObjectInfo, ObjectReader, in_batch, open_reader
from chute._util.checks import check_optional_int
from chute._util.cores import usable_cores
from chute._util.renamed import legacy_arguments
from chute.errors import (
    CorruptStoreError,
    RemoteChangedError,
    RemoteError,
    RemoteNotFoundError,
    StoreClosedError,
    StoreError,
    UnsafeFileError,
)
from chute.store import _fetched, _read
from chute.store import _format as fmt
from chute.store._files import (
    Snapshot,
    check_header,
    chunk_limits,
    empty_snapshot,
    generation_of,
    load_dict,
    lost_sums,
    parse_sums,
)
from chute.store._read import InPlace, VerifyReport
from chute.store._store import Mode, RecordStore
from chute.store._warm import Warmth

#: What one GET fetches of the table and the sidecar at open: their header and the entries
#: of up to 4095 records, so a small store opens in one round trip.
FIRST_READ = 64 << 10

#: An object read at open: its info and first bytes, or None where there is none.
Found = tuple[ObjectInfo, bytes] | None

_KEYWORDS = ("mode", "codec", "level", "verify", "num_threads", "durable")


class RemoteStore(RecordStore, remote=True):
    """A read-only Zrecord store at a URL: ``s3://``, ``gs://``, ``az://``, ``http(s)://``,
    or an obstore store instance. ``RecordStore(url)`` opens one; the read methods take
    and return what a local `RecordStore`'s do, with the same errors, and a request that
    fails for good is a `RemoteError` naming the URL.

    >>> import os, tempfile, obstore
    >>> from obstore.store import MemoryStore
    >>> from chute import RecordStore
    >>> local = tempfile.mkdtemp() + "/s.zr"
    >>> with RecordStore(local, mode="w") as store:
    ...     _ = store.append([b"hello", b"", b"world"])
    >>> bucket = MemoryStore()
    >>> for name in sorted(os.listdir(local)):
    ...     _ = obstore.put(bucket, name, open(os.path.join(local, name), "rb").read())
    >>> with RecordStore(bucket, verify=True) as remote:
    ...     type(remote).__name__, remote.gather_packed([2, 0])[0].tobytes()
    ('RemoteStore', b'worldhello')

    Args:
        path: the store's URL, or an obstore store rooted at it.
        mode: ``"r"`` only: a store in object storage is written by `chute.write_dataset`.
        verify: check every record fetched against the CRC-32C written with it.
        num_threads: cores used to decode (default: all this process may use).
        max_in_flight: requests in flight at once.
        cache_dir, cache_bytes: a local block cache shared by the host's processes (see
            `chute._objects.open_reader`); in ``store_options``.
        store_options: the store's options (``region=``, ``endpoint=`` ...), see
            `chute._objects.open_location`; a misspelt one is a ``TypeError``.
    """

    @legacy_arguments(renamed={"threads": "num_threads"})
    def __init__(
        self,
        path: Any,
        mode: Mode = "r",
        *,
        codec: str | fmt.Codec = "zstd",
        level: int | None = None,
        verify: bool = False,
        num_threads: int | None = None,
        durable: bool = False,
        max_in_flight: int = 16,
        **store_options: Any,
    ) -> None:
        self._closed = True
        url = path if isinstance(path, str) else repr(path)
        if mode != "r":
            raise StoreError(
                f"{url} is in object storage: a store there opens read-only (mode='r'); "
                "write datasets there with chute.write_dataset"
            )
        fmt.parse_codec(codec)
        options = {**store_options, "max_in_flight": max_in_flight}
        reader = open_reader(path, options, "RecordStore", _KEYWORDS)
        self._setup(reader, "", verify, num_threads, owns_reader=True)

    @classmethod
    def inside(
        cls,
        reader: ObjectReader,
        prefix: str,
        *,
        verify: bool,
        num_threads: int | None,
        owns_reader: bool = False,
        along: Sequence[tuple[str, int]] = (),
        check: Callable[[list[Found]], None] | None = None,
    ) -> RemoteStore:
        """The store at ``prefix`` (``"part-00000.zr"``, or ``""`` for the location itself)
        of ``reader``'s location, read through that reader (the shards of one dataset share
        its requests in flight); closing the store closes the reader if it ``owns_reader``.
        The objects ``along`` (``(path, bytes)`` from the location's root) are read in the
        store's own first round trip and handed to ``check``, which may refuse the store by
        raising (a dataset checks that a shard still belongs to it, at no extra round)."""
        store = object.__new__(cls)
        store._closed = True
        store._setup(reader, prefix, verify, num_threads, owns_reader, along, check)
        return store

    def _setup(
        self,
        reader: ObjectReader,
        prefix: str,
        verify: bool,
        num_threads: int | None,
        owns_reader: bool,
        along: Sequence[tuple[str, int]] = (),
        check: Callable[[list[Found]], None] | None = None,
    ) -> None:
        self._reader = reader
        self._owns_reader = owns_reader
        self._prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self._url = reader.url(prefix.strip("/")) if self._prefix else reader.location.url
        self._mode = "r"
        self._writable = False
        self._verify = verify
        self._threads = check_optional_int("num_threads", num_threads, minimum=1) or usable_cores()
        self._lock = threading.RLock()
        self._writer = None
        self._snap = empty_snapshot()
        self._chunks: list[ObjectInfo | None] = []
        self._seen = np.zeros(0, bool)  # which of _chunks are known (a fast look per batch)
        self._meta: ObjectInfo | None = None
        self._sizes: dict[str, int] = {}
        self._lost: str | None = None
        self._dictionary: bool | None = None  # None: not looked for (no record needs it)
        self._warmth = Warmth(reader)
        self._closed = False
        try:
            self._snap = self._open(along, check)
        except BaseException:
            self.close()
            raise

    # ---- opening -------------------------------------------------------------------

    def _open(
        self, along: Sequence[tuple[str, int]], check: Callable[[list[Found]], None] | None
    ) -> Snapshot:
        """Read and check meta.zr and the sidecar, with chunk 0 HEADed and ``along`` read in
        the same round trip (most stores have that one chunk alone); then, only where needed,
        the dictionary (some record is stored against it) and the generation (the sidecar is
        missing: gen.chute tells damage from a store another tool wrote)."""
        where = str(self._url)
        names = (fmt.META_FILE, fmt.SUMS_FILE)
        found, (first_chunk,) = self._reader.starts_and_heads(
            [*((self._prefix + name, FIRST_READ) for name in names), *along],
            [self._prefix + fmt.chunk_file(0)],
            missing_ok=True,
        )
        (meta, sums), others = found[:2], found[2:]
        if check is not None:
            check(others)
        for (info, _), name in ((f, n) for f, n in zip(found, names, strict=False) if f):
            self._sizes[name] = info.size
        if meta is None:
            raise self._not_found()
        info, head = meta
        self._meta = info
        if len(head) < fmt.HEADER_SIZE:
            raise CorruptStoreError(
                f"{where}/meta.zr is truncated: {len(head)} bytes, the header alone is 16"
            )
        capacity = (info.size - fmt.HEADER_SIZE) // fmt.LOC_SIZE
        tail_chunk, tail_offset, length = state = check_header(where, _aligned(head), capacity)
        table = self._rest(info, head, fmt.HEADER_SIZE + length * fmt.LOC_SIZE)
        entries = np.frombuffer(table, fmt.LOC_DTYPE, count=length, offset=fmt.HEADER_SIZE)
        table_sums, strict = None, False
        if sums is not None:
            want = fmt.SUMS_HEADER.size + length * fmt.SUMS_DTYPE.itemsize
            raw = self._rest(sums[0], sums[1], want) if len(sums[1]) >= 16 else sums[1]
            table_sums = parse_sums(raw)
            strict = table_sums is not None and _native.load_state(_aligned(raw)) == state
        dict_used = bool(np.any(entries["codec"] == fmt.Codec.ZSTD_DICT))
        ddict, gen = self._dictionary_and_generation(dict_used, gen=sums is None)
        if table_sums is None:
            self._lost = lost_sums(where, sums is not None, gen is not None)
            if self._verify:
                self._check_sums_lost()
                warnings.warn(
                    f"{where} has no checksums (written by another tool); "
                    "verify=True checks that records decode, not their bytes",
                    stacklevel=5,
                )
        self._chunks = [None] * (tail_chunk + 1)
        self._seen = np.zeros(tail_chunk + 1, bool)
        snap = Snapshot(
            table=entries, tail_chunk=tail_chunk, tail_offset=tail_offset,
            limits=np.zeros(tail_chunk + 1, np.uint64), maps=None, sums=table_sums,
            strict=strict, ddict=ddict, generation=generation_of(gen),
        )  # fmt: skip
        if first_chunk is not None:
            self._chunks[0] = first_chunk
            self._seen[0] = True
            self._set_limits(snap)
        return snap

    def _dictionary_and_generation(
        self, dictionary: bool, *, gen: bool
    ) -> tuple[Any, bytes | None]:
        """The dictionary, loaded and checked (None when ``dictionary`` is False or there is
        none), and gen.chute's first bytes (None unless ``gen``, or when there is none), in
        one round trip: only what was asked for is requested."""
        names = [(fmt.DICT_FILE, fmt.MAX_DICT + 1), (fmt.DICT_SUM_FILE, fmt.DICT_SUM.size)]
        items = (names if dictionary else []) + ([(fmt.GEN_FILE, fmt.GEN_HEADER.size)] * gen)
        if not items:
            return None, None
        found = self._reader.read_starts(
            [(self._prefix + name, n) for name, n in items], missing_ok=True
        )
        last = found.pop() if gen else None
        generation = None if last is None else last[1]
        if last is not None:
            self._sizes[fmt.GEN_FILE] = last[0].size
        if not dictionary:
            return None, generation
        data, stamp = found
        self._dictionary = data is not None
        for name, item in ((fmt.DICT_FILE, data), (fmt.DICT_SUM_FILE, stamp)):
            if item is not None:
                self._sizes[name] = item[0].size
        if data is None:
            return None, generation
        if data[0].size > fmt.MAX_DICT:
            raise UnsafeFileError(
                f"{self._url}/{fmt.DICT_FILE} holds more than the {fmt.MAX_DICT} bytes its "
                "format allows"
            )
        return load_dict(str(self._url), data[1], stamp[1] if stamp else None), generation

    def _rest(self, info: ObjectInfo, start: bytes, size: int) -> bytes:
        """The first ``size`` bytes of an object whose first bytes ``start`` were read (the
        rest fetched at the version read then); what the object holds, if less."""
        size = min(size, info.size)
        if len(start) >= size:
            return start[:size]
        return start + bytes(self._reader.read_ranges(info, [(len(start), size)])[0])

    def _not_found(self) -> Exception:
        return RemoteNotFoundError(
            f"no store at {self._url}: it has no {fmt.META_FILE} (not a Zrecord store, "
            "or a wrong URL)"
        )

    def _check_sums_lost(self) -> None:
        if self._lost is not None:
            raise CorruptStoreError(
                f"{self._lost}: the records' checksums are lost, so they cannot be verified "
                "(open without verify=True to read them unchecked)"
            )

    def _chunk_infos(self, chunks: npt.NDArray[np.int64], snap: Snapshot) -> None:
        """HEAD the chunk objects of ``chunks`` not seen yet, side by side with meta.zr: a
        table rewritten since open would not describe the chunk objects now there, so that is
        a `RemoteChangedError`. Each chunk's size and ETag are kept, and its readable limit
        put in the snapshot."""
        with self._lock:
            todo = [c for c in sorted(set(chunks.tolist())) if self._chunks[c] is None]
            if not todo:
                return
            paths = [self._prefix + fmt.chunk_file(c) for c in todo]
            meta, *infos = self._reader.head_all(
                [self._prefix + fmt.META_FILE, *paths], missing_ok=True
            )
            if meta != self._meta:
                now = "gone" if meta is None else f"now ETag {meta.etag}, {meta.size} bytes"
                raise RemoteChangedError(
                    f"{self._url}/{fmt.META_FILE} changed since the store was opened ({now}): "
                    "reopen it"
                )
            for c, info in zip(todo, infos, strict=True):
                if info is None:
                    raise CorruptStoreError(
                        f"{self._url}: chunk object {fmt.chunk_file(c)} is missing "
                        f"(the header names chunks 0..{snap.tail_chunk})"
                    )
                self._chunks[c] = info
                self._seen[c] = True
            self._set_limits(snap)

    def _set_limits(self, snap: Snapshot) -> None:
        """Each chunk's readable limit, from the sizes of the chunk objects seen so far."""
        sizes = [0 if info is None else info.size for info in self._chunks]
        snap.limits[:] = chunk_limits(sizes, snap.tail_chunk, snap.tail_offset)

    # ---- state ---------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The store's URL."""
        return self._url

    @property
    def supports_growth(self) -> bool:
        """False: the table read at open fixes the length (reopen to see appends)."""
        return False

    @property
    def has_dict(self) -> bool:
        """Whether the store has a dictionary (looked for on first ask, when no record
        needed it at open)."""
        if self._dictionary is None:
            self._check_open()
            self._dictionary_and_generation(True, gen=False)
        return bool(self._dictionary)

    @property
    def has_checksums(self) -> bool:
        return self._snap.sums is not None

    @property
    def requests(self) -> int:
        """Requests made through this store's reader so far (shared by a dataset's shards)."""
        return self._reader.requests

    def refresh(self) -> int:
        """The length (a store in object storage is read as it was at open)."""
        self._check_open()
        return self._snap.length

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the store at {self._url} is closed")

    def _check_writable(self) -> Any:
        self._check_open()
        raise StoreError(
            f"{self._url} is in object storage and open read-only: write datasets there "
            "with chute.write_dataset"
        )

    def _read(
        self, idx: npt.NDArray[np.int64], stride: int, read: Callable[[Snapshot], Any]
    ) -> Any:
        self._check_open()
        snap = self._snap
        try:
            return read(snap)
        except _read.GatherFailed as failed:
            raise _read.error_for(snap, self._url, failed, idx, stride) from None
        except RemoteError as e:
            if not idx.size:
                raise
            raise in_batch(e, f"reading record {int(idx[0])}") from None

    # ---- reading -------------------------------------------------------------------

    def _entries(
        self, snap: Snapshot, idx: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.void], npt.NDArray[np.int64]]:
        """The table entries of the records of ``idx`` (in range, or `GatherFailed`) and the
        readable size of the chunk each names (-1 for a chunk the header does not name);
        chunks not seen yet are HEADed first."""
        _read.check_range(snap, idx)
        locs = snap.table[idx]
        chunk = locs["chunk_id"]
        n = len(self._chunks)
        if len(chunk) and int(chunk.max()) < n:
            if not self._seen[chunk].all():
                self._chunk_infos(chunk, snap)
            return locs, snap.limits[chunk].astype(np.int64)
        known = chunk < n
        if known.any():
            self._chunk_infos(chunk[known], snap)
        limit = np.full(len(idx), -1, np.int64)
        limit[known] = snap.limits[chunk[known]]
        return locs, limit

    def in_place(self) -> InPlace | None:
        """None: the records are fetched per read, not mapped here."""
        return None

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
        """The records decoded from the warm snapshot (`chute.store._warm`) or fetched
        (`chute.store._fetched`); returns how many had no checksum to match."""
        warm = self._warmth.snapshot(self._snap, self._chunks) if snap is self._snap else None
        if warm is not None:
            return _read.gather(warm, idx, dst, stride, offsets, verify=verify, threads=threads)
        if offsets is None:
            offsets = np.arange(len(idx), dtype=np.uint64) * np.uint64(stride)
        try:
            return _fetched.decode(
                [_fetched.Part(self, snap, idx, offsets)], dst, stride, verify=verify,
                threads=threads,
            )  # fmt: skip
        except _fetched.PartFailed as failed:
            raise failed.failed from None

    def is_warm(self) -> bool:
        """Whether every block of the store's chunks is in the block cache, so a batch reads
        as from a local store (see `chute.store._warm`)."""
        return not self._closed and self._warmth.snapshot(self._snap, self._chunks) is not None

    def stats(self) -> dict[str, Any]:
        """`RecordStore.stats`, with ``disk_bytes`` the bytes of the store's objects (every
        chunk object is HEADed for it)."""
        self._check_open()
        snap = self._snap
        self._chunk_infos(np.arange(len(self._chunks)), snap)
        names = (fmt.DICT_FILE, fmt.DICT_SUM_FILE, fmt.GEN_FILE)
        small = [n for n in names if n not in self._sizes]  # not read at open
        infos = self._reader.head_all([self._prefix + n for n in small], missing_ok=True)
        for name, info in zip(small, infos, strict=True):
            if info is not None:
                self._sizes[name] = info.size
        report = _read.stats(snap, has_dict=self.has_dict, has_checksums=self.has_checksums)
        chunks = sum(info.size for info in self._chunks if info is not None)
        return {
            **report,
            "table_bytes": self._sizes.get(fmt.META_FILE, 0),
            "checksum_bytes": self._sizes.get(fmt.SUMS_FILE, 0),
            "disk_bytes": chunks + sum(self._sizes.values()),
        }

    def verify(
        self, batch: int = 4096, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Fetch and decode every record and check its checksum (see `RecordStore.verify`)."""
        self._check_open()
        self._check_sums_lost()
        snap = self._snap
        return _read.verify(
            snap, self._url, batch=batch, threads=self._threads, progress=progress,
            decode=self._decode,
        )  # fmt: skip

    # ---- lifetime ------------------------------------------------------------------

    def close(self, *, wait: bool = True) -> None:
        """Let go of the table and, if this store opened it, its reader (``wait``: for its
        requests in flight). Idempotent."""
        with self._lock:
            self._closed = True
            self._snap = empty_snapshot()
            if hasattr(self, "_warmth"):
                self._warmth.close()
            if getattr(self, "_owns_reader", False):
                self._reader.close(wait=wait)

    def __del__(self) -> None:
        # the collector may run this on any thread, a reader's own included: never wait there
        if not getattr(self, "_closed", True):
            self.close(wait=False)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self._snap.length} records"
        return f"RemoteStore({str(self._url)!r}, {state})"


def gather_shards(
    parts: Sequence[tuple[RemoteStore, npt.NDArray[np.int64], npt.NDArray[np.uint64]]],
    out: Any,
    *,
    num_threads: int,
) -> None:
    """`RecordStore.gather_into` of each ``(store, indices, offsets)`` of ``parts``, the
    stores being shards of one dataset that share its reader: the records of them all are
    fetched in one round of requests and decoded together, so a batch across many shards
    costs about what a batch of one store does. A bad record is the error its store's own
    gather would raise."""
    stores = [store for store, _, _ in parts]
    for store in stores:
        store._check_open()
    snaps = [store._snap for store in stores]
    try:
        _fetched.decode(
            [_fetched.Part(store, snap, idx, offsets)
             for (store, idx, offsets), snap in zip(parts, snaps, strict=True)],
            out, 0, verify=stores[0]._verify, threads=num_threads,
        )  # fmt: skip
    except _fetched.PartFailed as failed:
        k = failed.part
        raise _read.error_for(snaps[k], stores[k]._url, failed.failed, parts[k][1], 0) from None
    except RemoteError as e:
        raise in_batch(e, f"reading record {int(parts[0][1][0])} of {stores[0]._url}") from None


def _aligned(data: bytes) -> npt.NDArray[np.uint8]:
    """The first 16 bytes of ``data`` in an 8-byte aligned buffer (the core reads a header's
    state as one aligned word)."""
    out = np.zeros(2, np.uint64).view(np.uint8)
    out[: min(16, len(data))] = np.frombuffer(data[:16], np.uint8)
    return out
