"""A folder of files that the processes of a host publish for each other, within a byte
budget: the one mechanism under the in-place loader's slab pool (`chute.insitu`) and the
block cache of remote objects (`chute._objects`). Each of them names its files and writes
their headers and checksums; this module owns the folder, who may use it, the budget and
the order in which files appear and go.

Crash safety, in the order the steps happen:

- A file is written to a private temporary file (a *reservation*, ``.tmp-`` in its name),
  then renamed to its final name. Only final names are ever opened, so a process dying
  mid-write leaves a reservation that nobody reads, never a torn file. The writer holds an
  ``flock`` on its reservation until the rename; one that nobody holds was left by a dead
  writer, and the next listing of the folder removes it. (Each user also checks a CRC-32C
  over every file it reads, so a file damaged later is caught too.)
- A lock the users take on a name (`try_lock`) is an ``flock``, which the kernel drops
  when its holder dies; a waiter then takes it and makes the file itself.
- Each member holds a shared ``flock`` on ``members.lock`` for as long as it is open. A
  process that can take it exclusively is alone: on joining it clears what dead members
  left, on leaving it removes the folder. A joiner re-checks that the lock file it holds
  is still the one on disk, so it never joins a folder being removed.
- The folder is trusted only as far as it says it is ours: it must be a real folder (not a
  link elsewhere), its ``identity`` file must hold the caller's identity, and a member
  alone in it refuses to clear it if it holds a name this module never creates. Clearing
  and leaving remove only such names, so nothing of anyone else is ever deleted.

Published bytes are kept within the byte budget by removing the least recently used files
(oldest ``mtime``; readers `touch` what they use) first. Files being written count with
their final size, so processes publishing at the same time cannot overshoot the budget
together. The bytes in use are kept in a small ``usage`` file, so a reservation that fits
needs no listing of the folder; the count can only run high (a failed write or a removed
damaged file leaves it so), never low, and a listing that evicts sets it right. A listing
leaves an eighth of the budget free, so it happens once per that many bytes published.
A removed file that a process still has open stays readable to it. A full disk or a
file-size limit only stops publishing: the caller goes on with its own copy.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import uuid
from collections.abc import Iterator, Sequence

from chute._util.safe_open import Folder, create_regular, open_unlinked, read_regular
from chute.errors import UnsafeFileError

__all__ = ["NOT_PUBLISHED", "SharedFolder"]

_RESERVED = ".tmp-"  # in the name of a file being written
_IDENTITY_NEW = "identity.new-"  # the identity file being written
_FIXED = frozenset({"members.lock", "identity", "usage", "evict.lock"})
_IDENTITY_LIMIT = 64  # bytes an ``identity`` file may hold
_USAGE_CHECK = 0x5A17_C0DE_5A17_C0DE  # a torn or stray ``usage`` file fails this, and is recounted
NOT_PUBLISHED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""What stops publishing without stopping the reader: a full disk or quota, a size limit."""


