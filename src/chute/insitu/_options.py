"""Checking InSituDataset's keyword arguments, and what identifies its decoded data."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore, ObjectStore

from chute._objects import check_options, is_option
from chute._util.checks import check_optional_int
from chute._util.process_slice import SliceSpec

from ._files import archive_files
from ._geometry import ArrayGeometry
from ._store import StoreLike
from ._transforms import BatchTransform, ChunkTransform

# insitubatch options chute does not take, and why (an error says so instead of "unknown")
NOT_TAKEN = {
    "persist": "chute's cache_dir pool lives while processes use it and is then removed",
    "readonly_cache": "every process sharing a cache_dir may decode a missing chunk",
    "reset_stale_cache": "a cache_dir pool is cleared when its last process leaves",
}


@dataclass(frozen=True, kw_only=True)
class InSituOptions:
    """`InSituDataset`'s options as one value (``options=``), checked when made: ints are
    ints (not bools) in range, ``on_bad_chunk`` and ``shuffle`` one of their values.
    Unset ``block_chunks``, ``max_inflight``, ``cache_budget_bytes`` and ``num_threads``
    are derived from the cores, the chunk size and the budget; ``store_options`` go to the
    store of an ``s3://`` URL (``endpoint=``, ``region=`` ...).

    >>> InSituOptions(batch_size=8, prefetch=4).batch_size
    8
    >>> InSituOptions(batch_size=True)
    Traceback (most recent call last):
    TypeError: batch_size must be an int, got True
    """

    batch_size: int = 32
    block_chunks: int | None = None
    max_inflight: int | None = None
    seed: int = 0
    shuffle: bool = True
    prefetch: int = 2
    cache_budget_bytes: int | None = None
    cache_dir: str | os.PathLike[str] | None = None
    chunk_transforms: Sequence[ChunkTransform] = ()
    batch_transforms: Sequence[BatchTransform] = ()
    shard: SliceSpec = None
    on_bad_chunk: Literal["raise", "skip", "nan"] = "raise"
    num_threads: int | None = None
    store_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("batch_size", "block_chunks", "max_inflight", "prefetch", "num_threads"):
            object.__setattr__(self, name, check_optional_int(name, getattr(self, name), minimum=1))
        budget = check_optional_int("cache_budget_bytes", self.cache_budget_bytes, minimum=1)
        object.__setattr__(self, "cache_budget_bytes", budget)
        if self.on_bad_chunk not in ("raise", "skip", "nan"):
            raise ValueError(
                f"on_bad_chunk must be 'raise', 'skip' or 'nan', got {self.on_bad_chunk!r}"
            )
        if not isinstance(self.shuffle, bool):
            raise TypeError(f"shuffle must be True or False, got {self.shuffle!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {self.seed!r}")


def check_keywords(
    url: StoreLike, store_kwargs: Mapping[str, Any], keywords: Sequence[str]
) -> None:
    """Every extra keyword must be a store option of ``url``: else a ``TypeError`` naming
    it and the nearest valid keyword, before anything is opened or read."""
    for key in store_kwargs:
        if key in NOT_TAKEN and not is_option(url, key):
            raise TypeError(f"InSituDataset does not take insitubatch's {key}=: {NOT_TAKEN[key]}")
    check_options(url, store_kwargs, "InSituDataset", keywords)


def identity_of(
    url: StoreLike,
    snapshot: str | None,
    geometries: Mapping[str, ArrayGeometry],
    transforms: Sequence[ChunkTransform],
    stamp: Mapping[str, str | None],
) -> str:
    """What decides a slab's decoded bytes: processes agreeing on it share the on-disk pool.

    A local archive is named by its resolved path (a ``latest.zarr`` link is followed, as
    the store follows it once at open), and ``stamp`` (`archive_stamp`) adds what its
    metadata documents say and when they were written, so an archive rewritten in place
    has another identity. A chunk transform is told apart by its ``repr``, so a dataclass
    transform (such as :class:`StandardScaler`) is shared and a lambda (whose repr holds an
    address) is not.
    """
    if isinstance(url, (str, os.PathLike)):
        text = os.fspath(url)
        where = (
            text
            if "://" in text and not text.startswith("file://")
            else os.path.realpath(text.removeprefix("file://"))
        )
    elif snapshot is not None:
        where = f"icechunk:{snapshot}"
    else:
        where = str(url)
    return json.dumps(
        {
            "store": where,
            "geometries": {n: asdict(g) for n, g in sorted(geometries.items())},
            "transforms": [repr(t) for t in transforms],
            "metadata": dict(stamp),
        },
        sort_keys=True,
        default=str,
    )


_METADATA = ("zarr.json", ".zarray", ".zgroup", ".zattrs")  # Zarr v3's document, then v2's


async def archive_stamp(
    store: Store, geometries: Mapping[str, ArrayGeometry]
) -> dict[str, str | None]:
    """``{key: stamp}`` of the metadata documents of the archive root and of each array
    (``None`` where there is none): the SHA-256 of their bytes and, where the store has
    one, their file stamp (inode, modification time and size of a local file; ETag, time
    and size of an object), so a rewrite shows even when the metadata reads the same.
    Only metadata is read.

    >>> import asyncio, tempfile, zarr
    >>> from zarr.storage import LocalStore
    >>> path = tempfile.mkdtemp() + "/weather.zarr"
    >>> _ = zarr.open_group(path, mode="w").create_array("t2m", shape=(4,), dtype="f4")
    >>> from chute.insitu import open_geometries
    >>> stamp = asyncio.run(archive_stamp(LocalStore(path), open_geometries(path)))
    >>> sorted(k for k, v in stamp.items() if v is not None)
    ['t2m/zarr.json', 'zarr.json']
    """
    prefixes = sorted({""} | {g.path.strip("/") for g in geometries.values()})
    keys = [f"{p}/{n}" if p else n for p in prefixes for n in _METADATA]

    files = archive_files(store)  # a local archive's documents: regular files, bounded

    async def one(key: str) -> str | None:
        if files is not None:
            found = await asyncio.to_thread(files.read, key)
        else:
            got = await store.get(key, default_buffer_prototype())
            found = None if got is None else got.to_bytes()
        if found is None:
            return None
        parts = [hashlib.sha256(found).hexdigest()]
        if isinstance(store, ObjectStore):
            import obstore

            meta = await obstore.head_async(store.store, key)
            parts += [str(meta["e_tag"]), str(meta["last_modified"]), str(meta["size"])]
        elif isinstance(store, LocalStore):
            st = os.stat(store.root / key)
            parts += [str(st.st_ino), str(st.st_mtime_ns), str(st.st_size)]
        return " ".join(parts)

    return dict(zip(keys, await asyncio.gather(*map(one, keys)), strict=True))


def chunk_stamp(root: str | None, keys: Sequence[str]) -> str:
    """The stamp of the stored objects at ``keys`` a slab is decoded from: a digest of the
    inode, modification and change times and size of each file under a local archive's
    ``root`` (``-`` for a missing one, read as the fill value); ``""`` for another store,
    whose objects are not checked (a HEAD per slab would cost a request per chunk).

    A slab of the on-disk pool records the stamp taken before its chunks were read; one
    whose recorded stamp differs from its chunks' stamp now is stale. One ``stat`` per file.

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> with open(os.path.join(root, "c0"), "wb") as f:
    ...     _ = f.write(b"chunk")
    >>> stamp = chunk_stamp(root, ["c0", "c1"])
    >>> len(stamp), stamp == chunk_stamp(root, ["c0", "c1"]), chunk_stamp(None, ["c0"])
    (32, True, '')
    >>> os.replace(os.path.join(root, "c0"), os.path.join(root, "c1"))
    >>> stamp == chunk_stamp(root, ["c0", "c1"])
    False
    """
    if root is None:
        return ""
    parts = []
    for key in keys:
        try:
            st = os.stat(os.path.join(root, key))
        except OSError:  # missing: the read gives the fill value (or reports the error)
            parts.append("-")
            continue
        parts.append(f"{st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_size}")
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()
