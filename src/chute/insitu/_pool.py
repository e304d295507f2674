"""ChunkPool: decoded slabs, held once, shared by every pass; the assembly buffer and the cache."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

SlabKey = tuple[str, int]  # (variable, sample-axis chunk index)


@dataclass(eq=False)
class Slab:
    """One pool entry. ``data`` is ``None`` until filled, and stays ``None`` for a bad chunk."""

    key: SlabKey
    nbytes: int
    pins: int = 1
    planned: int | None = None  # next batch of the running pass that needs it
    data: np.ndarray | None = None
    buffer: np.ndarray | None = None  # flat uint8 storage handed out for decoding into
    ready: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass
class PoolStats:
    """Counters since the pool was made. ``peak_bytes`` is the most ever resident.

    >>> import tempfile, numpy as np, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> t2m[:] = np.arange(80).reshape(40, 2)
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> ds = InSituDataset(path, manifest, batch_size=8)
    >>> _ = list(ds.val)  # one chunk, decoded once
    >>> stats = ds.pool.stats
    >>> stats.misses, stats.peak_bytes <= stats.budget_bytes
    (1, True)
    >>> ds.close()
    """

    budget_bytes: int
    resident_bytes: int = 0
    peak_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class ChunkPool:
    """Decoded slabs under a byte budget, with pinning and LRU eviction.

    A slab is pinned while a running pass still needs it; unpinned slabs stay as a cache
    until space is needed. Eviction takes slabs no running pass plans to read first
    (least recently used first), then the ones needed furthest ahead. A slab's data may be
    a read-only map of a file of the on-disk pool (``cache_dir``) rather than heap memory.
    Used from the engine's event loop only.

    Every dataset has one (``ds.pool``), shared by all its views: a chunk that fits is
    read from the store once.

    >>> import tempfile, numpy as np, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> t2m[:] = np.arange(80).reshape(40, 2)
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> ds = InSituDataset(path, manifest, batch_size=8)
    >>> _ = list(ds.val); reads = ds.stats()["store_reads"]
    >>> _ = list(ds.val)  # the second pass finds the chunk in the pool
    >>> ds.stats()["store_reads"] == reads, ds.pool.budget_bytes == ds.config.cache_budget_bytes
    (True, True)
    >>> ds.close()
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"cache_budget_bytes must be positive, got {budget_bytes}")
        self.stats = PoolStats(budget_bytes=budget_bytes)
        self._slabs: OrderedDict[SlabKey, Slab] = OrderedDict()
        self._spares: dict[int, list[np.ndarray]] = {}  # evicted heap buffers, by size
        self._waiters: list[asyncio.Future[None]] = []  # admissions waiting for room

    @property
    def budget_bytes(self) -> int:
        return self.stats.budget_bytes

    def lookup(self, key: SlabKey) -> Slab | None:
        """The slab for ``key`` if held (or being filled), pinned for the caller."""
        slab = self._slabs.get(key)
        if slab is not None:
            self._slabs.move_to_end(key)
            slab.pins += 1
            self.stats.hits += 1
        return slab

    def plan(self, key: SlabKey, batch: int) -> None:
        """Note that a running pass will need ``key`` at ``batch`` (steers eviction)."""
        slab = self._slabs.get(key)
        if slab is not None:
            slab.planned = batch

    async def admit(self, key: SlabKey, nbytes: int, urgent: Callable[[], bool]) -> Slab:
        """Reserve ``nbytes`` for a new pinned slab, waiting for space.

        When ``urgent()`` (the consumer is blocked on this slab) the budget may be
        exceeded rather than deadlock; the dataset checks up front that one pass's
        working set fits, so a lone pass never gets here.
        """
        while not self._make_room(nbytes) and not urgent():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter
        slab = Slab(key, nbytes)
        spares = self._spares.get(nbytes)
        if spares:
            slab.buffer = spares.pop()  # its bytes are already counted as resident
        else:
            self._grow(nbytes)
        self._slabs[key] = slab
        self.stats.misses += 1
        return slab

    def buffer(self, slab: Slab) -> np.ndarray:
        """Flat uint8 storage of the slab's reserved size to decode into (recycled when
        an evicted slab of that size left one)."""
        if slab.buffer is None:
            slab.buffer = np.empty(slab.nbytes, dtype=np.uint8)
        return slab.buffer

    def fill(self, slab: Slab, data: np.ndarray | None) -> None:
        """Store decoded ``data`` (``None`` marks a bad chunk) and wake the waiters."""
        if data is not None:
            if slab.buffer is not None and not np.may_share_memory(data, slab.buffer):
                slab.buffer = None
            self._grow(data.nbytes - slab.nbytes)
            slab.nbytes = data.nbytes
        else:
            self._grow(-slab.nbytes)
            slab.nbytes = 0
            slab.buffer = None
        slab.data = data
        if not slab.ready.done():
            slab.ready.set_result(None)
        self._notify()

    def fail(self, slab: Slab, exc: BaseException) -> None:
        """Drop a slab whose read failed; its waiters get ``exc``."""
        if self._slabs.get(slab.key) is slab:
            del self._slabs[slab.key]
            self._grow(-slab.nbytes)
            slab.buffer = None
        if isinstance(exc, asyncio.CancelledError):
            slab.ready.cancel()
        elif not slab.ready.done():
            slab.ready.set_exception(exc)
            slab.ready.exception()  # retrieved here so an unawaited failure does not warn
        self._notify()

    def unpin(self, slab: Slab) -> None:
        slab.pins -= 1
        if slab.pins == 0:
            slab.planned = None
        self._notify()

    def clear(self) -> None:
        """Drop every unpinned, filled slab."""
        for key in [k for k, s in self._slabs.items() if s.pins == 0 and s.ready.done()]:
            self._evict(key)

    def notify(self) -> None:
        """Re-check waiting admissions (call when a pass's progress changes ``urgent``)."""
        self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _make_room(self, nbytes: int) -> bool:
        if self._spares.get(nbytes) or self.budget_bytes - self.stats.resident_bytes >= nbytes:
            return True
        victims = [s for s in self._slabs.values() if s.pins == 0 and s.ready.done()]
        # unplanned first (in LRU order, as the dict is), then the furthest planned
        victims.sort(key=lambda s: -1 if s.planned is None else -s.planned)
        victims.sort(key=lambda s: s.planned is not None)
        for slab in victims:
            self._evict(slab.key)
            if self._spares.get(nbytes):
                return True
            if self.budget_bytes - self.stats.resident_bytes >= nbytes:
                return True
        for size in list(self._spares):  # spares of other sizes are given back
            while self._spares[size] and self.budget_bytes - self.stats.resident_bytes < nbytes:
                self._spares[size].pop()
                self._grow(-size)
        return self.budget_bytes - self.stats.resident_bytes >= nbytes

    def _evict(self, key: SlabKey) -> None:
        slab = self._slabs.pop(key)
        if slab.buffer is not None and slab.buffer.nbytes == slab.nbytes:
            self._spares.setdefault(slab.nbytes, []).append(slab.buffer)
        else:
            self._grow(-slab.nbytes)
        slab.data = slab.buffer = None
        self.stats.evictions += 1

    def _grow(self, delta: int) -> None:
        self.stats.resident_bytes += delta
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.resident_bytes)
