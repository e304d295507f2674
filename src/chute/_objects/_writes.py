"""Writing to object storage, for the writers of datasets by URL: listing a prefix, uploading
a staged folder, conditional puts, deleting. Every obstore failure becomes a chute error
naming the object's URL (`remote_error`), so the rooms above never see obstore's classes.

Keys are relative to the `Location`'s prefix (``part-00000.zr/meta.zr``). A conditional put
takes the `Version` read before (``None``: the object must not exist); where the store has
no conditional writes it raises `ConditionalWritesUnsupported`, and the caller decides.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from chute._objects._errors import is_panic, remote_error
from chute._objects._url import Location
from chute._util.waiting import first_failure, wait_all
from chute.errors import (
    ChuteError,
    RemoteError,
    RemoteNotFoundError,
)

T = TypeVar("T")

#: Files above this size go up as a multipart upload, in parts of this size.
PART_BYTES = 16 << 20
#: Objects uploaded at once by one writer (each large one also sends parts side by side).
UPLOADS = 8


@dataclass(frozen=True)
class Version:
    """What a conditional put checks: the ETag (and the version, where the store has one)."""

    e_tag: str | None
    version: str | None

    @classmethod
    def of(cls, meta: Any) -> Version:
        version = meta.get("version")
        return cls(meta.get("e_tag"), None if version in (None, "null") else str(version))

    def mode(self) -> dict[str, str]:
        mode = {"e_tag": self.e_tag} if self.e_tag is not None else {}
        return {**mode, "version": self.version} if self.version is not None else mode


@dataclass(frozen=True)
class Stored:
    """An object's bytes as read, its `Version`, and when the store last wrote it."""

    data: bytes
    version: Version
    modified: datetime


def url_of(location: Location, key: str) -> str:
    """The URL of ``key`` under ``location`` (for messages).

    >>> from chute._objects import open_location
    >>> url_of(open_location("s3://bucket/data/", skip_signature=True), "dataset.json")
    's3://bucket/data/dataset.json'
    """
    return f"{location.url.rstrip('/')}/{key}"


def sub_location(location: Location, folder: str) -> Location:
    """The `Location` of ``folder`` under ``location`` (a column of a Ray conversion): the
    same kind of store, with the same options, rooted one folder deeper. A store without a
    prefix (a ``MemoryStore``) has no folder of its own: a ``TypeError``.

    >>> from chute._objects import open_location
    >>> sub = sub_location(open_location("s3://bucket/conv", skip_signature=True), "image")
    >>> sub.url, sub.store.prefix
    ('s3://bucket/conv/image', 'conv/image')
    """
    store = location.store
    if not hasattr(store, "config"):
        raise TypeError(f"{type(store).__name__} has no folders: write to s3://, gs:// or az://")
    prefix = "/".join(p for p in (store.prefix, folder.strip("/")) if p)
    deeper = type(store)(
        prefix=prefix, config=store.config, client_options=store.client_options,
        retry_config=store.retry_config, credential_provider=store.credential_provider,
    )  # fmt: skip
    return Location(url_of(location, folder), location.scheme, deeper, None, location.writable)


def _call(location: Location, key: str, fn: Callable[[], T]) -> T:
    """``fn()`` with its failure as `remote_error` (chute's own errors pass through)."""
    try:
        return fn()
    except ChuteError:
        raise
    except BaseException as error:  # obstore's errors, and a panic in its client
        if not isinstance(error, Exception) and not is_panic(error):
            raise
        raise remote_error(url_of(location, key), error) from error


def list_dir(location: Location, prefix: str = "") -> tuple[list[str], list[str]]:
    """The "folders" and the objects directly under ``prefix`` (names relative to it)."""
    import obstore

    where = prefix.strip("/")
    found = _call(
        location, where, lambda: obstore.list_with_delimiter(location.store, where or None)
    )
    cut = len(where) + 1 if where else 0
    folders = [p[cut:].strip("/") for p in found["common_prefixes"]]
    return folders, [o["path"][cut:] for o in found["objects"]]


def keys_in(location: Location, folders: Iterable[str]) -> list[str]:
    """Every object key in the top-level ``folders`` (keys relative to the location): one
    listing of the prefix (paged by the store), not one request per folder."""
    import obstore

    wanted = set(folders)
    if not wanted:
        return []

    def collect() -> list[str]:
        found = (meta["path"] for batch in obstore.list(location.store) for meta in batch)
        return [key for key in found if key.split("/", 1)[0] in wanted]

    return _call(location, "", collect)


