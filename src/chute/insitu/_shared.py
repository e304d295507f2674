"""The on-disk chunk pool: decoded slabs in files under ``cache_dir``, shared by processes.

Every process on a host that opens the same archive (same resolved location, the same
metadata documents, byte for byte and by their file stamps, the same variables, geometry
and chunk transforms) with the same ``cache_dir`` joins one directory,
``cache_dir/chute-<digest>/``, whose ``identity`` file (the whole SHA-256 of the identity)
each joiner checks against its own.
An archive rewritten in place, or a ``latest.zarr`` link moved, has another identity, so
its readers get another pool and never the old archive's slabs. The first process to need
a slab takes its lock, decodes it and publishes it as a file; the others wait for the file
and map it, so each slab is decoded once per host and the processes that did not decode it
share its pages.

Crash safety, in the order the steps happen:

- A slab is written to a private temporary file (a *reservation*, ``.tmp-`` in its name),
  then renamed to its final name. Only final names are ever mapped, so a process dying
  mid-write leaves a reservation that nobody reads, never a torn slab. The writer holds an
  ``flock`` on its reservation until the rename; one that nobody holds was left by a dead
  writer, and the next listing of the folder removes it.
- A slab file is trusted for nothing: it must be a regular file inside the pool, its header
  must name this slab of this pool, a dtype without Python objects and the shape (and, with
  no chunk transform, the dtype) the geometry gives, its size must match, and a CRC-32C over
  its header and data must hold. Anything else is damage: the file is removed under the
  slab's lock and the slab decoded again from the archive (the pool is a cache).
- A slab is stale when the chunk files it was decoded from changed since (data rewritten
  without touching the metadata, which the identity covers): its header records their
  stamp (``chunk_stamp``, taken before they were read, so a change during the read shows
  too), and a loader whose stamp of them now differs treats the file as damaged.
- A slab's lock is an ``flock`` on its lock file, which the kernel drops when its holder
  dies; a waiter then takes it and decodes the slab itself.
- Each member holds a shared ``flock`` on ``members.lock`` for as long as it is open. A
  process that can take it exclusively is alone: on joining it clears what dead members
  left, on leaving it removes the directory. A joiner re-checks that the lock file it
  holds is still the one on disk, so it never joins a directory being removed.

Published bytes are kept within the byte budget by removing the least recently used
files first. A removed file that a process still maps stays readable to it (the kernel
keeps its pages until unmapped); the disk space is freed when the last mapping goes. A
full disk or a file-size limit only stops publishing: the slab is served from the decode.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import mmap
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from chute._native import crc32c
from chute._util.safe_open import open_regular, read_regular
from chute.errors import UnsafeFileError

from ._pool import SlabKey

_HEADER = 256  # bytes before the data: magic, CRC-32C, then JSON, space-padded
_MAGIC = b"CHUTESL2"
_CRC_END = len(_MAGIC) + 4  # the CRC covers the header from here on, then the data
_SUFFIX = ".slab"
_RESERVED = ".tmp-"  # in the name of a slab file being written
_USAGE_CHECK = 0x5A17_C0DE_5A17_C0DE  # a torn or stray ``usage`` file fails this, and is recounted
_IDENTITY_LIMIT = 64  # bytes an ``identity`` file may hold: a SHA-256, in hex
# what stops publishing without stopping the pass: a full disk or quota, a file-size limit
_NOT_PUBLISHED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class _Damaged(Exception):
    """A slab file that is not what its name promises."""


class SharedChunks:
    """A host-wide pool of decoded slabs under ``cache_dir`` for one archive identity."""

    def __init__(self, cache_dir: str, identity: str, budget_bytes: int) -> None:
        if not os.path.isdir(cache_dir):
            raise FileNotFoundError(f"cache_dir {cache_dir!r} is not a directory")
        full = hashlib.sha256(identity.encode()).hexdigest()
        self.digest = full[:20]
        self.root = os.path.join(cache_dir, f"chute-{self.digest}")
        self.budget_bytes = budget_bytes
        self.discarded = 0  # damaged or stale slab files this member removed
        self._identity = full.encode()  # what the folder's ``identity`` file must hold
        self._members = self._join()

    # -- membership ------------------------------------------------------------------

    def _join(self) -> int:
        lock_path = os.path.join(self.root, "members.lock")
        while True:
            os.makedirs(self.root, exist_ok=True)
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # removed between makedirs and open: try again
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                alone = True
            except BlockingIOError:
                alone = False
            try:
                if alone:
                    self._clear_stale()
                    self._write_identity()
                fcntl.flock(fd, fcntl.LOCK_SH)
                try:
                    same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    self._check_identity()
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the last member removed the directory meanwhile

    def _clear_stale(self) -> None:
        """Remove everything dead members left (alone, so nothing here is in use)."""
        for entry in os.scandir(self.root):
            if entry.name != "members.lock":
                _remove(entry.path)

    def _write_identity(self) -> None:
        path = os.path.join(self.root, "identity")
        new = f"{path}.new-{uuid.uuid4().hex}"
        try:
            with open(new, "xb") as f:
                f.write(self._identity)
            os.replace(new, path)
        except OSError as exc:  # a full disk: the next joiner writes it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new)
            if exc.errno not in _NOT_PUBLISHED:
                raise

    def _check_identity(self) -> None:
        """The folder must say it holds this archive's slabs (written by whoever made it)."""
        path = os.path.join(self.root, "identity")
        try:
            held = read_regular(path, self.root, _IDENTITY_LIMIT)
        except FileNotFoundError:  # its maker died before writing it
            self._write_identity()
            return
        except UnsafeFileError:
            held = b""
        if held != self._identity:
            raise UnsafeFileError(
                f"{self.root} holds the slabs of another archive (its identity file does not "
                "match this one); point cache_dir elsewhere, or remove the folder once no "
                "process uses it"
            )

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

    def _name(self, key: SlabKey) -> str:
        return f"{hashlib.sha256(key[0].encode()).hexdigest()[:16]}-{key[1]}"

    def published(self, key: SlabKey) -> bool:
        """Whether the slab has a published file (one ``lstat``: cheap enough for the event
        loop; `load` then checks it)."""
        return os.path.lexists(os.path.join(self.root, self._name(key) + _SUFFIX))

    def load(
        self,
        key: SlabKey,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | None,
        source: str,
        *,
        held: bool = False,
    ) -> np.ndarray | None:
        """The published slab, mapped read-only and checked; ``None`` if absent, damaged or
        stale.

        ``shape`` is what the geometry gives for the slab, ``dtype`` too unless a chunk
        transform may change it (``None``); ``source`` is the stamp of its chunks now
        (``chunk_stamp``), which the file's must match. With ``held`` (the caller holds the
        slab's lock, so nobody publishes it meanwhile) a damaged or stale file is removed,
        to be decoded again.
        """
        name = self._name(key)
        path = os.path.join(self.root, name + _SUFFIX)
        try:
            return self._map(path, name, shape, dtype, source)
        except FileNotFoundError:
            return None
        except (_Damaged, UnsafeFileError):
            if held:
                with self._evict_lock():
                    _remove(path)
                self.discarded += 1
            return None

    def _map(
        self,
        path: str,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | None,
        source: str,
    ) -> np.ndarray:
        fd = open_regular(path, self.root)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, _HEADER, 0)
            found = self._check_header(head, name, shape, dtype, source)
            if size != _HEADER + math.prod(shape) * found.itemsize:
                raise _Damaged(f"{path}: its size does not match its header")
            if size == _HEADER:
                data = np.zeros(shape, dtype=found)
            else:
                view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
                data = np.frombuffer(view, found, math.prod(shape), _HEADER).reshape(shape)
            if crc32c(_bytes_of(data), crc32c(head[_CRC_END:])) != _stored_crc(head):
                raise _Damaged(f"{path}: its checksum does not match")
            os.utime(fd)  # most recently used
            return data
        finally:
            os.close(fd)

    def _check_header(
        self,
        head: bytes,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any] | None,
        source: str,
    ) -> np.dtype[Any]:
        """The dtype a slab file's header names, if the header describes this slab as
        decoded from its chunks as they are now."""
        if len(head) != _HEADER or not head.startswith(_MAGIC):
            raise _Damaged(f"{name}: no slab header")
        try:
            meta = json.loads(head[_CRC_END:])
            found = np.dtype(meta["dtype"]) if isinstance(meta, dict) else None
            said = tuple(int(n) for n in meta["shape"]) if isinstance(meta, dict) else ()
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            raise _Damaged(f"{name}: unreadable header ({exc})") from None
        if found is None or meta.get("slab") != name or meta.get("pool") != self.digest:
            raise _Damaged(f"{name}: the file of another slab or pool")
        if found.hasobject or found.subdtype is not None or said != shape:
            raise _Damaged(f"{name}: header says {found} {said}, the geometry {shape}")
        if dtype is not None and found.newbyteorder("<") != dtype.newbyteorder("<"):
            raise _Damaged(f"{name}: header says {found}, the geometry {dtype}")
        if meta.get("source", "") != source:
            raise _Damaged(f"{name}: stale, its chunks changed since it was decoded")
        return found

    def try_lock(self, key: SlabKey) -> int | None:
        """Take the slab's decode lock without waiting: its fd, or ``None`` if held."""
        path = os.path.join(self.root, self._name(key) + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def unlock(fd: int) -> None:
        os.close(fd)  # closing the only descriptor drops its flock

    def publish(self, key: SlabKey, data: np.ndarray, source: str) -> None:
        """Write ``data``, decoded from chunks whose stamp was ``source`` before they were
        read, for the other processes (the publisher goes on with its own copy, whose
        buffer its pool recycles). A slab that cannot be kept within the budget, or a full
        disk or file-size limit, is not published."""
        data = np.ascontiguousarray(data)
        name = self._name(key)
        head = _header(name, self.digest, data, source)
        if head is None:  # too many axes to describe in a header: not cached on disk
            return
        tmp = os.path.join(self.root, f"{name}{_RESERVED}{uuid.uuid4().hex}")
        fd = None
        try:
            fd = self._reserve(tmp, _HEADER + data.nbytes)
            if fd is None:
                return
            with os.fdopen(fd, "r+b", closefd=False) as f:
                f.write(head)
                f.write(_bytes_of(data).data)
            with self._evict_lock():  # no reservation lists the folder mid-rename
                os.replace(tmp, os.path.join(self.root, name + _SUFFIX))  # whole, or not at all
        except OSError as exc:
            if fd is not None:  # still ours: its flock is held
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if exc.errno in _NOT_PUBLISHED:
                return
            raise
        finally:
            if fd is not None:
                os.close(fd)  # drops the reservation's flock

    def _reserve(self, tmp: str, nbytes: int) -> int | None:
        """Create ``tmp`` at ``nbytes`` once that fits in the budget, removing the least
        recently used slabs to make room; its descriptor, holding its ``flock`` (the mark
        of a live writer), or ``None`` if it cannot fit.

        Files being written count with their final size, so processes publishing at the
        same time cannot overshoot the budget together. The bytes in use are kept in a
        small ``usage`` file, so a reservation that fits needs no listing of the folder;
        the count can only run high (a failed write leaves it so), never low, and a
        listing that evicts sets it right.
        """
        if nbytes > self.budget_bytes:
            return None
        with self._evict_lock():
            used = self._read_usage()
            if used is None or used + nbytes > self.budget_bytes:
                used = self._evict_for(nbytes)
            if used + nbytes > self.budget_bytes:
                self._write_usage(used)
                return None
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # taken before any listing can see it
                os.ftruncate(fd, nbytes)
                self._write_usage(used + nbytes)
            except BaseException:
                os.unlink(tmp)
                os.close(fd)
                raise
            return fd

    def _evict_for(self, nbytes: int) -> int:
        """List the folder, remove the reservations of dead writers, then the least
        recently used slabs until ``nbytes`` more fit with an eighth of the budget to spare
        (so the next few reservations need no listing), or none is left; return the bytes
        then in use."""
        room = nbytes + self.budget_bytes // 8
        files: list[tuple[float, int, str]] = []
        used = 0
        for entry in os.scandir(self.root):
            slab = entry.name.endswith(_SUFFIX)
            if not slab and _RESERVED not in entry.name:
                continue
            if not slab and _abandoned(entry.path):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            used += st.st_size
            if slab:
                files.append((st.st_mtime, st.st_size, entry.path))
        for _, size, path in sorted(files):
            if used + room <= self.budget_bytes:
                break
            _remove(path)
            used -= size
        return used

    def _read_usage(self) -> int | None:
        """The bytes in use as last counted, or ``None`` if never counted or unreadable
        (a ``usage`` that is not a small regular file is removed, to be written anew)."""
        path = os.path.join(self.root, "usage")
        try:
            if os.path.islink(path):  # written through with O_NOFOLLOW, which refuses one
                raise UnsafeFileError(f"{path} is a link")
            raw = read_regular(path, self.root, 16)
        except FileNotFoundError:
            return None
        except UnsafeFileError:
            _remove(path)
            return None
        if len(raw) != 16:
            return None
        used, check = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
        return used if check == used ^ _USAGE_CHECK else None

    def _write_usage(self, used: int) -> None:
        raw = used.to_bytes(8, "little") + (used ^ _USAGE_CHECK).to_bytes(8, "little")
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(os.path.join(self.root, "usage"), flags, 0o644)
        try:
            os.pwrite(fd, raw, 0)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _evict_lock(self) -> Iterator[None]:
        """The pool's one lock for listing, evicting, removing and renaming slabs into
        place: a listing that raced a rename could miss a slab and overshoot the budget."""
        path = os.path.join(self.root, "evict.lock")
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)


