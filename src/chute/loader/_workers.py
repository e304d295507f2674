"""The loader's worker threads: daemon threads, so a stuck transform never keeps the
interpreter alive.

``concurrent.futures.ThreadPoolExecutor`` joins every worker at interpreter exit, so one
transform that never returns hangs the exit (and ``shutdown(wait=True)`` hangs ``close()``).
These workers are daemon threads; `Workers.stop` waits a bounded time (the pool's
``grace``) for the calls already running, and at exit every pool still open is stopped the
same way, so calls that finish in time (a gather from a store) are never cut off by the
interpreter's shutdown, and one that never returns is left behind.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

#: How long closing a loader (or exiting) waits for batches already being built when the
#: loader has no ``timeout``; one still running then is left to finish on its own.
CLOSE_WAIT = 2.0

_Task = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None
_OPEN: weakref.WeakSet[Workers] = weakref.WeakSet()


def _work(tasks: queue.SimpleQueue[_Task]) -> None:
    """One worker: run tasks until a stop (None). Holds the queue, never the pool, so a
    pool dropped without `Workers.stop` is still collected (and its workers told to stop)."""
    while (task := tasks.get()) is not None:
        future, fn, args = task
        del task
        if future.set_running_or_notify_cancel():
            try:
                result = fn(*args)
            except BaseException as error:  # handed to the consumer with its traceback
                future.set_exception(error)
            else:
                future.set_result(result)
                del result
        del future, fn, args


def _post_stops(tasks: queue.SimpleQueue[_Task], count: int) -> None:
    for _ in range(count):
        tasks.put(None)


class Workers:
    """``count`` daemon threads running submitted calls in submission order; `stop` waits
    at most ``grace`` seconds for the calls running.

    >>> pool = Workers(2, "demo", grace=1.0)
    >>> pool.submit(sum, [1, 2, 3]).result()
    6
    >>> pool.stop()
    True
    """

    def __init__(self, count: int, name: str, grace: float = CLOSE_WAIT) -> None:
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self.grace = grace
        self.pid = os.getpid()  # the threads do not survive a fork
        self._threads = [
            threading.Thread(target=_work, args=(self._tasks,), name=f"{name}_{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()
        self._dropped = weakref.finalize(self, _post_stops, self._tasks, count)
        self._dropped.atexit = False  # at exit, `_stop_all_at_exit` stops the pools
        _OPEN.add(self)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)``; its future."""
        future: Future[T] = Future()
        self._tasks.put((future, fn, args))
        return future

    def stop(self) -> bool:
        """Cancel the calls not started and end the workers once their running call
        returns, waiting at most ``grace`` seconds; whether every worker has ended."""
        self._halt()
        return self._join(time.monotonic() + self.grace)

    def _halt(self) -> None:
        self._dropped.detach()
        _OPEN.discard(self)
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                task[0].cancel()
        _post_stops(self._tasks, len(self._threads))

    def _join(self, deadline: float) -> bool:
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)


@atexit.register
def _stop_all_at_exit() -> None:
    """Stop every pool still open, all at once: each waits its own grace, not the sum."""
    pools = list(_OPEN)
    for pool in pools:
        pool._halt()
    start = time.monotonic()
    for pool in pools:
        pool._join(start + pool.grace)