def read_object(location: Location, key: str, limit: int) -> Stored | None:
    """``key``'s bytes (at most ``limit``: a larger object is a `RemoteError`), or ``None``
    where there is no such object."""
    import obstore

    def get() -> Stored | None:
        try:
            result = obstore.get(location.store, key)
        except FileNotFoundError:
            return None
        meta = result.meta
        if meta["size"] > limit:
            raise RemoteError(
                f"{url_of(location, key)} holds {meta['size']} bytes; at most {limit} expected"
            )
        return Stored(bytes(result.bytes()), Version.of(meta), meta["last_modified"])

    return _call(location, key, get)


def put_object(location: Location, key: str, data: bytes, *, over: Version | None) -> Version:
    """Put ``data`` at ``key`` only if the object there is still ``over`` (``None``: only if
    there is none); `RemoteChangedError` otherwise. Returns the new object's `Version`."""
    import obstore

    mode: Any = "create" if over is None else over.mode()
    return _call(
        location, key, lambda: Version.of(obstore.put(location.store, key, data, mode=mode))
    )


def put_always(location: Location, key: str, data: bytes) -> None:
    """Put ``data`` at ``key``, whatever is there (where the store has no conditional put)."""
    import obstore

    _call(location, key, lambda: obstore.put(location.store, key, data))


def delete_keys(location: Location, keys: Iterable[str]) -> None:
    """Delete ``keys`` (bulk where the store has it); a key already gone is no error."""
    import obstore

    batch = list(keys)
    if not batch:
        return
    try:
        _call(location, batch[0], lambda: obstore.delete(location.store, batch))
    except RemoteNotFoundError:  # GCS and Azure report a missing key: delete the rest one by one
        for key in batch:
            with contextlib.suppress(RemoteNotFoundError):
                _call(location, key, functools.partial(obstore.delete, location.store, key))


def _local_files(folder: Path) -> Iterator[Path]:
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            yield Path(root) / name


def upload_file(location: Location, key: str, file: Path) -> None:
    """Upload one local file to ``key`` (multipart above `PART_BYTES`)."""
    import obstore

    def put() -> None:
        obstore.put(
            location.store, key, file, use_multipart=file.stat().st_size > PART_BYTES,
            chunk_size=PART_BYTES, max_concurrency=4,
        )  # fmt: skip

    _call(location, key, put)


def upload_folder(location: Location, folder: Path, key: str) -> list[str]:
    """Upload every file under ``folder`` to the keys under ``key`` (same relative names),
    `UPLOADS` at a time; returns the keys. The first failure is raised once every upload
    has ended."""
    files = [(f"{key}/{f.relative_to(folder).as_posix()}", f) for f in _local_files(folder)]
    with ThreadPoolExecutor(min(UPLOADS, max(1, len(files)))) as pool:
        futures = [pool.submit(upload_file, location, k, f) for k, f in files]
    for future in futures:
        future.result()
    return [k for k, _ in files]


class Uploads:
    """Folders uploaded in the background while the caller stages the next ones: at most
    ``ahead`` folders wait or go up at once (`add` blocks beyond that), so the local staging
    holds a bounded number of shards. Each folder is removed locally once it is up, and
    ``check()`` runs before each (the writer's lock still held)."""

    def __init__(self, location: Location, check: Callable[[], None], ahead: int = 2) -> None:
        self.location = location
        self.check = check
        self.ahead = ahead
        self.pool = ThreadPoolExecutor(ahead)
        self.pending: list[Future[list[str]]] = []
        self.started: list[str] = []  # the key of every folder begun (to clean up after)

    def _one(self, folder: Path, key: str) -> list[str]:
        try:
            self.check()
            return upload_folder(self.location, folder, key)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def add(self, folder: Path, key: str) -> None:
        while len(self.pending) >= self.ahead:
            self.pending.pop(0).result()
        self.started.append(key)
        self.pending.append(self.pool.submit(self._one, folder, key))

    def finish(self) -> None:
        """Wait for every upload, then raise the first failure (none is left running)."""
        pending, self.pending = self.pending, []
        try:
            wait_all(future.result for future in pending)
        finally:
            self.pool.shutdown()

    def remove_started(self) -> None:
        """After a failure: wait for the uploads in flight (quietly: the caller is raising
        the first failure), then delete every object of the folders begun."""
        first_failure(future.result for future in self.pending)
        self.pending = []
        self.pool.shutdown()
        delete_keys(self.location, keys_in(self.location, self.started))
