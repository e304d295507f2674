"""The scheduler: one event loop, one ``max_inflight`` read budget, decode on a thread pool.

A pass walks its slabs in first-use order, admitting each into the pool (a hit just pins
it), reads the stored chunks of the misses under the shared budget, and assembles batches
in order as their slabs arrive. Batches are gathered on a thread of their own, so a batch
whose slabs are ready never queues behind the reads of later windows.
"""

from __future__ import annotations

import asyncio
import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import zarr
from zarr.abc.store import Store

from ._buffers import BatchBuffers
from ._decode import DirectReader, reserve_read_buffer
from ._files import local_root, stored_limit
from ._geometry import ArrayGeometry
from ._options import chunk_stamp
from ._plan import SlabUse
from ._pool import ChunkPool, Slab, SlabKey
from ._reader import OnBadChunk, SlabReader
from ._shared import SharedChunks
from ._transforms import (
    Batch,
    BatchTransform,
    ChunkTransform,
    run_batch_transform,
    run_chunk_transform,
)

END = object()  # end-of-pass marker on the batch queue
CLOSED_DURING_PASS = "the dataset was closed during this pass"


Stage = Literal["decode", "queue", "transform", "gather", "slab_wait", "admit_wait"]


class StageTimes:
    """Seconds spent per stage, summed over threads, and the waits of the batch pass
    (for ``describe``, which names the limiting stage from them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.decode = 0.0  # decompression; a chunk read through zarr counts whole here
        self.queue = 0.0  # read jobs waiting for a free decode thread
        self.transform = 0.0  # chunk transforms
        self.gather = 0.0  # batch assembly and batch transforms
        self.slab_wait = 0.0  # the pass waiting for the slabs of its next batch
        self.admit_wait = 0.0  # the pass waiting for its slabs to get room in the pool

    def add(self, stage: Stage, seconds: float) -> None:
        with self._lock:
            setattr(self, stage, getattr(self, stage) + seconds)


@dataclass
class PassPlan:
    """What one pass over a split must yield."""

    order: np.ndarray
    batch_size: int
    uses: dict[str, SlabUse]
    start_batch: int = 0

    @property
    def n_batches(self) -> int:
        return math.ceil(len(self.order) / self.batch_size)


@dataclass
class _Progress:
    batch: int
    registered: int = -1  # every slab first needed at or before this batch is admitted
    slabs: dict[tuple[str, int], Slab] = field(default_factory=dict)


class Engine:
    """Owns the event loop thread, the decode pool, the read budget and the opened arrays."""

    def __init__(
        self,
        store: Store,
        geometries: dict[str, ArrayGeometry],
        pool: ChunkPool,
        *,
        max_inflight: int,
        decode_threads: int,
        batches_held: int,
        chunk_transforms: Sequence[ChunkTransform],
        batch_transforms: Sequence[BatchTransform],
        on_bad_chunk: OnBadChunk,
        shared: SharedChunks | None = None,
    ) -> None:
        self.geometries = geometries
        self.shared = shared
        self._root = local_root(store)  # a local archive's folder: its chunk files are stamped
        self._chunk_keys: dict[SlabKey, list[str]] = {}  # the stored chunks of each slab
        self.decodes = 0  # slabs this process read and decoded
        self.shared_hits = 0  # slabs mapped from the on-disk pool, decoded by another process
        self.pool = pool
        self.max_inflight = max_inflight
        self.decode_threads = decode_threads
        self.chunk_transforms = tuple(chunk_transforms)
        self.batch_transforms = tuple(batch_transforms)
        self.on_bad_chunk = on_bad_chunk
        self.times = StageTimes()
        self._executor = ThreadPoolExecutor(decode_threads, thread_name_prefix="chute-insitu")
        self._gatherer = ThreadPoolExecutor(1, thread_name_prefix="chute-insitu-gather")
        self._outputs = BatchBuffers(batches_held * len(geometries))
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(self._executor)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="chute-insitu-loop", daemon=True
        )
        self._thread.start()
        self._tasks: set[asyncio.Task[None]] = set()
        self._direct: dict[str, DirectReader | None] = {}
        files = getattr(store, "files", None)
        for g in geometries.values():  # reads of a local archive's files are bounded
            if files is not None:
                stored = math.prod(g.stored_chunks) * np.dtype(g.dtype).itemsize
                files.bound(g.path, stored_limit(stored))
        try:
            self.arrays: dict[str, Any] = self.call(self._open(store))
            self._start_threads()
        except BaseException:
            self.close()
            raise

    def call(self, coro: Any) -> Any:
        """Run ``coro`` on the engine loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _open(self, store: Store) -> dict[str, Any]:
        arrays = {
            name: await zarr.api.asynchronous.open_array(store=store, path=g.path, mode="r")
            for name, g in self.geometries.items()
        }
        self._direct = {
            name: DirectReader.for_array(arr, self.times.add) for name, arr in arrays.items()
        }
        self.reader = SlabReader(
            self.geometries, arrays, self._direct, self.max_inflight, self.on_bad_chunk,
            self.times.add,
        )  # fmt: skip
        return arrays

    @property
    def bad_chunks(self) -> list[str]:
        """Keys of the chunks skipped or NaN-filled (``on_bad_chunk``), each once."""
        return list(self.reader.bad_chunks)

    def _start_threads(self) -> None:
        """Start every decode thread with its read buffer, and the gather thread, now:
        a pass should not wait for them (fresh memory is slow to fault in on a VM)."""
        sizes = [r.nbytes for r in self._direct.values() if r is not None and r.reads_files]
        read_bytes = max(sizes, default=0)
        started = threading.Barrier(self.decode_threads + 1)

        def start() -> None:
            reserve_read_buffer(read_bytes)
            started.wait()

        try:  # each job holds its thread until all have started, so each gets its own
            for _ in range(self.decode_threads):
                self._executor.submit(start)
            started.wait()
        except BaseException:
            started.abort()
            raise
        self._gatherer.submit(int).result()

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def close(self) -> None:
        """Cancel every pass and read, stop the loop and the thread pool, leave the
        on-disk pool."""
        if self.loop.is_closed():
            return

        async def cancel() -> None:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        if self._thread.is_alive():
            self.call(cancel())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()
        self._executor.shutdown(wait=True)
        self._gatherer.shutdown(wait=True)
        if self.shared is not None:
            self.shared.close()

    # -- reading ---------------------------------------------------------------------

    def chunk_key(self, name: str, coords: tuple[int, ...]) -> str:
        return self.reader.chunk_key(name, coords)

    async def _fetch(self, slab: Slab) -> None:
        """Read, decode and transform one slab into the pool (or map it from the on-disk
        pool, if another process decoded it); any failure reaches its waiters."""
        lock, source = None, ""
        try:
            data = None
            if self.shared is not None:
                data, lock, source = await self._claim(slab)
            if data is None:
                data, clean = await self._decode_slab(slab)
                if data is not None and clean and lock is not None:
                    assert self.shared is not None
                    loop = asyncio.get_running_loop()
                    publish = functools.partial(self.shared.publish, slab.key, data, source)
                    await loop.run_in_executor(None, publish)
        except asyncio.CancelledError:
            self.pool.fail(slab, asyncio.CancelledError())
            raise
        except Exception as exc:
            self.pool.fail(slab, exc)
            return
        finally:
            if lock is not None:
                SharedChunks.unlock(lock)
        self.pool.fill(slab, data)

    async def _decode_slab(self, slab: Slab) -> tuple[np.ndarray | None, bool]:
        """The slab decoded and transformed (``None``: skipped), and whether it read
        cleanly (only a clean slab is published to the on-disk pool)."""
        data, clean = await self.reader.read_slab(slab.key, lambda: self.pool.buffer(slab))
        self.decodes += 1
        if data is not None and self.chunk_transforms:
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(None, self._transform, slab.key[0], data)
        return data, clean

    async def _claim(self, slab: Slab) -> tuple[np.ndarray | None, int | None, str]:
        """The slab from the on-disk pool, or its decode lock if nobody published it (or
        only a damaged or stale copy) yet; and the stamp of its chunks, taken before it is
        decoded, to publish it with.

        A slab another process is decoding is waited for by polling, never by blocking a
        thread on its lock: processes waiting on each other's locks while their own
        decodes queue behind those waits would deadlock.
        """
        assert self.shared is not None
        shared = self.shared
        name, j = slab.key
        g = self.geometries[name]
        shape = (len(g.samples_in_chunk(j)), *g.sample_shape)
        dtype = None if self.chunk_transforms else np.dtype(g.dtype)

        def load(held: bool = False) -> tuple[np.ndarray | None, str]:
            source = self._chunk_stamp(slab.key)  # now: a chunk changed since shows
            return shared.load(slab.key, shape, dtype, source, held=held), source

        # A slab not published yet (the common case) costs the loop one lstat; only a
        # published one goes to a thread, for the stats and the CRC of checking it.
        loop = asyncio.get_running_loop()
        delay = 0.0002
        while True:
            if shared.published(slab.key):
                data, source = await loop.run_in_executor(None, load)
                if data is not None:
                    self.shared_hits += 1
                    return data, None, source
            lock = shared.try_lock(slab.key)
            if lock is not None:
                try:  # published just before we locked; or damaged or stale, then removed
                    if not shared.published(slab.key):  # nobody publishes while we hold it
                        return None, lock, self._chunk_stamp(slab.key)
                    data, source = await loop.run_in_executor(None, load, True)
                except BaseException:
                    SharedChunks.unlock(lock)
                    raise
                if data is not None:
                    SharedChunks.unlock(lock)
                    self.shared_hits += 1
                    return data, None, source
                return None, lock, source
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.005)

    def _chunk_stamp(self, key: SlabKey) -> str:
        """The stamp of the stored chunks slab ``key`` is decoded from (``chunk_stamp``)."""
        if self._root is None:
            return ""
        keys = self._chunk_keys.get(key)
        if keys is None:
            parts = self.reader.parts(*key)
            keys = self._chunk_keys[key] = [self.chunk_key(key[0], c) for _, c in parts]
        return chunk_stamp(self._root, keys)

    def _transform(self, name: str, data: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        for t in self.chunk_transforms:
            data = run_chunk_transform(t, name, data)
        self.times.add("transform", time.perf_counter() - start)
        return data

    # -- a pass ----------------------------------------------------------------------

    def start_pass(
        self,
        plan: PassPlan,
        out: queue.Queue[Any],
        credits: asyncio.Semaphore,
        prepare: Callable[[Batch], Any] | None = None,
    ) -> Any:
        """Start producing ``plan``'s batches into ``out``; returns a concurrent future.
        With ``prepare`` (a device stage's pass) each batch is put wholly in the ring, then
        prepared (see `_assemble`)."""
        coro = self._pass(plan, out, credits, prepare)
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def _pass(
        self,
        plan: PassPlan,
        out: queue.Queue[Any],
        credits: asyncio.Semaphore,
        prepare: Callable[[Batch], Any] | None,
    ) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._tasks.add(me)
        progress = _Progress(batch=plan.start_batch)
        releases = {}  # per variable: slabs sorted by the batch after which they are free
        for name, use in plan.uses.items():
            by_last = np.argsort(use.last, kind="stable")
            releases[name] = (use.slab[by_last], use.last[by_last])
        admitted = asyncio.Event()
        launcher = asyncio.get_running_loop().create_task(self._admit_all(plan, progress, admitted))
        self._tasks.add(launcher)
        try:
            for b in range(plan.start_batch, plan.n_batches):
                await credits.acquire()
                progress.batch = b
                self.pool.notify()
                waited = time.perf_counter()
                while progress.registered < b and not launcher.done():
                    admitted.clear()
                    await admitted.wait()
                if launcher.done():
                    launcher.result()
                self.times.add("admit_wait", time.perf_counter() - waited)
                idx = plan.order[b * plan.batch_size : (b + 1) * plan.batch_size]
                needed = [
                    progress.slabs[(name, int(s))]
                    for name, g in self.geometries.items()
                    for s in _distinct((idx + g.offset) // g.sample_chunk_size)
                ]
                waited = time.perf_counter()
                for slab in needed:
                    await slab.ready
                self.times.add("slab_wait", time.perf_counter() - waited)
                batch = await asyncio.get_running_loop().run_in_executor(
                    self._gatherer, self._assemble, idx, progress.slabs, prepare
                )
                for slab in needed:
                    if slab.planned is not None and slab.planned <= b:
                        slab.planned = None
                for name, (slabs, lasts) in releases.items():
                    lo, hi = np.searchsorted(lasts, [b, b + 1])
                    for s in slabs[lo:hi]:
                        self.pool.unpin(progress.slabs.pop((name, int(s))))
                if len(batch["sample_indices"]):  # empty: every sample was in a skipped chunk
                    out.put((b, batch))  # with its plan batch: what a resume counts
                else:
                    credits.release()
            out.put(END)
        except asyncio.CancelledError:
            out.put(RuntimeError(CLOSED_DURING_PASS))
            raise
        except Exception as exc:
            out.put(exc)
            raise
        finally:
            self._tasks.discard(me)
            launcher.cancel()
            await asyncio.gather(launcher, return_exceptions=True)
            self._tasks.discard(launcher)
            for slab in progress.slabs.values():
                self.pool.unpin(slab)
            progress.slabs.clear()

    async def _admit_all(
        self, plan: PassPlan, progress: _Progress, admitted: asyncio.Event
    ) -> None:
        """Admit every slab of the pass in first-use order, fetching the misses."""
        names = list(plan.uses)
        firsts = np.concatenate([plan.uses[n].first for n in names])
        which = np.concatenate([np.full(len(plan.uses[n].first), i) for i, n in enumerate(names)])
        rows = np.concatenate([np.arange(len(plan.uses[n].first)) for n in names])
        for var, row in zip(which, rows, strict=True):
            use = plan.uses[names[var]]
            self.pool.plan((names[var], int(use.slab[row])), int(use.first[row]))
        walk = np.argsort(firsts, kind="stable")
        for k in walk:
            name = names[which[k]]
            use = plan.uses[name]
            key = (name, int(use.slab[rows[k]]))
            first = int(use.first[rows[k]])
            if progress.registered < first - 1:
                progress.registered = first - 1
                admitted.set()
            slab = self.pool.lookup(key)
            if slab is None:
                slab = await self.pool.admit(key, int(use.nbytes[rows[k]]), _due(first, progress))
                task = asyncio.get_running_loop().create_task(self._fetch(slab))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            progress.slabs[key] = slab
        progress.registered = plan.n_batches
        admitted.set()

    def _assemble(
        self,
        idx: np.ndarray,
        slabs: dict[tuple[str, int], Slab],
        prepare: Callable[[Batch], Any] | None = None,
    ) -> Any:
        """Gather one batch; samples are grouped by slab so each group is one ``take``.
        With ``prepare`` (a device stage's pass) every array the batch transforms left
        outside the ring (``sample_indices``, new or replaced arrays) is copied into it, so
        the copy to the device reads only ring memory (page-locked for CUDA), then
        ``prepare`` runs on the batch."""
        start = time.perf_counter()
        names = list(self.geometries)
        shifts = [self.geometries[n].offset for n in names]  # windowed views read idx + offset
        slab_ids = [
            (idx + d) // self.geometries[n].sample_chunk_size
            for n, d in zip(names, shifts, strict=True)
        ]
        if self.on_bad_chunk == "skip" and self.reader.bad_chunks:
            keep = np.ones(len(idx), dtype=bool)
            for n, ids in zip(names, slab_ids, strict=True):
                for s in _distinct(ids):
                    if slabs[(n, int(s))].data is None:
                        keep &= ids != s
            idx = idx[keep]
            slab_ids = [ids[keep] for ids in slab_ids]
        grouping = np.lexsort(slab_ids[::-1]) if names else np.arange(len(idx))
        idx = idx[grouping]
        batch = Batch()
        for n, d, ids in zip(names, shifts, slab_ids, strict=True):
            g = self.geometries[n]
            ids = ids[grouping]
            offs = idx + d - ids * g.sample_chunk_size
            first = slabs[(n, int(ids[0]))].data if len(ids) else None
            dtype = first.dtype if first is not None else np.dtype(g.dtype)
            out = self._outputs.empty((len(idx), *g.sample_shape), dtype)
            bounds = np.flatnonzero(np.diff(ids)) + 1
            for lo, hi in zip(
                np.concatenate([[0], bounds]), np.concatenate([bounds, [len(ids)]]), strict=True
            ):
                if hi == lo:
                    continue
                data = slabs[(n, int(ids[lo]))].data
                assert data is not None
                # one call per slab: numpy copies the rows without holding the GIL
                np.take(data, offs[lo:hi], axis=0, out=out[lo:hi], mode="clip")
            batch[n] = out
        batch["sample_indices"] = idx
        offsets = {n: d for n, d in zip(names, shifts, strict=True) if d}
        batch.read_offsets = offsets
        for t in self.batch_transforms:
            batch = run_batch_transform(t, batch)
            batch.read_offsets = offsets
        if prepare is not None:
            for key, value in batch.items():
                batch[key] = self._outputs.adopt(value)
            batch = prepare(batch)
        self.times.add("gather", time.perf_counter() - start)
        return batch


def _distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a small integer array.

    Not ``np.unique``: numpy 2.4 imports ``numpy.ma`` on its first call, about 30 ms
    under the GIL that every thread of a first batch would wait for.
    """
    ordered = np.sort(values)
    keep = np.ones(len(ordered), dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def _due(first: int, progress: _Progress) -> Callable[[], bool]:
    """Whether the pass has reached the batch that first needs a slab."""
    return lambda: first <= progress.batch
