"""How the store cuts chunk files without shrinking anything a reader maps."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from chute._util.fs import fsync_dir, pwrite_all, write_file_atomic


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
