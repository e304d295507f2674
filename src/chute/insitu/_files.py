"""A local archive's files, opened by one rule on every read path.

Every file of a local archive (chunk, shard or metadata document, read directly or through
zarr's codec pipeline) is opened only as a regular file inside the store's root folder: a
link is followed only to a regular file inside that folder; a FIFO (its read would block
forever), a device (``/dev/zero`` never ends), a folder, a link out of the store or to
nothing is an `UnsafeFileError` naming the file (a `BadChunkError` of its key once the
scheduler reports it). A read is bounded by what a stored object of the array can hold.
Only a file that is truly absent reads as missing (zarr's fill value).
"""

from __future__ import annotations

import errno
import os
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from chute._util.safe_open import Folder
from chute.errors import UnsafeFileError

METADATA_NAMES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")
METADATA_LIMIT = 256 << 20  # bytes a metadata document may hold


def stored_limit(decoded_nbytes: int) -> int:
    """The most bytes a stored chunk or shard of ``decoded_nbytes`` decoded bytes may hold:
    generous for any codec chain and shard index, but bounded."""
    return 4 * decoded_nbytes + (1 << 20)


class ArchiveFiles:
    """The files under a local archive's root folder (see the module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._folder = Folder(root)
        self._limits: dict[str, int] = {}  # array path prefix -> bound of its stored objects

    def bound(self, prefix: str, limit: int) -> None:
        """Bound the reads of the stored objects under array path ``prefix``."""
        self._limits[prefix.strip("/")] = limit

    def limit(self, key: str) -> int:
        """The most bytes the object at ``key`` may hold."""
        if key.rsplit("/", 1)[-1] in METADATA_NAMES:
            return METADATA_LIMIT
        best, found = -1, METADATA_LIMIT
        for prefix, limit in self._limits.items():
            if (not prefix or key.startswith(prefix + "/")) and len(prefix) > best:
                best, found = len(prefix), limit
        return found

    def open(self, key: str) -> int | None:
        """A descriptor of the regular file at ``key``; ``None`` if there is no file at all."""
        path = os.path.join(self.root, key)
        try:
            return self._folder.open(path)
        except OSError as e:
            if isinstance(e, UnsafeFileError) or e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise
            if os.path.lexists(path):
                raise UnsafeFileError(f"{path} is a link to a missing file") from None
            return None

    def read(self, key: str, byte_range: ByteRequest | None = None) -> bytes | None:
        """The bytes of ``key`` (or of ``byte_range`` of it); ``None`` if it is absent."""
        fd = self.open(key)
        if fd is None:
            return None
        try:
            size = os.fstat(fd).st_size
            start, stop = _span(byte_range, size)
            limit = self.limit(key)
            if stop - start > limit:
                raise UnsafeFileError(
                    f"{os.path.join(self.root, key)} holds {size} bytes, more than an object "
                    f"of it can ({limit})"
                )
            parts = []
            while start < stop:
                part = os.pread(fd, stop - start, start)
                if not part:
                    break  # shrank while reading: what is left is read as it is
                parts.append(part)
                start += len(part)
            return b"".join(parts)
        finally:
            os.close(fd)


def _span(byte_range: ByteRequest | None, size: int) -> tuple[int, int]:
    if byte_range is None:
        return 0, size
    if isinstance(byte_range, RangeByteRequest):
        return min(byte_range.start, size), min(byte_range.end, size)
    if isinstance(byte_range, OffsetByteRequest):
        return min(byte_range.offset, size), size
    if isinstance(byte_range, SuffixByteRequest):
        return max(size - byte_range.suffix, 0), size
    raise TypeError(f"unexpected byte range {byte_range!r}")


def local_root(store: Any) -> str | None:
    """The directory behind a local store (obstore or zarr), through counting wrappers."""
    from obstore.store import LocalStore as ObstoreLocal
    from zarr.storage import LocalStore, ObjectStore

    store = getattr(store, "wrapped", store)
    if isinstance(store, ObjectStore) and isinstance(store.store, ObstoreLocal):
        return os.fspath(store.store.prefix) if store.store.prefix is not None else None
    if isinstance(store, LocalStore):
        return os.fspath(store.root)
    return None


def archive_files(store: Any) -> ArchiveFiles | None:
    """The files of ``store`` if it is a local archive, else ``None``."""
    root = local_root(store)
    return None if root is None else ArchiveFiles(root)
