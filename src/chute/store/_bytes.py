"""Records as the writer takes them: plain-data bytes laid end to end, with their lengths
checked against the format's record cap."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from chute.store import _format as fmt


def concat(
    records: Iterable[bytes | bytearray | memoryview | npt.NDArray[Any]],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
    """Lay byte-like records end to end; returns the bytes and each record's length."""
    parts = [bytes_of(r) if isinstance(r, np.ndarray) else np.frombuffer(r, np.uint8)
             for r in records]  # fmt: skip
    lengths = np.array([p.size for p in parts], np.uint64)
    return (np.concatenate(parts) if parts else np.empty(0, np.uint8)), lengths


def bytes_of(array: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """The bytes of a plain-data array, flat; an array of Python objects is refused (its
    bytes are pointers, meaningless once stored)."""
    if array.dtype.hasobject:
        raise TypeError(f"dtype {array.dtype} holds Python objects; only plain data is stored")
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def record_lengths(lengths: Any) -> npt.NDArray[np.int64]:
    """Record lengths in bytes as a flat int64 array: integers (a bool, a float or an int
    past 64 bits is a TypeError), none negative or over the record cap (ValueError)."""
    lens = np.asarray(lengths).reshape(-1)
    if lens.size and lens.dtype.kind not in "iu":  # objects: ints past 64 bits
        raise TypeError(f"record lengths must be integers of at most 1 MiB, got {lengths!r}")
    if lens.size and int(lens.min()) < 0:
        raise ValueError("record lengths must be non-negative")
    fmt.check_record_bytes(lens)
    return lens.astype(np.int64)
