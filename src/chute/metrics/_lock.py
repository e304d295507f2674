"""One writer per run: an flock across processes, a handover registry within one."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable

from chute.errors import RunLockedError

_registry: dict[str, Callable[[], None]] = {}
_registry_lock = threading.Lock()


class RunLock:
    """Exclusive lock on a run directory, released by `release()`.

    Inside one process a new lock on the same run first calls the previous
    holder's `handover`, which must finish its background work and release.
    """

    def __init__(self, outdir: str, handover: Callable[[], None]) -> None:
        self.key = os.path.realpath(outdir)
        with _registry_lock:
            previous = _registry.get(self.key)
        if previous is not None:
            previous()
        fd = os.open(self.key, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"run {outdir!r} is being written by another process; "
                "only one writer may hold a run at a time"
            ) from None
        self._fd: int | None = fd
        with _registry_lock:
            _registry[self.key] = handover

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        with _registry_lock:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            _registry.pop(self.key, None)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
