"""Every fact of the Zrecord on-disk format, and chute's checksum sidecar, in one place.

A store is a directory::

    meta.zr        16-byte header, then one 16-byte RecordLoc per record (little-endian)
    0.zr, 1.zr ..  chunk files: record bytes packed densely, no record straddles two
    dict.zr        a zstd dictionary, present once one was trained
    dict.chute     chute's record of dict.zr: its size and CRC-32C, written before it (others
                   ignore it; a dictionary another tool trained has none)
    schema.json    dtype and per-record shape, written by the dataset layer
    crc32c.chute   chute's sidecar: CRC-32C of each record's logical bytes (others ignore it)
    gen.chute      chute's generation: bumped by every delete, compaction and reset, so open
                   readers notice; readers lock it shared while they open (others ignore it)

loaderx preallocates meta.zr at its 256 MiB maximum and chunks at 4 GiB, sparse. chute sizes
meta.zr to its records (growing geometrically) and chunk files to their data; both layouts
satisfy the same reader rules, so stores move either way.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any, Final

import numpy as np
import numpy.typing as npt

MAGIC: Final = b"ZREC"
VERSION: Final = 3
HEADER = struct.Struct("<4sHHII")  # magic, version, tail_chunk, tail_offset, length
HEADER_SIZE: Final = HEADER.size
# tail_chunk, tail_offset, length: the header after magic and version, rewritten on commit
# (and copied into the checksum sidecar's header, at the same offset)
STATE = struct.Struct("<HII")
STATE_OFFSET: Final = 6

LOC_DTYPE: Final = np.dtype(
    [
        ("offset", "<u4"),
        ("phys_length", "<u4"),
        ("logic_length", "<u4"),
        ("chunk_id", "<u2"),
        ("codec", "u1"),
        ("reserved", "u1"),
    ]
)
LOC_SIZE: Final = LOC_DTYPE.itemsize

MAX_RECORD: Final = 1 << 20  # bytes in one record, logical or stored
MAX_CHUNKS: Final = 1 << 12
CHUNK_LIMIT: Final = 1 << 32  # a record must end at or below this offset in its chunk
MAX_RECORDS: Final = MAX_CHUNKS * CHUNK_LIMIT // MAX_RECORD  # 2**24

META_FILE: Final = "meta.zr"
DICT_FILE: Final = "dict.zr"
SCHEMA_FILE: Final = "schema.json"
SUMS_FILE: Final = "crc32c.chute"

SUMS_MAGIC: Final = b"ZCRC"
SUMS_VERSION: Final = 1
# magic, version, then the header state (tail_chunk, tail_offset, length) of meta.zr when the
# sidecar was last brought in step with it; a different state means another tool wrote since.
SUMS_HEADER = struct.Struct("<4sHHII16x")
SUMS_DTYPE: Final = np.dtype(
    [
        ("crc", "<u4"),
        ("offset", "<u4"),
        ("phys_length", "<u4"),
        ("chunk_id", "<u2"),
        ("codec", "u1"),
        ("valid", "u1"),
    ]
)

DICT_SUM_FILE: Final = "dict.chute"
DICT_SUM_MAGIC: Final = b"ZDCT"
DICT_SUM_VERSION: Final = 1
DICT_SUM = struct.Struct("<4sHxxII")  # magic, version, dict.zr's size and CRC-32C
#: dict.zr is read whole at open; no trained dictionary comes near this (zstd's guideline
#: is 110 KiB, loaderx's largest 1 MiB), so a larger file is not one.
MAX_DICT: Final = 1 << 27

GEN_FILE: Final = "gen.chute"
GEN_MAGIC: Final = b"ZGEN"
GEN_VERSION: Final = 1
GEN_HEADER = struct.Struct("<4sHxxQ")  # magic, version, generation (u64 at byte 8)

#: The manifest that makes a folder a sharded dataset (written by `chute.datasets`): a
#: store is never created beside one, where it would mix with the dataset's own files.
SHARDED_MANIFEST: Final = "dataset.json"

#: A store's files other than its chunks (see `is_store_file`).
NAMED_FILES: Final = frozenset(
    {META_FILE, DICT_FILE, DICT_SUM_FILE, SCHEMA_FILE, SUMS_FILE, GEN_FILE}
)

ZSTD_LEVEL: Final = 3
ZSTD_DICT_LEVEL: Final = 19


class Codec(IntEnum):
    """How one record is stored; the tag is the RecordLoc ``codec`` byte.

    Wherever a codec is taken, its name (``"raw"``, ``"zstd"``, ``"zstd_dict"``) works too.

    >>> import tempfile
    >>> from chute.store import Codec, RecordStore
    >>> with RecordStore(tempfile.mkdtemp() + "/s.zr", mode="w", codec=Codec.RAW) as store:
    ...     _ = store.append([b"abc", b"de"])
    ...     _ = store.append([b"x" * 100], codec="zstd")  # per call, by name
    ...     store.stats()["codecs"]
    {'raw': 2, 'zstd': 1, 'zstd_dict': 0}
    """

    RAW = 0
    ZSTD = 1
    ZSTD_DICT = 2


CODEC_NAMES: Final = {"raw": Codec.RAW, "zstd": Codec.ZSTD, "zstd_dict": Codec.ZSTD_DICT}


def parse_codec(codec: str | Codec) -> Codec:
    """Accept a codec name (``"raw"``, ``"zstd"``, ``"zstd_dict"``) or a `Codec`."""
    if isinstance(codec, Codec):
        return codec
    try:
        return CODEC_NAMES[codec]
    except (KeyError, TypeError):
        names = sorted(CODEC_NAMES)
        raise ValueError(f"unknown codec {codec!r}; expected one of {names}") from None


def codec_name(codec: Codec) -> str:
    return next(name for name, c in CODEC_NAMES.items() if c is codec)


def chunk_file(chunk_id: int) -> str:
    return f"{chunk_id}.zr"


def is_store_file(name: str) -> bool:
    """Whether a file of this name in a store's folder belongs to the store: its chunk
    files and `NAMED_FILES`. The one list of a store's files, for what removes or counts them."""
    stem = name[:-3] if name.endswith(".zr") else ""
    return name in NAMED_FILES or stem.isdigit()


