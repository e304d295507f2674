"""Byte access to a run's files, in a `plattli/` folder or a stored `metrics.plattli` zip.

Every file is opened the one way `chute._util.safe_open` allows: it must resolve inside the run
(a symlink out is refused), be a regular file (a FIFO would block, `/dev/zero` never
ends), and a whole-file read stops at the size `LIMITS` allows for its kind.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zipfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from chute._util.safe_open import Folder, open_regular
from chute.errors import BadArchiveError, RunFileMissingError, UnsafeFileError

from . import _format as F

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")

#: The most a whole-file read takes, by file. The format sets no size; these lie far above
#: any real run and only stop a huge or endless file from being read into memory.
LIMITS = {F.MANIFEST: 256 << 20, F.CONFIG: 64 << 20, F.HOT: 1 << 30, F.HOT_COMPACTING: 1 << 30}
_OTHER_LIMIT = 1 << 30


def limit_of(rel: str) -> int:
    """The most bytes a whole read of the run file `rel` may take."""
    return LIMITS.get(rel, _OTHER_LIMIT)


def run_folder(pdir: str) -> str:
    """The run a column folder belongs to: a `plattli/` folder's parent (its `config.json`
    may link there, as the writers' default `config="config.json"` does), else itself."""
    pdir = os.path.abspath(pdir)
    return os.path.dirname(pdir) if os.path.basename(pdir) == F.DIR_NAME else pdir


