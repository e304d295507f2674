"""Byte access to a run's files, in a `plattli/` folder or a stored `metrics.plattli` zip."""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zipfile
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from chute.errors import CorruptRunError, RunFileMissingError

from ._format import MANIFEST

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")


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

    def array(self, rel: str, dtype: np.dtype[Any], start: int, count: int) -> np.ndarray[Any, Any]:
        """`count` items of `dtype` from item `start`; a missing file reads as empty."""
        data = self.read(rel, start * dtype.itemsize, count * dtype.itemsize)
        if data is None:
            return np.zeros(0, dtype)
        return np.frombuffer(data, dtype, len(data) // dtype.itemsize)

    @abstractmethod
    def close(self) -> None:
        """Release open handles."""


class DirSource(Source):
    """A live or finished `plattli/` folder; every read goes to the filesystem."""

    live = True

    def __init__(self, root: str) -> None:
        self.root = root

    def close(self) -> None:
        """Nothing is held open between reads."""

    def where(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def size(self, rel: str) -> int | None:
        try:
            return os.stat(os.path.join(self.root, rel)).st_size
        except FileNotFoundError:
            return None

    def read(self, rel: str, offset: int = 0, length: int = -1) -> bytes | None:
        try:
            with open(os.path.join(self.root, rel), "rb", buffering=0) as f:
                if length < 0:
                    if offset:
                        f.seek(offset)
                    return f.read()
                return os.pread(f.fileno(), length, offset)
        except FileNotFoundError:
            return None

    def array(self, rel: str, dtype: np.dtype[Any], start: int, count: int) -> np.ndarray[Any, Any]:
        try:
            return np.fromfile(
                os.path.join(self.root, rel), dtype, count, offset=start * dtype.itemsize
            )
        except FileNotFoundError:
            return np.zeros(0, dtype)


class ZipSource(Source):
    """A `metrics.plattli` archive, memory-mapped: stored members are read in place."""

    live = False

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "rb")  # noqa: SIM115 - kept open until close()
        try:
            self._zf = zipfile.ZipFile(self._file)
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self._members = self._locate()
        except (zipfile.BadZipFile, struct.error, ValueError) as e:
            self._file.close()
            raise CorruptRunError(f"{path} is not a readable zip archive: {e}", path=path) from None
        except BaseException:
            self._file.close()
            raise
        if MANIFEST not in self._members:
            self.close()
            raise RunFileMissingError(
                f"archive {path} has no {MANIFEST}: not a Plättli run, or a damaged one", path=path
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
        if loc is None:
            data = self._zf.read(rel)
            return data[offset:] if length < 0 else data[offset : offset + length]
        start, size = loc
        end = start + size if length < 0 else min(start + size, start + offset + length)
        return self._map[start + offset : end]

    def array(self, rel: str, dtype: np.dtype[Any], start: int, count: int) -> np.ndarray[Any, Any]:
        loc = self._members.get(rel)
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