def _abandoned(path: str) -> bool:
    """Whether the reservation at ``path`` was left by a dead writer (nobody holds its
    ``flock``: a live writer takes it before releasing the evict lock the caller holds);
    if so it is removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:  # a link or other stray: no writer made it
        _remove(path)
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    except OSError:  # not lockable: no writer made it
        pass
    try:
        _remove(path)
    finally:
        os.close(fd)
    return True


def _remove(path: str) -> None:
    """Remove whatever is at ``path`` (a folder too), if anything."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path, ignore_errors=True)


def _bytes_of(data: np.ndarray) -> np.ndarray:
    """A contiguous array's bytes, as flat uint8 (any dtype without objects)."""
    return data.reshape(-1).view(np.uint8)


def _stored_crc(head: bytes) -> int:
    return int.from_bytes(head[len(_MAGIC) : _CRC_END], "little")


def _header(name: str, pool: str, data: np.ndarray, source: str) -> bytes | None:
    """The header naming slab ``name`` of ``pool``, ``data``'s dtype and shape and the
    stamp of the chunks it was decoded from, with the CRC-32C of its own text and the data;
    ``None`` if that does not fit in the header."""
    meta = {"slab": name, "pool": pool, "dtype": data.dtype.str, "shape": list(data.shape)}
    text = json.dumps({**meta, "source": source} if source else meta).encode()
    if _CRC_END + len(text) > _HEADER:
        return None
    body = text.ljust(_HEADER - _CRC_END, b" ")
    crc = crc32c(_bytes_of(data), crc32c(body))
    return _MAGIC + crc.to_bytes(4, "little") + body
