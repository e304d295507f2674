"""One writer per dataset in object storage: a lock object created only where none is.

The lock is a small JSON object (``dataset.lock``, ``columns.lock``) put with
``If-None-Match: *`` (obstore's ``mode="create"``): of two writers, the store lets exactly
one create it, and the other gets `StoreLockedError` naming the URL and the holder. The
holder renews it every quarter of its lease (a conditional put on its own last ETag, each
renewal's body different so its ETag changes), and deletes it when done.

A writer killed with its lock held leaves it behind. It expires ``lease_s`` seconds after
its last renewal, timed by the store's own clock (the object's last-modified time), and the
next writer then takes it over with a put conditional on the stale lock's ETag (so of two
writers doing so at once, one wins). ``break_lock=True`` takes over a lock that has not
expired yet: for when you know its writer is dead. A writer whose renewals fail for most of
a lease stops before it uploads or commits anything more (`RemoteLock.check`).

Where the store has no conditional put, there is no lock: the writer warns and goes on, and
two writers at once are not detected (see docs/scale.md).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Final

from chute._objects._errors import ConditionalWritesUnsupported
from chute._objects._url import Location
from chute._objects._writes import (
    Stored,
    Version,
    delete_keys,
    put_object,
    read_object,
    url_of,
)
from chute.errors import RemoteChangedError, RemoteError, StoreLockedError

#: Seconds a lock stays valid after its last renewal; it is renewed every quarter of this.
LEASE_S: Final = 60.0
_MAX_LOCK_BYTES: Final = 64 << 10
_FORMAT: Final = "chute-lock"


class RemoteLock:
    """The writer's lock object ``key`` under ``location``, held inside a ``with`` block.

    >>> from obstore.store import MemoryStore
    >>> from chute._objects import open_location
    >>> where = open_location(MemoryStore())
    >>> with RemoteLock(where, "dataset.lock") as lock:
    ...     try:
    ...         RemoteLock(where, "dataset.lock").__enter__()
    ...     except StoreLockedError as e:
    ...         print("refused:", "held by another writer" in str(e))
    refused: True
    """

    def __init__(
        self, location: Location, key: str, *, break_lock: bool = False, lease_s: float = LEASE_S
    ) -> None:
        self.location, self.key, self.break_lock, self.lease_s = location, key, break_lock, lease_s
        self.url = url_of(location, key)
        self.token = uuid.uuid4().hex
        self.version: Version | None = None  # ours, while held
        self.conditional = True
        self.lost: str | None = None
        self._beats = 0
        self._renewed = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RemoteLock:
        self._acquire()
        if self.version is not None:
            self._thread = threading.Thread(target=self._renew, name="chute-lock", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.version is None or self.lost is not None:
            return
        try:
            current = read_object(self.location, self.key, _MAX_LOCK_BYTES)
            if current is not None and current.version == self.version:
                delete_keys(self.location, [self.key])
        except RemoteError:  # not released: it expires after its lease
            pass
        self.version = None

    @property
    def held(self) -> bool:
        """Whether this writer may still change the dataset (also true where the store has no
        conditional put, and so no lock)."""
        return self.lost is None and (
            not self.conditional or time.monotonic() - self._renewed < 0.75 * self.lease_s
        )

    def check(self) -> None:
        """`StoreLockedError` if the lock was taken over or could not be renewed in time:
        the writer then uploads and commits nothing more."""
        if not self.held:
            reason = self.lost or "it could not be renewed for most of its lease"
            raise StoreLockedError(f"{self.url}: this writer lost its lock ({reason}); it stops")

    def _body(self) -> bytes:
        self._beats += 1
        doc = {
            "format": _FORMAT,
            "version": 1,
            "owner": f"{socket.gethostname()}:{os.getpid()}",
            "token": self.token,
            "lease_s": self.lease_s,
            "renewal": self._beats,
        }
        return json.dumps(doc).encode()

    def _acquire(self) -> None:
        for _ in range(3):  # the holder may release between our create and our read
            try:
                self.version = put_object(self.location, self.key, self._body(), over=None)
                self._renewed = time.monotonic()
                return
            except ConditionalWritesUnsupported:
                self.conditional = False
                warnings.warn(
                    f"{self.url}: the store takes no conditional writes, so chute cannot "
                    "refuse a second writer here: run one writer per dataset",
                    stacklevel=4,
                )
                return
            except RemoteChangedError:
                current = read_object(self.location, self.key, _MAX_LOCK_BYTES)
            if current is not None:
                self._take_over(current)
                return
        raise StoreLockedError(f"{self.url}: the lock keeps changing hands; try again")

    def _take_over(self, current: Stored) -> None:
        """Take ``current`` (another writer's lock) over if it expired or ``break_lock``."""
        owner, lease = _describe(current.data)
        expires = current.modified + timedelta(seconds=lease)
        if not self.break_lock and datetime.now(UTC) < expires:
            raise StoreLockedError(
                f"{self.url} is held by another writer ({owner}, renewed "
                f"{current.modified:%Y-%m-%d %H:%M:%S} UTC): one writer at a time; if that "
                f"writer is dead, its lock expires {lease:g} s after its last renewal, or "
                "pass break_lock=True"
            )
        try:
            self.version = put_object(self.location, self.key, self._body(), over=current.version)
        except RemoteChangedError:
            raise StoreLockedError(
                f"{self.url}: another writer took over the lock of {owner} first"
            ) from None
        self._renewed = time.monotonic()
        why = "as asked (break_lock=True)" if self.break_lock else "expired"
        warnings.warn(f"{self.url}: took over the lock of {owner}, {why}", stacklevel=5)

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            assert self.version is not None
            try:
                self.version = put_object(self.location, self.key, self._body(), over=self.version)
                self._renewed = time.monotonic()
            except RemoteChangedError:
                self.lost = "another writer took it over"
                return
            except RemoteError:  # a dropped request: try again at the next beat
                continue


def _describe(data: bytes) -> tuple[str, float]:
    """The owner and lease of a lock object's body (an unreadable one: the default lease)."""
    try:
        doc = json.loads(data)
        lease = float(doc["lease_s"])
        if doc.get("format") != _FORMAT or not 0 <= lease <= 86_400:
            raise ValueError(doc)
        return str(doc.get("owner", "?")), lease
    except (ValueError, KeyError, TypeError):
        return "a lock object chute cannot read", LEASE_S
