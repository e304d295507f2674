"""Small POSIX file helpers shared by the store's writers."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

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


def write_file_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old file or the new, never half."""
    tmp = path.with_name(path.name + ".tmp")
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
            "a store has one writer at a time"
        ) from None


def lock_shared_wait(fd: int) -> None:
    """Wait for a shared lock (readers hold gen.chute shared while they open)."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def lock_exclusive_wait(fd: int) -> None:
    """Wait for the exclusive lock a delete, compaction or reset holds on gen.chute."""
    fcntl.flock(fd, fcntl.LOCK_EX)


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


def replace_with_prefix(path: Path, fd: int, size: int, *, durable: bool) -> int:
    """Cut the file at ``path`` (open as ``fd``) to ``size`` bytes without shrinking it in
    place: the prefix is copied into a fresh file renamed over the old name. A reader that
    mapped the old file keeps it, whole, until it closes; nothing it maps ever shrinks (which
    would be SIGBUS on its next read). Returns the new file's descriptor (read-write)."""
    tmp = path.with_name(path.name + ".tmp")
    new = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _copy_prefix(fd, new, size, path)
        if durable:
            os.fsync(new)
        os.replace(tmp, path)
    except BaseException:
        os.close(new)
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if durable:
        fsync_dir(path.parent)
    return new


def _copy_prefix(src: int, dst: int, size: int, path: Path) -> None:
    """Copy bytes ``0..size`` in the kernel where it can (a reflink on some filesystems)."""
    done = 0
    while done < size:
        try:
            n = os.copy_file_range(src, dst, min(size - done, 1 << 30), done, done)
        except OSError:  # a filesystem without it: plain reads and writes
            n = len(data := os.pread(src, min(size - done, 16 << 20), done))
            pwrite_all(dst, data, done)
        if n == 0:
            raise EOFError(f"{path} ends {size - done} bytes early at offset {done}")
        done += n


def replace_with_empty(path: Path, *, durable: bool) -> None:
    """Make ``path`` an empty file by renaming a fresh one over it (see `replace_with_prefix`)."""
    write_file_atomic(path, b"", durable=durable)