class SharedFolder:
    """The folder ``root`` joined as a member: files named ``<name><suffix>`` published by
    rename within ``budget_bytes``, names locked by ``flock``, the folder removed by the last
    member to leave. ``identity`` (at most 64 bytes) is what the folder must say it holds;
    ``holds`` says what a folder with another identity holds, for the error.

    >>> import os, tempfile
    >>> root = os.path.join(tempfile.mkdtemp(), "pool")
    >>> pool = SharedFolder(root, b"example", 1 << 20, suffix=".bin", holds="other files")
    >>> pool.publish("a", [b"head", b"data"])
    True
    >>> fd = pool.open("a")
    >>> os.read(fd, 16)
    b'headdata'
    >>> os.close(fd)
    >>> pool.close()
    >>> os.path.exists(root)
    False
    """

    def __init__(
        self, root: str, identity: bytes, budget_bytes: int, *, suffix: str, holds: str
    ) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.evicted = 0  # files this member removed to keep within the budget
        self._suffix = suffix
        self._identity = identity
        self._holds = holds
        self._folder = Folder(root)
        self._members = self._join()

    # -- membership ------------------------------------------------------------------

    def _join(self) -> int:
        lock_path = os.path.join(self.root, "members.lock")
        while True:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.root, 0o755)
            mode = os.lstat(self.root).st_mode
            if not stat.S_ISDIR(mode):
                raise UnsafeFileError(
                    f"{self.root} is a link or a file, not a folder chute made; point "
                    "cache_dir elsewhere"
                )
            try:
                fd = create_regular(lock_path, self.root, os.O_RDWR | os.O_EXCL)
                made = True
            except FileExistsError:
                made = False
                try:
                    fd = create_regular(lock_path, self.root)
                except FileNotFoundError:  # the folder was removed meanwhile: try again
                    continue
            except FileNotFoundError:
                continue
            try:
                if _try_lock(fd):
                    self._clear_stale(lock_path if made else None)
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
            os.close(fd)  # the last member removed the folder meanwhile

    def _is_own(self, name: str) -> bool:
        """Whether ``name`` is one this module creates."""
        return (
            name in _FIXED
            or name.endswith((self._suffix, ".lock"))
            or _RESERVED in name
            or name.startswith(_IDENTITY_NEW)
        )

    def _clear_stale(self, made: str | None) -> None:
        """Remove everything dead members left (alone, so nothing here is in use), once the
        folder is known to be ours; ``made`` is the lock file this joiner just created, removed
        again if the folder is refused."""
        entries = [e.name for e in os.scandir(self.root)]
        foreign = [n for n in entries if not self._is_own(n)]
        held = self._read_identity()
        if foreign or (held is not None and held != self._identity):
            if made is not None:
                os.unlink(made)
            what = f"{foreign[0]!r}, which chute did not write" if foreign else self._holds
            raise UnsafeFileError(
                f"{self.root} holds {what}; point cache_dir elsewhere, or remove the folder "
                "once no process uses it"
            )
        for name in entries:
            if name != "members.lock":
                _remove(os.path.join(self.root, name))

    def _read_identity(self) -> bytes | None:
        """What the ``identity`` file holds (``b""`` if it is no small regular file), or
        ``None`` if there is none."""
        try:
            return read_regular(os.path.join(self.root, "identity"), self.root, _IDENTITY_LIMIT)
        except FileNotFoundError:
            return None
        except UnsafeFileError:
            return b""

    def _write_identity(self) -> None:
        path = os.path.join(self.root, "identity")
        new = os.path.join(self.root, f"{_IDENTITY_NEW}{uuid.uuid4().hex}")
        try:
            with open(new, "xb") as f:
                f.write(self._identity)
            os.replace(new, path)
        except OSError as exc:  # a full disk: the next joiner writes it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new)
            if exc.errno not in NOT_PUBLISHED:
                raise

    def _check_identity(self) -> None:
        """The folder must say it holds what this member expects (written by its maker)."""
        held = self._read_identity()
        if held is None:  # its maker could not write it (a full disk)
            self._write_identity()
        elif held != self._identity:
            raise UnsafeFileError(
                f"{self.root} holds {self._holds} (its identity file does not match this "
                "one); point cache_dir elsewhere, or remove the folder once no process uses it"
            )

    def close(self) -> None:
        """Leave; the last member to leave removes what this module created, and the folder
        with it unless something else was put there meanwhile."""
        fd, self._members = self._members, -1
        if fd < 0:
            return
        if not _try_lock(fd):
            os.close(fd)
            return
        try:
            for entry in os.scandir(self.root):
                if self._is_own(entry.name) and entry.name != "members.lock":
                    _remove(entry.path)
            os.unlink(os.path.join(self.root, "members.lock"))
            with contextlib.suppress(OSError):  # not empty: something not ours is there
                os.rmdir(self.root)
        finally:
            os.close(fd)

    # -- files -----------------------------------------------------------------------

    def path(self, name: str) -> str:
        """Where the published file ``name`` lies."""
        return os.path.join(self.root, name + self._suffix)

    def open(self, name: str) -> int:
        """A read-only descriptor of the published file ``name``, a regular file inside the
        folder (`UnsafeFileError` otherwise; FileNotFoundError if none is published)."""
        return self._folder.open(self.path(name))

    @staticmethod
    def touch(fd: int) -> None:
        """Mark the open file as just used (the eviction order is by ``mtime``)."""
        os.utime(fd)

    def discard(self, name: str) -> None:
        """Remove the published file ``name`` (found damaged, under the caller's lock on it)."""
        with self._evict_lock():
            _remove(self.path(name))

    def try_lock(self, name: str) -> int | None:
        """Take the lock on ``name`` without waiting: its descriptor, or ``None`` if another
        descriptor (another process, or another thread here) holds it."""
        fd = _open_lock(os.path.join(self.root, name + ".lock"))
        if _try_lock(fd):
            return fd
        os.close(fd)
        return None

    @staticmethod
    def unlock(fd: int) -> None:
        os.close(fd)  # closing the only descriptor drops its flock

    def publish(self, name: str, parts: Sequence[bytes | memoryview]) -> bool:
        """Write ``parts`` (buffers, in order) as the file ``name``, if that fits within the
        budget; whether it was published (a full disk or a size limit only says no)."""
        nbytes = sum(memoryview(p).nbytes for p in parts)
        tmp = os.path.join(self.root, f"{name}{_RESERVED}{uuid.uuid4().hex}")
        fd = None
        try:
            fd = self._reserve(tmp, nbytes)
            if fd is None:
                return False
            with os.fdopen(fd, "r+b", closefd=False) as f:
                for part in parts:
                    f.write(part)
            with self._evict_lock():  # no listing sees the folder mid-rename
                os.replace(tmp, self.path(name))  # whole, or not at all
            return True
        except OSError as exc:
            if fd is not None:  # still ours: its flock is held
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if exc.errno in NOT_PUBLISHED:
                return False
            raise
        finally:
            if fd is not None:
                os.close(fd)  # drops the reservation's flock

    def _reserve(self, tmp: str, nbytes: int) -> int | None:
        """Create ``tmp`` at ``nbytes`` once that fits in the budget, removing the least
        recently used files to make room; its descriptor, holding its ``flock`` (the mark of
        a live writer), or ``None`` if it cannot fit."""
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
        recently used files until ``nbytes`` more fit with an eighth of the budget to spare
        (so the next few reservations need no listing), or none is left; return the bytes
        then in use."""
        room = nbytes + self.budget_bytes // 8
        files: list[tuple[float, int, str]] = []
        used = 0
        for entry in os.scandir(self.root):
            published = entry.name.endswith(self._suffix)
            if not published and _RESERVED not in entry.name:
                continue
            if not published and _abandoned(entry.path):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            used += st.st_size
            if published:
                files.append((st.st_mtime, st.st_size, entry.path))
        for _, size, path in sorted(files):
            if used + room <= self.budget_bytes:
                break
            _remove(path)
            self.evicted += 1
            used -= size
        return used

    def _read_usage(self) -> int | None:
        """The bytes in use as last counted, or ``None`` if never counted or unreadable
        (a ``usage`` that is not a small regular file is removed, to be written anew)."""
        path = os.path.join(self.root, "usage")
        try:
            if os.path.islink(path):  # written through with O_NOFOLLOW, which refuses one
                raise UnsafeFileError(f"{path} is a link")
            raw = self._folder.read(path, 16)
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
        """The folder's one lock for listing, evicting, removing and renaming files into
        place: a listing that raced a rename could miss a file and overshoot the budget."""
        lock = _open_lock(os.path.join(self.root, "evict.lock"))
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
        finally:
            os.close(lock)


def _open_lock(path: str) -> int:
    """Open (creating) a lock file in the folder, which was checked on joining: the file
    itself must be a regular file, not a link (no path resolution on this hot path)."""
    return open_unlinked(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


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