class Source(ABC):
    """Files of one run, addressed by their path relative to the run folder."""

    live: bool

    @abstractmethod
    def where(self, rel: str) -> str:
        """A file's location for error messages."""

    @abstractmethod
    def size(self, rel: str) -> int | None:
        """Size in bytes, or None when the file is absent."""

    @abstractmethod
    def read(self, rel: str, offset: int = 0, length: int = -1) -> bytes | None:
        """Bytes [offset, offset+length) of a file (all when length < 0), None when absent."""

    def array(
        self,
        rel: str,
        dtype: np.dtype[Any],
        start: int,
        count: int,
        like: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        """`count` items of `dtype` from item `start`; a missing file reads as empty. Where
        those items equal the array `like`, a source may return `like` itself."""
        data = self.read(rel, start * dtype.itemsize, count * dtype.itemsize)
        if data is None:
            return np.zeros(0, dtype)
        return np.frombuffer(data, dtype, len(data) // dtype.itemsize)

    @abstractmethod
    def close(self) -> None:
        """Release open handles."""


def open_archive(path: str, root: str | None) -> BinaryIO:
    """A run archive opened for reading: a regular file, resolving inside `root` if given."""
    fd = open_regular(path, os.path.dirname(os.path.realpath(path)) if root is None else root)
    return os.fdopen(fd, "rb")


class DirSource(Source):
    """A live or finished `plattli/` folder; every read goes to the filesystem.

    Each file must resolve inside the run folder (`run_folder`), so a linked column, hot
    log or config that leads out of the run, or a `plattli/` that is a link out, is refused.
    """

    live = True

    def __init__(self, root: str) -> None:
        self.root = root
        self.run = Folder(run_folder(root))

    def close(self) -> None:
        """Nothing is held open between reads."""

    def where(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _open(self, rel: str) -> int | None:
        """A descriptor of the regular file `rel` inside the run, None when it is absent (also
        where a folder on its path is a file)."""
        try:
            return self.run.open(self.where(rel))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def size(self, rel: str) -> int | None:
        fd = self._open(rel)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def read(self, rel: str, offset: int = 0, length: int = -1) -> bytes | None:
        if length < 0:
            try:
                return self.run.read(self.where(rel), limit_of(rel))[offset:]
            except (FileNotFoundError, NotADirectoryError):
                return None
        fd = self._open(rel)
        if fd is None:
            return None
        try:
            buf = bytearray(max(0, min(length, os.fstat(fd).st_size - offset)))
            del buf[_pread_into(fd, memoryview(buf), offset) :]
            return bytes(buf)
        finally:
            os.close(fd)

    def array(
        self,
        rel: str,
        dtype: np.dtype[Any],
        start: int,
        count: int,
        like: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        fd = self._open(rel)
        if fd is None:
            return np.zeros(0, dtype)
        try:
            offset = start * dtype.itemsize
            avail = max(0, (os.fstat(fd).st_size - offset) // dtype.itemsize)
            n = avail if count < 0 else min(count, avail)
            same = 0
            if like is not None and like.dtype == dtype and len(like) == n:
                same = _matching_prefix(fd, like, offset)
                if same == n:
                    return like  # read into a small buffer, not into n fresh items
            out = np.empty(n, dtype)
            if same and like is not None:
                out[:same] = like[:same]
            got = same * dtype.itemsize
            got += _pread_into(fd, out.view(np.uint8)[got:].data, offset + got)
            return out[: got // dtype.itemsize]
        finally:
            os.close(fd)


#: Bytes read at a time to compare a file with an array (64 pages of scratch memory).
_COMPARE_CHUNK = 256 * 1024


def _matching_prefix(fd: int, like: np.ndarray[Any, Any], offset: int) -> int:
    """How many leading items of `like` the file holds from `offset`, compared a chunk at a
    time (a column's steps equal to the last column's cost no allocation of their own)."""
    items = max(1, _COMPARE_CHUNK // like.dtype.itemsize)
    chunk = np.empty(min(items, len(like)), like.dtype)
    done = 0
    while done < len(like):
        n = min(len(chunk), len(like) - done)
        got = _pread_into(fd, chunk[:n].view(np.uint8).data, offset + done * like.dtype.itemsize)
        k = got // like.dtype.itemsize
        if k < n or not np.array_equal(chunk[:n], like[done : done + n]):
            return done  # from the start of this chunk: read (or compare) it afresh
        done += n
    return done


def _pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Fill `buf` from `offset` of `fd`; the bytes read (fewer at the end of the file)."""
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


class ZipSource(Source):
    """A `metrics.plattli` archive, memory-mapped: stored members are read in place.

    `root` is the folder the archive must resolve inside (a run folder's
    `metrics.plattli`); None opens `path` as named. Either way it must be a regular file.
    """

    live = False

    def __init__(self, path: str, root: str | None = None) -> None:
        self.path = path
        self._file = open_archive(path, root)
        try:
            self._zf = zipfile.ZipFile(self._file)
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self._members = self._locate()
        except (zipfile.BadZipFile, struct.error, ValueError) as e:
            self._file.close()
            raise BadArchiveError(f"{path} is not a readable zip archive: {e}", path=path) from None
        except BaseException:
            self._file.close()
            raise
        if F.MANIFEST not in self._members:
            self.close()
            raise RunFileMissingError(
                f"archive {path} has no {F.MANIFEST}: not a Plättli run, or a damaged one",
                path=path,
            )

    def _locate(self) -> dict[str, tuple[int, int] | None]:
        """Data offset and size of each stored member (None: compressed, read via zipfile)."""
        members: dict[str, tuple[int, int] | None] = {}
        for info in self._zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                members[info.filename] = None
                continue
            head = _LOCAL_HEADER.unpack_from(self._map, info.header_offset)
            if head[0] != b"PK\x03\x04":
                raise zipfile.BadZipFile(f"member {info.filename!r} has no local header")
            start = info.header_offset + _LOCAL_HEADER.size + head[9] + head[10]
            if start + info.file_size > len(self._map):
                raise zipfile.BadZipFile(f"member {info.filename!r} runs past the end")
            members[info.filename] = (start, info.file_size)
        return members

    def where(self, rel: str) -> str:
        return f"{self.path}:{rel}"

    def members(self) -> list[zipfile.ZipInfo]:
        """Every member's directory entry (name, size, CRC-32)."""
        return self._zf.infolist()

    def size(self, rel: str) -> int | None:
        if rel not in self._members:
            return None
        return self._zf.getinfo(rel).file_size

    def read(self, rel: str, offset: int = 0, length: int = -1) -> bytes | None:
        if rel not in self._members:
            return None
        loc = self._members[rel]
        if length < 0 and (self.size(rel) or 0) - offset > limit_of(rel):
            raise UnsafeFileError(
                f"{self.where(rel)} holds more than the {limit_of(rel)} bytes its format allows"
            )
        if loc is None:  # compressed: decompress up to the bytes asked for, no further
            with self._zf.open(rel) as f:
                f.seek(offset)
                return f.read(length)
        start, size = loc
        end = start + size if length < 0 else min(start + size, start + offset + length)
        return self._map[start + offset : end]

    def array(
        self,
        rel: str,
        dtype: np.dtype[Any],
        start: int,
        count: int,
        like: np.ndarray[Any, Any] | None = None,
    ) -> np.ndarray[Any, Any]:
        loc = self._members.get(rel)  # read in place: `like` would save nothing
        if loc is None:
            return super().array(rel, dtype, start, count)
        base, size = loc
        avail = size // dtype.itemsize - start
        n = max(0, avail if count < 0 else min(count, avail))
        return np.frombuffer(self._map, dtype, n, base + start * dtype.itemsize)

    def close(self) -> None:
        self._zf.close()
        # Arrays may still view the map; it is then unmapped when the last one goes.
        with contextlib.suppress(BufferError):
            self._map.close()
        self._file.close()


def archive_beside(src: Source) -> str | None:
    """Where a live `plattli/` folder's run keeps its archive once finalized (None: not such
    a folder)."""
    if not isinstance(src, DirSource) or os.path.basename(src.root) != F.DIR_NAME:
        return None
    return os.path.join(os.path.dirname(src.root), F.ZIP_NAME)


def resolve_run_dir(path: str | os.PathLike[str]) -> Path | None:
    """The resolved folder holding `plattli.json`: `path` itself or `path/plattli`, else None.

    >>> import tempfile, chute.metrics as cm
    >>> d = tempfile.mkdtemp(); cm.DirectWriter(d).close()
    >>> cm.resolve_run_dir(d).name
    'plattli'
    """
    p = Path(path).resolve()
    for cand in (p, p / F.DIR_NAME):
        if (cand / F.MANIFEST).is_file():
            return cand
    return None


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """Whether the folder `path` holds columnar metrics (itself or in `plattli/`).

    A finished, zipped run is not a folder of columns any more; `is_run` takes both.

    >>> import tempfile, chute.metrics as cm
    >>> d = tempfile.mkdtemp(); w = cm.DirectWriter(d); w.write(loss=0.5); w.end_step()
    >>> cm.is_run_dir(d), cm.is_run_dir(d + "/plattli")
    (True, True)
    >>> w.finish(); cm.is_run_dir(d), cm.is_run(d)  # now metrics.plattli
    (False, True)
    """
    return resolve_run_dir(path) is not None


def is_run(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a run: a metrics folder, a folder with `metrics.plattli`, or the zip.

    >>> import os, tempfile, chute.metrics as cm
    >>> runs = tempfile.mkdtemp()
    >>> for name in ("a", "b"):
    ...     with cm.DirectWriter(os.path.join(runs, name)) as w:
    ...         w.write(loss=0.5); w.end_step()
    >>> os.mkdir(os.path.join(runs, "notes"))
    >>> sorted(n for n in os.listdir(runs) if cm.is_run(os.path.join(runs, n)))
    ['a', 'b']
    """
    p = os.fspath(path)
    if os.path.isfile(p):
        return _is_run_zip(p, None)
    return is_run_dir(p) or _is_run_zip(os.path.join(p, F.ZIP_NAME), p)


def _is_run_zip(path: str, root: str | None) -> bool:
    """Whether `path` is a run archive; inside a run folder `root` it must not lead out."""
    if not os.path.isfile(path):
        return False
    try:
        with open_archive(path, root) as f, zipfile.ZipFile(f) as zf:
            return F.MANIFEST in zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):  # UnsafeFileError is an OSError
        return False


def open_source(path: str, kind: str | None) -> Source:
    """The files of the run at `path` (`kind` "dir", "zip" or None to tell by what is there)."""
    if kind == "dir":
        return DirSource(path)
    if kind == "zip":
        return ZipSource(path)
    if kind is not None:
        raise ValueError(f"kind must be 'dir', 'zip' or None, got {kind!r}")
    if os.path.isfile(path):
        return ZipSource(path)
    zpath = os.path.join(path, F.ZIP_NAME)
    if os.path.isfile(zpath):
        return ZipSource(zpath, root=path)
    rdir = resolve_run_dir(path)
    if rdir is None:
        raise FileNotFoundError(f"no metrics run at {path!r} (no {F.ZIP_NAME} or {F.DIR_NAME}/)")
    return DirSource(str(rdir))
