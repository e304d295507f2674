"""ShardedStore: many record stores read as one, behind the same read calls as RecordStore.

A global index maps to (shard, local index) through the manifest's shard starts. A batch over
local shards is one native call across their stores, straight into the caller's buffer in the
caller's order; shards in object storage are split by shard and read in one round of
requests. Shards open on first use: a host reading one slice opens only the shards it lies in.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from chute._native import gather_many, shard_split
from chute._objects import in_batch, local_path, reads_remotely
from chute._util.checks import check_optional_int
from chute._util.closing import Closing
from chute._util.cores import usable_cores
from chute._util.renamed import call_threads, legacy_arguments
from chute._util.waiting import wait_all
from chute.datasets._folders import Folder, RemoteFolder, open_folder
from chute.datasets._readahead import ShardsAhead
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import Manifest, is_sharded
from chute.datasets._source import RecordSource
from chute.errors import (
    ChuteError,
    CorruptStoreError,
    RemoteError,
    StoreChangedError,
    StoreClosedError,
)
from chute.store import RecordStore
from chute.store._internal import (
    IndexLike,
    InPlace,
    PartReport,
    RemoteStore,
    VerifyReport,
    as_indices,
    check_in_place,
    check_indices,
    check_out,
    gather_shards,
    out_stride,
)

_Part = tuple[int, RecordStore, npt.NDArray[np.intp], npt.NDArray[np.int64]]
_Split = Iterator[_Part]
_T = TypeVar("_T")


class ShardedStore(Closing):
    """A read-only sharded dataset's records: a `RecordSource` (``len``, ``gather``,
    ``gather_packed``, ``gather_into``, ``lengths``, ``stats``, ``verify``) over the global
    index space, with the same signatures and reports as `chute.RecordStore`.

    ``opened_shards`` and ``gathers`` tell which shards were opened and how many native
    gathers each served (how a multi-host run checks it reads only its own shards).

    >>> import tempfile, numpy as np, chute
    >>> path = tempfile.mkdtemp() + "/d"
    >>> ds = chute.write_dataset(path, np.arange(10, dtype=np.int32), shard_records=4)
    >>> ds[[9, 0, 5]].tolist(), ds.store.opened_shards
    ([9, 0, 5], (0, 1, 2))
    """

    @legacy_arguments(renamed={"threads": "num_threads"})
    def __init__(
        self,
        path: Any,
        *,
        verify: bool = False,
        num_threads: int | None = None,
        **store_options: Any,
    ) -> None:
        self._setup(open_folder(path, store_options, "ShardedStore"), verify, num_threads)

    @classmethod
    def over(cls, folder: Folder, *, verify: bool, num_threads: int | None) -> ShardedStore:
        """The dataset in ``folder`` (opened already: a URL's is read to tell what it holds)."""
        store = object.__new__(cls)
        store._setup(folder, verify, num_threads)
        return store

    def _setup(self, folder: Folder, verify: bool, num_threads: int | None) -> None:
        self._dir = folder
        self._path = folder.path
        self._closed = True
        try:
            self._manifest = folder.manifest()
        except BaseException:
            folder.close()
            raise
        self._starts = self._manifest.starts()
        self._length = int(self._starts[-1])
        self._verify = verify
        threads = check_optional_int("num_threads", num_threads, minimum=1)
        self._threads = threads or usable_cores()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = 0
        self._stores: list[RecordStore | None] = [None] * len(self._manifest.shards)
        self._placed: list[InPlace | None] = [None] * len(self._stores)  # see `_views`
        # each opened shard's record size when all its records have one (else -1): a batch
        # of that size then needs no per-batch size check before its gather
        self._uniform = np.full(len(self._stores), -1, np.int64)
        self._gathers = np.zeros(len(self._stores), np.int64)
        self._lock = threading.Lock()
        self._opening: dict[int, Future[RecordStore]] = {}  # by whichever thread came first
        self._ahead = ShardsAhead()
        self._closed = False

    @property
    def path(self) -> Path | str:
        """The dataset's folder, or its URL."""
        return self._path

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def schema(self) -> RecordSchema:
        return self._manifest.schema

    @property
    def supports_writes(self) -> bool:
        """False: a sharded dataset is written by `chute.write_dataset` and `append_*`."""
        return False

    @property
    def supports_growth(self) -> bool:
        """False: the manifest read at opening fixes the length (reopen to see appends)."""
        return False

    @property
    def shard_lengths(self) -> npt.NDArray[np.int64]:
        """Records per shard, in index order (a fresh array)."""
        return np.diff(self._starts)

    @property
    def opened_shards(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self._stores) if s is not None)

    @property
    def gathers(self) -> tuple[int, ...]:
        """Native gathers per shard since opening."""
        return tuple(int(n) for n in self._gathers)

    @property
    def has_checksums(self) -> bool:
        self._open_shards(range(len(self._stores)))
        return all(self.shard(i).has_checksums for i in range(len(self._stores)))

    def __len__(self) -> int:
        self._check_open()
        self._check_changed()
        return self._length

    def shard(self, i: int) -> RecordStore:
        """Shard ``i`` opened read-only (on first use, checked against the manifest). A shard
        another thread is opening (a readahead, say) is waited for, not opened twice."""
        self._check_open()
        store = self._stores[i]
        if store is not None:
            return store
        with self._lock:
            store = self._stores[i]
            if store is not None:
                return store
            opening = self._opening.get(i)
            if opening is None:
                mine: Future[RecordStore] = Future()
                self._opening[i] = mine
        if opening is not None:
            try:
                return opening.result()
            except Exception:  # that thread's failure: this one tries for itself
                return self.shard(i)
        try:
            opened = self._guarded(lambda: self._open_shard(i))
        except BaseException as error:
            with self._lock:
                del self._opening[i]
            mine.set_exception(error)
            raise
        with self._lock:  # opened outside the lock, so shards open side by side
            del self._opening[i]
            keep = not self._closed
            if keep:
                self._stores[i] = opened
        if not keep:  # the dataset closed meanwhile
            opened.close()
            closed = StoreClosedError(f"the dataset at {self._path} is closed")
            mine.set_exception(closed)
            raise closed
        mine.set_result(opened)
        return opened

    def readahead(self, indices: IndexLike) -> bool:
        """Start opening, on a background thread, the shards a later gather of ``indices``
        reads, where the dataset is in object storage (their tables, checksums and chunk
        sizes: the round trips a first read of a shard waits for); returns at once. Indices
        out of range are left to that gather to report, and so is a shard that fails to
        open. Returns whether reading ahead does anything here (not for local shards).

        >>> import tempfile, numpy as np, chute
        >>> ds = chute.write_dataset(tempfile.mkdtemp() + "/d", np.arange(8), shard_records=4)
        >>> ds.store.readahead([5, 6]), ds.store.opened_shards
        (False, ())
        """
        if self._dir.fanout <= 1:
            return False
        if self._closed:
            return True
        idx = np.asarray(indices).reshape(-1)
        if idx.dtype.kind not in "iu":
            return True
        idx = idx[(idx >= 0) & (idx < self._length)]
        shards = set((np.searchsorted(self._starts, idx, side="right") - 1).tolist())
        self._ahead.start((s for s in shards if self._stores[s] is None), self.shard, self._dir.map)
        return True

    def _open_shards(self, shards: Iterable[int]) -> None:
        """Open the shards of ``shards`` not open yet, side by side where the folder reads
        over the network (a batch may touch many shards never read before)."""
        todo = [s for s in shards if self._stores[s] is None]
        if len(todo) > 1:
            self._dir.map(self.shard, todo)

    def _open_shard(self, i: int) -> RecordStore:
        name, want = self._manifest.shards[i]
        store = self._dir.open_shard(
            name, self._manifest.schema, verify=self._verify, num_threads=self._threads
        )
        have = len(store)
        # The last shard may hold more: an append committed records to it and stopped before
        # the manifest (the commit point) was rewritten. Those records are not the dataset's.
        if have < want or (have > want and i != len(self._stores) - 1):
            store.close()
            raise CorruptStoreError(
                f"{store.path} holds {have} records, the manifest says {want}: the dataset is "
                "damaged or was changed by hand"
            )
        self._uniform[i] = _uniform_size(store, want)
        return store

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"the dataset at {self._path} is closed")

    def _check_changed(self) -> None:
        if self._dir.changed():
            raise StoreChangedError(
                f"{self._path} was overwritten since this reader opened it (its shards may "
                "hold another dataset now): reopen the dataset"
            )

    def _guarded(self, read: Callable[[], _T]) -> _T:
        """``read()`` between two checks of the dataset's generation, so an overwrite before
        or during it is `StoreChangedError` (also where it made ``read`` fail), never a mix
        of the old dataset's records and the new one's."""
        self._check_changed()
        try:
            result = read()
        except Exception:
            self._check_changed()
            raise
        self._check_changed()
        return result

    def _as_indices(self, indices: IndexLike) -> npt.NDArray[np.int64]:
        return check_indices(as_indices(indices), self._length, negative=False)

    def _split(self, idx: npt.NDArray[np.int64]) -> _Split:
        """Per touched shard: its number, store, the batch positions it fills, local indices."""
        self._check_open()
        if idx.size == 0:
            return
        shard = np.searchsorted(self._starts, idx, side="right") - 1
        first, last = int(shard.min()), int(shard.max())
        try:
            if first != last:
                self._open_shards(np.unique(shard).tolist())
            else:
                only = self.shard(first)
        except RemoteError as e:  # say which read met it, as a failed fetch does
            raise in_batch(e, f"opening the shards of record {int(idx[0])}") from None
        if first == last:
            yield first, only, np.arange(idx.size), idx - self._starts[first]
            return
        order = np.argsort(shard, kind="stable")
        edges = np.searchsorted(shard[order], np.arange(first, last + 2))
        for s in range(first, last + 1):
            pos = order[edges[s - first] : edges[s - first + 1]]
            if pos.size:
                yield s, self.shard(s), pos, idx[pos] - self._starts[s]

    def _counted(self, shards: Any) -> None:
        with self._lock:
            self._gathers[shards] += 1  # one more native gather each served

    def lengths(self, indices: IndexLike) -> npt.NDArray[np.uint32]:
        """Logical (decoded) byte size of each record."""
        idx = self._as_indices(indices)
        out = np.empty(idx.size, np.uint32)

        def read() -> npt.NDArray[np.uint32]:
            for _, store, pos, local in self._split(idx):
                out[pos] = store.lengths(local)
            return out

        return self._guarded(read)

    def gather(
        self,
        indices: IndexLike,
        out: npt.NDArray[Any] | None = None,
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> npt.NDArray[Any]:
        """Decode equal-size records into the rows of ``out`` (C-contiguous, n rows; a new
        (n, size) uint8 array if None) on ``num_threads`` cores (default: the handle's)."""
        cores = call_threads("ShardedStore.gather", num_threads, threads, self._threads)
        idx = self._as_indices(indices)
        if out is None:
            size = int(self.lengths(idx[:1])[0]) if idx.size else 0
            out = np.empty((idx.size, size), np.uint8)
        check_out(out)
        if idx.size == 0:
            return out
        stride = out_stride(out, idx.size)
        dst = out
        self._guarded(lambda: self._gather(idx, dst, stride, cores))
        return out

    def _gather(
        self, idx: npt.NDArray[np.int64], out: npt.NDArray[Any], stride: int, threads: int
    ) -> None:
        if self._gather_in_place(idx, out, stride, None, threads):
            return
        parts = list(self._split(idx))
        if len(parts) == 1:  # one shard: the plain gather, which checks every size itself
            self._counted(parts[0][0])
            parts[0][1].gather(parts[0][3], out, num_threads=threads)
            return
        for s, store, pos, local in parts:  # every size checked before any byte is written
            sizes = store.lengths(local) if self._uniform[s] != stride else None
            if sizes is not None and (sizes != stride).any():
                k = int(np.argmax(sizes != stride))
                with contextlib.suppress(ValueError):  # damage is named as such
                    store.gather(local[k : k + 1], np.empty(stride, np.uint8))
                raise ValueError(
                    f"record {int(idx[pos[k]])} holds {int(sizes[k])} bytes, but its slot in "
                    f"the batch is {stride} bytes: the record does not match the requested size "
                    "or schema"
                )
        self._run(parts, out, lambda pos: pos.astype(np.uint64) * np.uint64(stride), threads)

    def gather_packed(
        self,
        indices: IndexLike,
        *,
        num_threads: int | None = None,
        threads: int | None = None,
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
        """Decode records of any sizes end to end: ``(values, offsets)`` with n+1 offsets."""
        cores = call_threads("ShardedStore.gather_packed", num_threads, threads, self._threads)
        idx = self._as_indices(indices)
        offsets = np.zeros(idx.size + 1, np.uint64)
        np.cumsum(self.lengths(idx), out=offsets[1:])
        values = np.empty(int(offsets[-1]), np.uint8)
        self.gather_into(idx, values, offsets[:-1], num_threads=cores)
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
        """Decode record i to byte ``offsets[i]`` of ``out`` on ``num_threads`` cores in all
        (default: the handle's): one native call for local shards, one round of requests for
        shards in object storage."""
        cores = call_threads("ShardedStore.gather_into", num_threads, threads, self._threads)
        idx = self._as_indices(indices)
        offs = np.ascontiguousarray(offsets, dtype=np.uint64).reshape(-1)
        if offs.size != idx.size:
            raise ValueError(f"{idx.size} indices but {offs.size} offsets")

        def read() -> None:
            if not self._gather_in_place(idx, out, 0, offs, cores):
                self._run(list(self._split(idx)), out, offs.__getitem__, cores)

        self._guarded(read)
        return out

    def _run(
        self,
        parts: list[_Part],
        out: npt.NDArray[Any],
        offsets: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.uint64]],
        threads: int,
    ) -> None:
        """Each part's records decoded to ``offsets(positions)`` of ``out``: shards in object
        storage in one round of requests (`gather_shards`) unless warm (all blocks cached:
        read as local ones); the others' native calls side by side on up to ``threads``
        threads, each on its share of the cores. Waits for all before raising the first."""
        self._counted([s for s, *_ in parts])
        cold: list[_Part] = []
        rest: list[_Part] = []
        for part in parts:
            remote = isinstance(part[1], RemoteStore) and not part[1].is_warm()
            (cold if remote else rest).append(part)
        if cold:
            fetched = [(cast(RemoteStore, store), local, offsets(pos))
                       for _, store, pos, local in cold]  # fmt: skip
            gather_shards(fetched, out, num_threads=threads)
        parts = rest
        if not parts:
            return
        groups = min(threads, self._threads, len(parts))
        share = max(1, threads // max(groups, 1))
        if groups <= 1:
            for _, store, pos, local in parts:
                store.gather_into(local, out, offsets(pos), num_threads=threads)
            return

        def run(group: list[_Part]) -> None:
            for _, store, pos, local in group:
                store.gather_into(local, out, offsets(pos), num_threads=share)

        pool = self._pool()
        futures = [pool.submit(run, parts[k::groups]) for k in range(1, groups)]
        wait_all([lambda: run(parts[0::groups]), *(f.result for f in futures)])

    def _gather_in_place(
        self,
        idx: npt.NDArray[np.int64],
        out: npt.NDArray[Any],
        stride: int,
        offsets: npt.NDArray[np.uint64] | None,
        threads: int,
    ) -> bool:
        """Records ``idx`` into ``out`` (record i at ``i * stride``, its size, or at
        ``offsets[i]``) in one native call across the local shards they touch: the cores
        split the whole batch. False where a shard is not local or the call failed: the
        per-shard path then reads again and raises what it meets (naming the record)."""
        self._check_open()
        if idx.size < 2:
            return False
        which = np.empty(idx.size, np.int32)  # each index's shard, as its place in `views`
        local = np.empty(idx.size, np.int64)
        numbers = shard_split(self._starts, idx, which, local)
        try:  # raised here: the per-shard path would open them again, on a second budget
            views = self._views(numbers)
        except RemoteError as e:
            raise in_batch(e, f"opening the shards of record {int(idx[0])}") from None
        if views is None:
            return False
        wheres = [view.where for view in views]
        try:
            code = gather_many(wheres, which, local, out, stride, offsets, threads)[0]
        except (TypeError, ValueError):  # out refused: the per-shard path says why
            return False
        try:
            check_in_place(views)
        except ValueError:  # a shard's own store closed since (its gen.chute map with it)
            return False  # the per-shard path raises that store's StoreClosedError
        self._counted(numbers)
        return code == 0

    def _views(self, numbers: list[int]) -> list[InPlace] | None:
        """Shards ``numbers`` as the compiled core reads them where they lie: each made on
        the shard's first such read and kept (what keeps a changed shard from being read is
        the check of its generation after every read, `check_in_place`, not a fresh
        snapshot); None where one is not local (the per-shard path reads those)."""
        placed = self._placed
        views = [placed[s] for s in numbers]
        if None not in views:
            return cast(list[InPlace], views)
        self._open_shards(numbers)
        for s in numbers:
            if placed[s] is None:
                view = self.shard(s).in_place()
                if view is None:
                    return None
                placed[s] = view
        return [cast(InPlace, placed[s]) for s in numbers]

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            # a forked child (a torch DataLoader worker, say) inherits the executor but not
            # its threads: it starts its own
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor = ThreadPoolExecutor(
                    max(self._threads, self._dir.fanout) - 1, thread_name_prefix="chute-shards"
                )
                self._executor_pid = os.getpid()
            return self._executor

    def stats(self) -> dict[str, Any]:
        """The shards' `RecordStore.stats` summed, plus ``shards``: each one's own."""
        self._open_shards(range(len(self._stores)))
        per = self._guarded(lambda: [self.shard(i).stats() for i in range(len(self._stores))])
        summed = ("live_bytes", "logical_bytes", "chunk_bytes", "reclaimable", "short_bytes")
        total: dict[str, Any] = {key: sum(s[key] for s in per) for key in (*summed, "chunks")}
        total["records"] = self._length
        total["codecs"] = {
            name: sum(s["codecs"][name] for s in per) for name in (per[0]["codecs"] if per else {})
        }
        total["ratio"] = (
            total["logical_bytes"] / total["live_bytes"] if total["live_bytes"] else 1.0
        )
        total["has_dict"] = any(s["has_dict"] for s in per)
        total["has_checksums"] = all(s["has_checksums"] for s in per)
        total["shards"] = per
        return total

    def verify(
        self, batch: int = 4096, progress: Callable[[int, int], None] | None = None
    ) -> VerifyReport:
        """Every shard's `RecordStore.verify`, damaged records named by global index; a
        shard that cannot be verified at all (missing, of another length than the manifest
        says, its checksums lost) is reported among ``parts`` as ``"unreadable"``, and the
        others are still checked. ``progress(done, total)`` gets the decoded bytes so far."""
        self._check_open()
        parts: list[PartReport] = []
        report: VerifyReport = {
            "records": self._length, "checked": 0, "unchecked": 0, "damaged": [], "parts": parts
        }  # fmt: skip
        base = [0]  # bytes of the shards already verified: one count over the dataset

        def moved(done: int, total: int) -> None:
            if progress is not None:
                progress(base[0] + done, base[0] + total)

        for i, (name, n) in enumerate(self._manifest.shards):
            first = int(self._starts[i])
            part: PartReport = {
                "name": name, "first": first, "records": n, "state": "ok", "message": None
            }  # fmt: skip
            parts.append(part)
            self._check_changed()
            try:
                store = self.shard(i)
                one = store.verify(batch, progress=moved)
                base[0] += int(store.stats()["logical_bytes"])
            except (StoreChangedError, StoreClosedError):
                raise
            except ChuteError as e:
                part["state"], part["message"] = "unreadable", str(e)
                continue
            report["damaged"] += [(first + local, message) for local, message in one["damaged"]]
            report["checked"] += one["checked"]
            report["unchecked"] += one["unchecked"]
            if one["damaged"]:
                part["state"] = "damaged"
        self._check_changed()
        return report

    def close(self) -> None:
        """Close every opened shard; idempotent."""
        with self._lock:
            self._closed = True
        if self._executor is not None and self._executor_pid == os.getpid():
            self._executor.shutdown(wait=True)
        self._executor = None
        self._ahead.stop()  # a shard it opens now is closed at once (shard() sees _closed)
        self._placed = [None] * len(self._stores)  # their maps go with the stores
        for store in self._stores:
            if store is not None:
                store.close()
        self._dir.close()

    def __repr__(self) -> str:
        return (
            f"ShardedStore({str(self._path)!r}, records={self._length}, shards={len(self._stores)})"
        )


def open_source(path: Any, **store_options: Any) -> RecordSource:
    """The records at ``path`` (a folder or a URL), read-only: a sharded dataset's shards, or
    one store."""
    if not reads_remotely(path):
        return ShardedStore(path) if is_sharded(local_path(path)) else RecordStore(path, mode="r")
    folder = RemoteFolder.open(path, store_options, "open_source")
    if folder.sharded:
        return ShardedStore.over(folder, verify=False, num_threads=None)
    return folder.store(verify=False, num_threads=None)


def _uniform_size(store: RecordStore, n: int, step: int = 1 << 20) -> int:
    """The one decoded size of records ``0..n`` of ``store``, or -1 if they differ."""
    size = -1
    for start in range(0, n, step):
        sizes = store.lengths(np.arange(start, min(start + step, n)))
        if size < 0:
            size = int(sizes[0])
        if (sizes != size).any():
            return -1
    return size
