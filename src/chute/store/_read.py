"""The gather family, verify and stats, over one `Snapshot` (no file is touched here)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NotRequired, TypedDict, cast

import numpy as np
import numpy.typing as npt

from chute import _native
from chute._native import codes
from chute.errors import ChecksumError, CorruptStoreError, OutBufferError
from chute.store import _format as fmt
from chute.store._files import Snapshot
from chute.store._index import index_bounds, out_of_range
from chute.store._out import out_problem

#: Codes that mean "the bytes contradict the format": worth one retry against a fresh
#: snapshot in a reader (a torn view of a writer's commit would show as one of these).
DAMAGE = frozenset(
    {
        codes.GE_CHUNK, codes.GE_BOUNDS, codes.GE_TOO_LARGE, codes.GE_CODEC, codes.GE_NO_DICT,
        codes.GE_DECODE, codes.GE_LENGTH, codes.GE_CHECKSUM, codes.GE_TABLE, codes.GE_SUMS,
    }
)  # fmt: skip


class GatherFailed(Exception):
    """A native gather's failure, before it becomes the exception the caller sees."""

    def __init__(self, code: int, pos: int, detail: int) -> None:
        super().__init__(code, pos, detail)
        self.code, self.pos, self.detail = code, pos, detail


class InPlace(NamedTuple):
    """A store's snapshot as the compiled core reads it (`RecordStore.in_place`)."""

    where: tuple[Any, ...]  # `native_store`
    threads: int  # the handle's cores
    check: Callable[[], None]  # after reading: raises if the store changed meanwhile
    stamp: tuple[Any, int] | None = None  # gen.chute's map and the snapshot's generation


def check_in_place(views: Sequence[InPlace]) -> None:
    """Every view's `InPlace.check` after one read across their stores: the generations of
    those with a stamp compared in one call of the core (a batch over many shards), each
    check run only when one moved (it raises, naming its store) or has no stamp."""
    stamps = [view.stamp for view in views]
    if None in stamps or _native.first_moved(cast(list[tuple[Any, int]], stamps)) >= 0:
        for view in views:
            view.check()


def native_store(snap: Snapshot, verify: bool) -> tuple[Any, ...]:
    """The snapshot as the compiled core takes a store: ``(table, limits, chunks, ddict, sums
    or None, strict)``, the sidecar only where records are verified."""
    sums = snap.sums if verify else None
    return snap.table, snap.limits, snap.maps, snap.ddict, sums, snap.strict and sums is not None


def gather(
    snap: Snapshot,
    idx: npt.NDArray[np.int64],
    dst: Any,
    stride: int,
    offsets: npt.NDArray[np.uint64] | None,
    *,
    verify: bool,
    threads: int,
) -> int:
    """One native call; raises `GatherFailed` on the first bad record, else returns how
    many records had no checksum to match."""
    table, limits, chunks, ddict, sums, strict = native_store(snap, verify)
    if isinstance(dst, np.ndarray) and dst.dtype.kind in "Mm":  # no buffer of their own
        dst = dst.view(np.int64)
    try:
        code, pos, detail, unchecked = _native.gather(
            table, limits, chunks, idx, dst, stride, offsets, ddict, sums, strict, threads
        )
    except (TypeError, ValueError):  # the core refused the destination: say what is wrong
        problem = out_problem(dst)
        if problem is None:
            raise
        raise problem from None
    if code:
        raise GatherFailed(code, pos, detail)
    return unchecked


def check_range(snap: Snapshot, idx: npt.NDArray[np.int64]) -> None:
    """`GatherFailed` (``GE_INDEX``) at the first index outside the snapshot's records."""
    if idx.size:
        lo, hi = index_bounds(idx)
        if lo < 0 or hi >= snap.length:
            bad = int(np.flatnonzero((idx < 0) | (idx >= snap.length))[0])
            raise GatherFailed(codes.GE_INDEX, bad, int(idx[bad]))


Decode = Callable[..., int]
"""A gather with `gather`'s signature: a mapped store's, or one that fetches the records first."""


