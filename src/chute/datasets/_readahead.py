"""Opening a sharded dataset's shards ahead of the gathers that read them, on one background
thread: in object storage a shard's first read waits for round trips (its table, checksums
and chunk sizes), which a loader can start while earlier batches are still being read."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor


class ShardsAhead:
    """Shards queued to open on one background thread (one a process: a forked child makes
    its own), each queued once at a time. A failure is left to the gather that needs the
    shard, which opens it again and raises. Holds nothing of its dataset between calls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: set[int] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0

    def start(
        self,
        shards: Iterable[int],
        open_one: Callable[[int], object],
        fan_out: Callable[[Callable[[int], None], list[int]], object],
    ) -> None:
        """Queue ``shards`` (the caller leaves out those open) not queued already: each
        opened by ``open_one(i)``, several side by side by ``fan_out(fn, shards)`` (the
        folder's ``map``)."""
        with self._lock:
            todo = sorted(s for s in shards if s not in self._queued)
            self._queued.update(todo)
            if not todo:
                return
            if self._pool is None or self._pid != os.getpid():
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="chute-readahead")
                self._pid = os.getpid()
            pool = self._pool

        def quietly(i: int) -> None:
            with contextlib.suppress(Exception):  # the gather that needs it raises it
                open_one(i)

        def run() -> None:
            try:
                fan_out(quietly, todo)
            finally:
                with self._lock:
                    self._queued.difference_update(todo)

        pool.submit(run)

    def stop(self) -> None:
        """Take no more work; a shard being opened now is the dataset's to close."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False)
        self._pool = None
