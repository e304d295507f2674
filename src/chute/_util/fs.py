"""Small POSIX file helpers: whole writes and reads at an offset, atomic replacement of a
small file, fsync of a folder, and the advisory locks every writer of chute takes."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from chute._util.safe_open import create_regular
from chute.errors import StoreLockedError


def pwrite_all(fd: int, data: memoryview | bytes | bytearray, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (os.pwrite may write less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    """Read exactly ``size`` bytes or raise EOFError."""
    parts: list[bytes] = []
    while size:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            raise EOFError(f"file ends {size} bytes early at offset {offset}")
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def write_file_atomic(
    path: str | os.PathLike[str], data: bytes, *, durable: bool = True, suffix: str = ".tmp"
) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old file or the new, never half.

    The new bytes go to ``path`` + ``suffix`` first (a name the format's readers skip);
    ``durable`` syncs the file and its folder before returning.
    """
    path = Path(path)
    tmp = path.with_name(path.name + suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pwrite_all(fd, data, 0)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_exclusive(fd: int, what: Path) -> None:
    """Take the writer lock on an open file, or raise if another handle holds it.

    flock locks belong to the open file description, so a second handle in the same
    process conflicts just like another process does.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StoreLockedError(
            f"{what} is open for writing elsewhere (another handle or process); "
            "it has one writer at a time"
        ) from None


@contextlib.contextmanager
def held_lock(lock_file: Path, root: Path) -> Iterator[None]:
    """A writer's lock on ``lock_file`` (a regular file in ``root``, created if missing,
    never through a link), held for the block: `StoreLockedError` while another holds it."""
    fd = create_regular(lock_file, root)
    try:
        lock_exclusive(fd, root)
        yield
    finally:
        os.close(fd)


def lock_shared_wait(fd: int) -> None:
    """Wait for a shared lock (readers hold gen.chute shared while they open)."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def lock_exclusive_wait(fd: int) -> None:
    """Wait for the exclusive lock a delete, compaction or reset holds on gen.chute."""
    fcntl.flock(fd, fcntl.LOCK_EX)


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