def packed(
    snap: Snapshot,
    idx: npt.NDArray[np.int64],
    *,
    verify: bool,
    threads: int,
    decode: Decode = gather,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64], int]:
    """Records end to end, their n+1 offsets, and how many had no checksum to match
    (``decode`` gathers them: `gather` by default)."""
    check_range(snap, idx)
    offsets = np.zeros(len(idx) + 1, np.uint64)
    lengths = snap.table["logic_length"][idx]
    too_large = lengths > fmt.MAX_RECORD
    if too_large.any():  # damage: never size a buffer from it
        bad = int(np.argmax(too_large))
        raise GatherFailed(codes.GE_TOO_LARGE, bad, int(lengths[bad]))
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(int(offsets[-1]), np.uint8)
    unchecked = decode(snap, idx, values, 0, offsets, verify=verify, threads=threads)
    return values, offsets, unchecked if len(idx) else 0


def error_for(
    snap: Snapshot,
    path: Path | str,
    failed: GatherFailed,
    idx: npt.NDArray[np.int64],
    stride: int,
) -> Exception:
    """The exception a caller sees for a failed gather: damage names the record."""
    code, detail = failed.code, failed.detail
    index = int(idx[failed.pos]) if failed.pos < len(idx) else -1
    if code == codes.GE_INDEX:
        return out_of_range(index, snap.length)
    if code == codes.GE_NOMEM:
        return MemoryError("out of memory while gathering records")
    loc = snap.table[index]
    where = f"{path}: record {index} (chunk {loc['chunk_id']}, offset {loc['offset']})"
    if code == codes.GE_DST and stride == 0:  # gather_into: the offsets reach past out
        return OutBufferError(
            f"record {index} ({loc['logic_length']} bytes) does not fit in out at byte "
            f"{detail}: out is too small for the offsets"
        )
    if code == codes.GE_DST:
        return ValueError(
            f"record {index} holds {loc['logic_length']} bytes, but its slot in the batch "
            f"is {stride} bytes: the record does not match the requested size or schema"
        )
    if code == codes.GE_TABLE:
        return CorruptStoreError(
            f"{where}: the table entry differs from the one written with the record's "
            "checksum: meta.zr is damaged",
            index,
        )
    if code == codes.GE_CHECKSUM:
        want = int(snap.sums[index]["crc"]) if snap.sums is not None else 0
        return ChecksumError(
            f"{where}: bytes differ from the checksum written with them "
            f"(CRC-32C {detail:#010x} != {want:#010x})",
            index,
        )
    limit = int(snap.limits[min(int(loc["chunk_id"]), len(snap.limits) - 1)])
    messages = {
        codes.GE_CHUNK: f"names chunk {detail}, but the store has {len(snap.limits)} chunks",
        codes.GE_BOUNDS: (
            f"ends at byte {detail}, past the end of its chunk ({limit} bytes): "
            "the chunk is truncated or the table is damaged"
        ),
        codes.GE_TOO_LARGE: f"claims {detail} bytes, over the format's 1 MiB record cap",
        codes.GE_CODEC: f"has unknown codec tag {detail}",
        codes.GE_NO_DICT: "is zstd_dict-compressed, but the store has no dict.zr",
        codes.GE_DECODE: "has a damaged zstd frame",
        codes.GE_LENGTH: (
            f"decodes to {detail} bytes, but the table says {loc['logic_length']} "
            f"(stored {loc['phys_length']})"
        ),
        codes.GE_SUMS: (
            f"has no checksum: crc32c.chute holds {detail} entries but is in step with a "
            "table of more records, so it was truncated (damage)"
        ),
    }
    return CorruptStoreError(f"{where} {messages.get(code, f'failed (code {code})')}", index)


