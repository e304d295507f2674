"""Warm stores: a store in object storage whose chunk objects are all in the block cache reads
as a local store does.

Its *warm snapshot* has the cached blocks as its chunks (the mappings the cache made, every
page checked once) and the table pointed into them, once (`chute.store._fetched.pointed`:
only a record over a block edge is copied, and where every chunk is one block the table is
used as it is). A batch is then one native call over mappings, as over a local store's files:
no request, no staging, no Python per record. The snapshot is built when every block of the
store's chunks is cached, and the cache is looked at again at most once a second: that marks
the blocks as recently used, and a store whose block was evicted (or damaged) drops its warm
snapshot, to read through the cache again, which fetches what is missing. Published block
files are replaced only by rename, never written in place, so a mapping read in between
still holds the bytes checked.

A process keeps at most `MOST_BLOCKS` blocks warm (each a mapping, and a file descriptor:
Python's ``mmap`` keeps one), within the cache's own bound on mappings (`MOST_MAPPED`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np

from chute import _native
from chute._objects import MOST_MAPPED, ObjectInfo, ObjectReader, Span
from chute.store import _fetched
from chute.store._files import Snapshot

#: Seconds between looks at the cache for one store.
RECHECK_S = 1.0
#: Blocks a process keeps warm at most, all stores together: half the mappings the cache
#: keeps, so warm stores rarely hold a mapping the cache has let go.
MOST_BLOCKS = MOST_MAPPED // 2
#: A table copied for pointing into blocks costs memory: no warm snapshot past this many
#: records (a store whose chunks are one block each uses its own table, at any size).
MOST_COPIED = 1 << 22

_held = 0
_held_lock = threading.Lock()


def _hold(blocks: int) -> bool:
    global _held
    with _held_lock:
        if _held + blocks > MOST_BLOCKS:
            return False
        _held += blocks
        return True


def _release(blocks: int) -> None:
    global _held
    with _held_lock:
        _held -= blocks


class Warmth:
    """One store's warm snapshot, if it has one, looked for at most once a second."""

    def __init__(self, reader: ObjectReader) -> None:
        self._reader = reader
        self._snap: Snapshot | None = None
        self._blocks = 0  # held for this store
        self._at = float("-inf")
        self._lock = threading.Lock()

    def snapshot(self, snap: Snapshot, chunks: list[ObjectInfo | None]) -> Snapshot | None:
        """The warm snapshot of ``snap`` (the store's chunk objects as seen: ``chunks``), or
        None while some block is not cached."""
        if time.monotonic() - self._at < RECHECK_S:
            return self._snap
        with self._lock:
            now = time.monotonic()
            if now - self._at >= RECHECK_S:
                self._at = now  # a look that fails waits for the next second too
                self._snap = self._look(snap, chunks)
            return self._snap

    def close(self) -> None:
        """Let go of the warm snapshot and its blocks."""
        with self._lock:
            self._snap = None
            _release(self._blocks)
            self._blocks = 0
            self._at = float("inf")  # never looked for again

    def _look(self, snap: Snapshot, chunks: list[ObjectInfo | None]) -> Snapshot | None:
        if self._reader.cache is None or not chunks or any(c is None for c in chunks):
            return None
        spans = self._reader.cached([c for c in chunks if c is not None])
        if spans is None:  # a block is missing (evicted, or never fetched)
            _release(self._blocks)
            self._blocks = 0
            return None
        if self._snap is not None:  # the same bytes, still cached: keep what was built
            return self._snap
        blocks = sum(len(s) for s in spans)
        if not _hold(blocks):
            return None
        warm = warm_snapshot(snap, spans)
        if warm is None:
            _release(blocks)
        else:
            self._blocks = blocks
        return warm


def warm_snapshot(snap: Snapshot, spans: list[list[Span]]) -> Snapshot | None:
    """``snap`` reading its chunks from ``spans`` (each chunk's bytes whole, as spans), or
    None where it cannot: a record the table names outside its chunk (left to the reads
    through the cache, which name the damage), more chunks than a snapshot holds, or a table
    too large to copy."""
    table = snap.table
    chunk = table["chunk_id"].astype(np.int64)
    limits = snap.limits.astype(np.int64)
    known = chunk < len(limits)
    limit = np.where(known, limits[np.minimum(chunk, len(limits) - 1)], -1)
    if _fetched.check(table, limit, 0) is not None:
        return None
    if all(len(s) == 1 and s[0][0] == 0 for s in spans):  # one block a chunk: as it is
        views = [s[0][1] for s in spans]
        lengths = np.array([memoryview(v).nbytes for v in views], np.uint64)
        return replace(snap, limits=lengths, maps=_native.chunks_from_buffers(views))
    if len(table) > MOST_COPIED:
        return None
    records = np.flatnonzero(table["phys_length"] > 0)
    buffers, lengths, staged = _fetched.pointed(table, records, chunk[records], spans)
    if len(buffers) >= _fetched.NO_CHUNK:
        return None
    sums = snap.sums
    if sums is not None:
        m = len(sums)
        sums = _fetched.moved_sums(sums.copy(), table[:m], staged[:m])
    return replace(
        snap, table=staged, tail_chunk=0, tail_offset=0, limits=lengths,
        maps=_native.chunks_from_buffers(buffers), sums=sums,
    )  # fmt: skip