def meta_size(capacity: int) -> int:
    return HEADER_SIZE + capacity * LOC_SIZE


def check_native(native: object) -> None:
    """Refuse a compiled core whose copy of these facts differs from this module's.

    The C code keeps its own constants (``format.h``); a build that drifted from this file
    would read or write records differently from what the format says. Checked at import.
    """
    expected = {
        "MAX_RECORD": MAX_RECORD,
        "CODEC_RAW": Codec.RAW,
        "CODEC_ZSTD": Codec.ZSTD,
        "CODEC_ZSTD_DICT": Codec.ZSTD_DICT,
        "LOC_SIZE": LOC_SIZE,
        "SUM_SIZE": SUMS_DTYPE.itemsize,
    }
    drift = {
        name: (getattr(native, name, None), value)
        for name, value in expected.items()
        if getattr(native, name, None) != value
    }
    if drift:
        found = ", ".join(f"{k}: compiled {c}, format {f}" for k, (c, f) in drift.items())
        raise ImportError(f"chute's compiled core disagrees with store/_format.py ({found})")


def check_record_bytes(
    sizes: int | npt.NDArray[np.integer[Any]], first: int = 0, what: str | None = None
) -> None:
    """The one check of the format's record cap: a ValueError naming the first record over
    1 MiB, by its index (``first`` plus its position in ``sizes``) or as ``what``."""
    if isinstance(sizes, int | np.integer):
        if sizes <= MAX_RECORD:
            return
        bad, size = 0, int(sizes)
    else:
        if not sizes.size or int(sizes.max()) <= MAX_RECORD:
            return
        bad = int(np.argmax(sizes > MAX_RECORD))
        size = int(sizes[bad])
    name = what or f"record {first + bad}"
    raise ValueError(
        f"{name} is {size} bytes; the Zrecord format caps a record at 1 MiB: split it across "
        "records (chute.write_tokens does so for token documents of any length)"
    )
