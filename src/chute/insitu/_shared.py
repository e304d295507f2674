"""The on-disk chunk pool: decoded slabs in files under ``cache_dir``, shared by processes.

Every process on a host that opens the same archive (same store, variables, geometry
and chunk transforms) with the same ``cache_dir`` joins one directory,
``cache_dir/chute-<digest>/``. The first process to need a slab takes its lock, decodes
it and publishes it as a file; the others wait for the file and map it, so each slab is
decoded once per host and the processes that did not decode it share its pages.

Crash safety, in the order the steps happen:

- A slab is written to a private temporary file, then renamed to its final name. Only
  final names are ever mapped, so a process dying mid-write leaves a temporary file that
  nobody reads, never a torn slab. A final file whose size does not match its header is
  treated as absent, and rewritten.
- A slab's lock is an ``flock`` on its lock file, which the kernel drops when its holder
  dies; a waiter then takes it and decodes the slab itself.
- Each member holds a shared ``flock`` on ``members.lock`` for as long as it is open. A
  process that can take it exclusively is alone: on joining it clears what dead members
  left, on leaving it removes the directory. A joiner re-checks that the lock file it
  holds is still the one on disk, so it never joins a directory being removed.

Published bytes are kept within the byte budget by removing the least recently used
files first. A removed file that a process still maps stays readable to it (the kernel
keeps its pages until unmapped); the disk space is freed when the last mapping goes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._pool import SlabKey

_HEADER = 256  # bytes before the data: magic, then JSON (dtype, shape), space-padded
_MAGIC = b"CHUTESLB"
_SUFFIX = ".slab"
_USAGE_CHECK = 0x5A17_C0DE_5A17_C0DE  # a torn or stray ``usage`` file fails this, and is recounted


class SharedChunks:
    """A host-wide pool of decoded slabs under ``cache_dir`` for one archive identity."""

    def __init__(self, cache_dir: str, identity: str, budget_bytes: int) -> None:
        if not os.path.isdir(cache_dir):
            raise FileNotFoundError(f"cache_dir {cache_dir!r} is not a directory")
        digest = hashlib.sha256(identity.encode()).hexdigest()[:20]
        self.root = os.path.join(cache_dir, f"chute-{digest}")
        self.budget_bytes = budget_bytes
        self._members = self._join()

    # -- membership ------------------------------------------------------------------

    def _join(self) -> int:
        lock_path = os.path.join(self.root, "members.lock")
        while True:
            os.makedirs(self.root, exist_ok=True)
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # removed between makedirs and open: try again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except BlockingIOError:
                alone = False
            if alone:
                self._clear_stale()
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # the last member removed the directory meanwhile

    def _clear_stale(self) -> None:
        """Remove everything dead members left (alone, so nothing here is in use)."""
        for entry in os.scandir(self.root):
            if entry.name != "members.lock":
                os.unlink(entry.path)

    def close(self) -> None:
        """Leave; the last member to leave removes the directory."""
        fd, self._members = self._members, -1
        if fd < 0:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return
        shutil.rmtree(self.root, ignore_errors=True)
        os.close(fd)

    # -- slabs -----------------------------------------------------------------------

    def _path(self, key: SlabKey) -> str:
        name = hashlib.sha256(key[0].encode()).hexdigest()[:16]
        return os.path.join(self.root, f"{name}-{key[1]}")

    def load(self, key: SlabKey) -> np.ndarray | None:
        """The published slab, mapped read-only; ``None`` if absent or not whole."""
        path = self._path(key) + _SUFFIX
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, _HEADER, 0)
            meta = _parse_header(head)
            if meta is None:
                return None
            dtype, shape = meta
            if size != _HEADER + int(np.prod(shape)) * dtype.itemsize:
                return None
            os.utime(fd)  # most recently used
            if size == _HEADER:
                return np.zeros(shape, dtype=dtype)
            mapped: np.ndarray = np.memmap(path, dtype=dtype, mode="r", offset=_HEADER, shape=shape)
            return mapped
        finally:
            os.close(fd)

    def try_lock(self, key: SlabKey) -> int | None:
        """Take the slab's decode lock without waiting: its fd, or ``None`` if held."""
        fd = os.open(self._path(key) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def unlock(fd: int) -> None:
        os.close(fd)  # closing the only descriptor drops its flock

    def publish(self, key: SlabKey, data: np.ndarray) -> None:
        """Write ``data`` for the other processes (the publisher goes on with its own copy,
        whose buffer its pool recycles). A slab that cannot be kept within the budget, or
        a full disk, is not published."""
        data = np.ascontiguousarray(data)
        final = self._path(key) + _SUFFIX
        tmp = f"{self._path(key)}.tmp-{uuid.uuid4().hex}"
        try:
            if not self._reserve(tmp, _HEADER + data.nbytes):
                return
            with open(tmp, "r+b") as f:
                f.write(_header(data))
                f.write(data.data.cast("B"))
            with self._evict_lock():  # no reservation lists the folder mid-rename
                os.replace(tmp, final)  # whole, or not there at all
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return
            raise

    def _reserve(self, tmp: str, nbytes: int) -> bool:
        """Create ``tmp`` at ``nbytes`` once that fits in the budget, removing the least
        recently used slabs to make room; ``False`` if it cannot fit.

        Files being written count with their final size, so processes publishing at the
        same time cannot overshoot the budget together. The bytes in use are kept in a
        small ``usage`` file, so a reservation that fits needs no listing of the folder;
        the count can only run high (a failed write leaves it so), never low, and a
        listing that evicts sets it right.
        """
        if nbytes > self.budget_bytes:
            return False
        with self._evict_lock():
            used = self._read_usage()
            if used is None or used + nbytes > self.budget_bytes:
                used = self._evict_for(nbytes)
            fits = used + nbytes <= self.budget_bytes
            if fits:
                with open(tmp, "wb") as f:
                    f.truncate(nbytes)
                used += nbytes
            self._write_usage(used)
            return fits

    def _evict_for(self, nbytes: int) -> int:
        """List the folder, remove least recently used slabs until ``nbytes`` more fit
        with an eighth of the budget to spare (so the next few reservations need no
        listing), or none is left; return the bytes then in use."""
        room = nbytes + self.budget_bytes // 8
        files: list[tuple[float, int, str]] = []
        used = 0
        for entry in os.scandir(self.root):
            if entry.name.endswith(_SUFFIX) or ".tmp-" in entry.name:
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                used += st.st_size
                if entry.name.endswith(_SUFFIX):
                    files.append((st.st_mtime, st.st_size, entry.path))
        for _, size, path in sorted(files):
            if used + room <= self.budget_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            used -= size
        return used

    def _read_usage(self) -> int | None:
        """The bytes in use as last counted, or ``None`` if never counted or unreadable."""
        try:
            with open(os.path.join(self.root, "usage"), "rb") as f:
                raw = f.read(16)
        except FileNotFoundError:
            return None
        if len(raw) != 16:
            return None
        used, check = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
        return used if check == used ^ _USAGE_CHECK else None

    def _write_usage(self, used: int) -> None:
        raw = used.to_bytes(8, "little") + (used ^ _USAGE_CHECK).to_bytes(8, "little")
        fd = os.open(os.path.join(self.root, "usage"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, raw, 0)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _evict_lock(self) -> Iterator[None]:
        """The pool's one lock for listing, evicting and renaming slabs into place: a
        listing that raced a rename could miss a slab and overshoot the budget."""
        lock = os.open(os.path.join(self.root, "evict.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)


def _header(data: np.ndarray) -> bytes:
    text = json.dumps({"dtype": data.dtype.str, "shape": list(data.shape)}).encode()
    head = _MAGIC + text
    if len(head) > _HEADER:
        raise ValueError(f"slab of shape {data.shape} has too many axes to cache on disk")
    return head.ljust(_HEADER, b" ")


def _parse_header(head: bytes) -> tuple[np.dtype[Any], tuple[int, ...]] | None:
    if len(head) != _HEADER or not head.startswith(_MAGIC):
        return None
    try:
        meta = json.loads(head[len(_MAGIC) :])
        return np.dtype(meta["dtype"]), tuple(int(n) for n in meta["shape"])
    except (ValueError, KeyError, TypeError):
        return None
