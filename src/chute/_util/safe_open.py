"""Opening a file chute was pointed at: a regular file inside its folder, read with a bound.

An internal module shared by every part that opens a file it did not create in this process
(a dataset's manifest and shards, a metric run's files for the dashboard, the in-place
loader's slab pool). One rule for all of them: the path, once symlinks are resolved, lies
inside the folder the caller was given; it is a regular file, not a FIFO (whose open or read
would block), a device (``/dev/zero`` never ends) or a folder; and a whole-file read stops
at the size the format allows instead of reading until memory runs out.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from chute.errors import UnsafeFileError

__all__ = [
    "Folder",
    "create_regular",
    "inside",
    "open_regular",
    "open_unlinked",
    "read_regular",
]

# O_NONBLOCK makes open() of a FIFO with no writer return at once instead of hanging; the
# fstat that follows then refuses it. It is cleared again for regular files.
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


def _within(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def _outside(path: object, root: str) -> str:
    """The refusal of a path that resolves outside ``root``; where it leads is not said (a
    dashboard shows these messages to whoever can reach it)."""
    return f"{path} leads outside {root} (a link out of it): not read"


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> str:
    """``path`` with its symlinks resolved, if that lies inside ``root`` (also resolved).

    >>> import os, tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "a.json").write_text("{}")
    2
    >>> inside(root / "a.json", root) == os.path.realpath(root / "a.json")
    True
    >>> (root / "out.json").symlink_to("/etc/hostname")
    >>> inside(root / "out.json", root)
    Traceback (most recent call last):
    ...
    chute.errors.UnsafeFileError: .../out.json leads outside ... (a link out of it): not read
    """
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if not _within(real, real_root):
        raise UnsafeFileError(_outside(path, real_root))
    return real


class Folder:
    """A folder whose files are opened many times (a live metric run, a store's chunk files):
    its real path is resolved once, and each open is then one ``open`` and one look at where
    the descriptor landed, instead of resolving both paths again. The cached real path can
    only make a check stricter (a folder re-pointed since is looked up again before a file is
    refused), so the rule is `open_regular`'s.

    >>> import os, tempfile
    >>> folder = Folder(tempfile.mkdtemp())
    >>> with open(os.path.join(folder.root, "a.f32"), "wb") as f:
    ...     _ = f.write(b"1234")
    >>> fd = folder.open(os.path.join(folder.root, "a.f32"))
    >>> os.read(fd, 8)
    b'1234'
    >>> os.close(fd)
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self._real = os.path.realpath(self.root)

    def open(self, path: str | os.PathLike[str], *, write: bool = False) -> int:
        """`open_regular` of ``path`` in this folder."""
        flags = (_FLAGS | os.O_RDWR) if write else _FLAGS
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            # The file is a link: resolve it before opening what it names.
            return _regular(os.open(inside(path, self.root), flags), path)
        try:
            real = _landed(fd, path)
            if not _within(real, self._real):
                self._real = os.path.realpath(self.root)
                if not _within(real, self._real):
                    raise UnsafeFileError(_outside(path, self._real))
        except BaseException:
            os.close(fd)
            raise
        return _regular(fd, path)

    def read(self, path: str | os.PathLike[str], limit: int) -> bytes:
        """`read_regular` of ``path`` in this folder."""
        fd = self.open(path)
        try:
            parts: list[bytes] = []
            size = 0
            while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
                parts.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise UnsafeFileError(
                        f"{path} holds more than the {limit} bytes its format allows"
                    )
            return b"".join(parts)
        finally:
            os.close(fd)


def _landed(fd: int, path: str | os.PathLike[str]) -> str:
    """Where the open descriptor ``fd`` really is: the kernel's own answer where /proc has it
    (no race with a rename), else ``path`` resolved."""
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    return where.removesuffix(" (deleted)")


def open_regular(
    path: str | os.PathLike[str], root: str | os.PathLike[str], *, write: bool = False
) -> int:
    """Open ``path`` read-only (read-write with ``write``) and return its descriptor, if it
    is a regular file inside ``root``; else `UnsafeFileError` (a missing file stays a
    FileNotFoundError).

    >>> import os, tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> os.mkfifo(root / "pipe")
    >>> open_regular(root / "pipe", root)
    Traceback (most recent call last):
    ...
    chute.errors.UnsafeFileError: .../pipe is a FIFO, not a regular file
    """
    return Folder(root).open(path, write=write)


def create_regular(
    path: str | os.PathLike[str], root: str | os.PathLike[str], flags: int = os.O_RDWR
) -> int:
    """Open (creating if missing) a file chute writes in ``root``, and return its descriptor:
    its folder must lie inside ``root`` and the file itself must be a regular file, not a
    link (a lock or a column file linked elsewhere would be written there), a FIFO or a
    device; else `UnsafeFileError`. ``flags`` adds to the open (``os.O_APPEND`` ...).

    >>> import os, tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> os.close(create_regular(root / "run.lock", root))
    >>> (root / "out.lock").symlink_to("/tmp/elsewhere")
    >>> create_regular(root / "out.lock", root)
    Traceback (most recent call last):
    ...
    chute.errors.UnsafeFileError: .../out.lock is a link; chute opens only regular files here
    """
    inside(Path(path).parent, root)
    return open_unlinked(path, flags | os.O_CREAT)


def open_unlinked(
    path: str | os.PathLike[str], flags: int = os.O_RDONLY, *, dir_fd: int | None = None
) -> int:
    """Open ``path`` itself, not what a link there points to, and only if it is a regular
    file (``flags`` as for ``os.open``; a FIFO is refused at once, never waited on); else
    `UnsafeFileError`. No folder check: for a hot path whose folder was checked once
    (the in-place loader's chunk files; a file named relative to an open folder,
    ``dir_fd``, which pins that folder), and for `create_regular`.

    >>> import os, tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "link").symlink_to("/etc/hostname")
    >>> open_unlinked(root / "link")
    Traceback (most recent call last):
    ...
    chute.errors.UnsafeFileError: .../link is a link; chute opens only regular files here
    """
    extra = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | extra, 0o644, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeFileError(
                f"{path} is a link; chute opens only regular files here"
            ) from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing only
            raise UnsafeFileError(f"{path} is a FIFO, not a regular file") from None
        raise
    return _regular(fd, path)


def read_regular(path: str | os.PathLike[str], root: str | os.PathLike[str], limit: int) -> bytes:
    """The whole of ``path`` (checked as `open_regular` does), if it holds at most ``limit``
    bytes; a larger file is an `UnsafeFileError` naming both sizes, read no further.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "small").write_bytes(b"abc")
    3
    >>> read_regular(root / "small", root, limit=3)
    b'abc'
    >>> read_regular(root / "small", root, limit=2)
    Traceback (most recent call last):
    ...
    chute.errors.UnsafeFileError: .../small holds more than the 2 bytes its format allows
    """
    return Folder(root).read(path, limit)


def _regular(fd: int, path: str | os.PathLike[str]) -> int:
    """``fd`` made blocking again, if it is a regular file; else closed and refused."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(f"{path} is {_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"