def stats(snap: Snapshot, *, has_dict: bool, has_checksums: bool) -> dict[str, Any]:
    """Record count, bytes live vs. bytes in chunk files, and records per codec."""
    live = snap.table
    counts = np.bincount(live["codec"], minlength=3)
    live_bytes = int(live["phys_length"].sum(dtype=np.uint64))
    logical = int(live["logic_length"].sum(dtype=np.uint64))
    chunk_bytes = used_bytes(snap)
    return {
        "records": snap.length,
        "live_bytes": live_bytes,
        "logical_bytes": logical,
        "chunk_bytes": chunk_bytes,
        "reclaimable": max(chunk_bytes - live_bytes, 0),
        "short_bytes": max(live_bytes - chunk_bytes, 0),  # chunk files cut short: damage
        "chunks": snap.tail_chunk + 1,
        "codecs": {fmt.codec_name(c): int(counts[c]) for c in fmt.Codec},
        "other_codecs": int(counts[3:].sum()),
        "ratio": logical / live_bytes if live_bytes else 1.0,
        "has_dict": has_dict,
        "has_checksums": has_checksums,
    }


def used_bytes(snap: Snapshot) -> int:
    return int(snap.limits.sum(dtype=np.uint64))


class PartReport(TypedDict):
    """One part of a record source that has several (a sharded dataset's shard)."""

    name: str
    first: int  # the global index of its first record
    records: int
    state: str  # "ok", "damaged" (some records), "unreadable" (could not be verified)
    message: str | None  # why it is unreadable


class VerifyReport(TypedDict):
    """What every record source's ``verify()`` returns (the same keys from each).

    ``checked`` records decoded and matched their checksum, ``unchecked`` decoded but had
    none to match, ``damaged`` lists ``(index, message)`` of the rest by global index. A
    source of several parts (a sharded dataset) adds ``parts``, one `PartReport` each, among
    them any part that could not be verified at all (its records are in no count).
    """

    records: int
    checked: int
    unchecked: int
    damaged: list[tuple[int, str]]
    parts: NotRequired[list[PartReport]]


#: Bytes decoded per step of `verify`: a damaged record costs re-decoding at most this much.
VERIFY_STEP = 16 << 20


def verify(
    snap: Snapshot,
    path: Path | str,
    *,
    batch: int,
    threads: int,
    progress: Callable[[int, int], None] | None = None,
    decode: Decode = gather,
) -> VerifyReport:
    """Decode every record and check its checksum; damage is reported, not raised.

    ``checked`` records decoded and matched their checksum, ``unchecked`` decoded but had
    none to match (another tool wrote them), ``damaged`` lists (index, message) of the rest.
    Steps hold at most ``batch`` records and about 16 MiB; ``progress(done, total)`` gets the
    decoded bytes after each. ``decode`` gathers a step (`gather`, or a remote store's own).
    """
    damaged: list[tuple[int, str]] = []
    unchecked = 0
    n = snap.length
    ends = np.cumsum(snap.table["logic_length"], dtype=np.uint64)
    total = int(ends[-1]) if n else 0
    start = 0
    while start < n:
        reach = (int(ends[start - 1]) if start else 0) + VERIFY_STEP
        stop = int(np.searchsorted(ends, reach, side="right"))
        idx = np.arange(start, max(start + 1, min(start + batch, stop)), dtype=np.int64)
        try:
            unchecked += packed(snap, idx, verify=True, threads=threads, decode=decode)[2]
            start = int(idx[-1]) + 1
        except GatherFailed as failed:
            error = error_for(snap, path, failed, idx, 0)
            if not isinstance(error, CorruptStoreError):
                raise error from None
            bad = start + failed.pos
            if failed.pos:  # those before it are fine: count them
                head = idx[: failed.pos]
                unchecked += packed(snap, head, verify=True, threads=threads, decode=decode)[2]
            damaged.append((bad, str(error)))
            start = bad + 1
        if progress is not None:
            progress(int(ends[start - 1]), total)
    if snap.sums is None:
        unchecked = n - len(damaged)
    checked = n - unchecked - len(damaged)
    return {"records": n, "damaged": damaged, "unchecked": unchecked, "checked": checked}
