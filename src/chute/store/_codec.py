"""Codec choice and zstd dictionary training."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from chute import _native
from chute.store import _format as fmt

fmt.check_native(_native.codes)

#: zstd's own recommendation for a dictionary's size, and the cap chute uses by default.
DEFAULT_DICT_CAP = 112_640
#: Training data per dictionary byte (zstd's guideline is about 100x), and its bounds.
SAMPLES_PER_DICT_BYTE = 100
TRAIN_SAMPLE_RANGE = (4 << 20, 64 << 20)


def default_dict_size(sample_bytes: int) -> int:
    """Scale the dictionary to its training data: about 1% of it, within [256 B, 110 KiB]."""
    return int(min(DEFAULT_DICT_CAP, max(256, sample_bytes // 100)))


def sample_rows(n: int, row_bytes: int, dict_size: int | None = None) -> npt.NDArray[np.int64]:
    """Evenly spread row indices: enough training data for a dictionary of ``dict_size``."""
    low, high = TRAIN_SAMPLE_RANGE
    budget = min(high, max(low, SAMPLES_PER_DICT_BYTE * (dict_size or DEFAULT_DICT_CAP)))
    take = n if row_bytes == 0 else min(n, max(1, budget // row_bytes))
    if n == 0:
        return np.empty(0, np.int64)
    return np.unique(np.linspace(0, n - 1, num=take).astype(np.int64))


def train_dictionary(
    data: npt.NDArray[np.uint8], lengths: npt.NDArray[np.uint64], dict_size: int | None
) -> bytes:
    """Train a zstd dictionary on records laid end to end in ``data``.

    zstd's trainer needs enough varied samples; when it gives up (tiny or uniform data) the
    samples themselves, cut to size, serve as a raw-content dictionary, which every zstd
    decoder accepts the same way.
    """
    total = int(lengths.sum())
    cap = dict_size if dict_size is not None else default_dict_size(total)
    if not 64 <= cap <= fmt.MAX_DICT:
        raise ValueError(f"dict_size must be in [64, {fmt.MAX_DICT}] bytes, got {cap}")
    try:
        return _native.train_dict(data[:total], lengths.astype(np.uint64), cap)
    except ValueError:
        raw = bytes(data[: min(total, cap)])
        if len(raw) < 8:
            raise ValueError("too little sample data to build a zstd dictionary") from None
        return raw


def dict_sum(dictionary: bytes) -> bytes:
    """dict.chute's bytes for ``dictionary``: its size and CRC-32C, so that a reader can tell
    a damaged dict.zr (bytes appended, cut or flipped) from the one chute trained."""
    crc = _native.crc32c(dictionary)
    return fmt.DICT_SUM.pack(fmt.DICT_SUM_MAGIC, fmt.DICT_SUM_VERSION, len(dictionary), crc)


def digest_for_reading(dictionary: bytes) -> Any:
    return _native.make_ddict(dictionary)


def digest_for_writing(dictionary: bytes, level: int) -> Any:
    return _native.make_cdict(dictionary, level)
