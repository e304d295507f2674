"""Decoding records fetched from object storage: one batch, of one store or of the shards of
a dataset, in one round of requests and (usually) one native call.

The records' stored bytes come back from `chute._objects.ObjectReader.read_spans` as spans:
the answers of merged requests, or the parts of cached blocks. The compiled core decodes them
where they lie: each span is a chunk of a staged snapshot (``_native.chunks_from_buffers``)
and a copy of the batch's table entries points into it (chunk: the span; offset: the
record's place in it), so the core checks every offset, length and (``verify=True``)
checksum exactly as it does over mapped files, and writes into the caller's buffer. Only a
record that runs across two spans (over a cached block's edge) is copied, into a span of
its own.

Records of stores with different dictionaries (or checksum rules) decode in one native call
each kind; the shards of a dataset without dictionaries share both, so a batch is one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from chute import _native
from chute._native import codes
from chute._objects import Buffer, ObjectInfo, ObjectReader, Span, cut
from chute.store import _format as fmt
from chute.store import _read
from chute.store._files import Snapshot

#: Records decoded per round. A record adds at most three chunks to the staged snapshot (two
#: spans over a block edge, and the copy joining them), whose chunk ids are 16 bits, one
#: value of which marks a checksum entry that matches no record.
ROUND = 0xFFFF // 3
NO_CHUNK = 0xFFFF  # a chunk id that names no chunk (a checksum entry of no record)
_PER_PART = 1 << 16  # (piece, chunk) as one key: chunk ids are 16 bits
_PER_REQUEST = 1 << 44  # (request, offset) as one key: objects stay under 16 TiB


class Fetches(Protocol):
    """What this module asks of a store in object storage (`chute.store._remote.RemoteStore`):
    its reader, its chunk objects as seen, and its table entries checked for a batch."""

    _reader: ObjectReader
    _chunks: list[ObjectInfo | None]

    def _entries(
        self, snap: Snapshot, idx: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.void], npt.NDArray[np.int64]]: ...


class Part(NamedTuple):
    """One store's share of a batch: the store, the snapshot it reads, its records, and the
    byte offset in the destination where each goes."""

    store: Fetches
    snap: Snapshot
    idx: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.uint64]


class PartFailed(Exception):
    """The gather failed at a record of part ``part`` (``failed.pos`` counts within it)."""

    def __init__(self, part: int, failed: _read.GatherFailed) -> None:
        super().__init__(part, failed)
        self.part, self.failed = part, failed


class _Piece(NamedTuple):
    part: int  # which of the caller's parts
    first: int  # where in it the piece starts
    store: Fetches
    snap: Snapshot
    idx: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.uint64]


def decode(parts: Sequence[Part], dst: Any, stride: int, *, verify: bool, threads: int) -> int:
    """Fetch the records of ``parts`` and decode them into ``dst`` (each at its offset;
    ``stride``, if not 0, the size every record must have), in rounds of at most `ROUND`
    records; return how many had no checksum to match. A bad record is a `PartFailed`
    naming its part, a failed request a `chute.errors.RemoteError`."""
    unchecked = 0
    for pieces in _rounds(parts):
        unchecked += _decode_round(pieces, dst, stride, verify=verify, threads=threads)
    return unchecked


def _rounds(parts: Sequence[Part]) -> list[list[_Piece]]:
    rounds: list[list[_Piece]] = [[]]
    room = ROUND
    for k, part in enumerate(parts):
        a, n = 0, len(part.idx)
        while a < n:
            if room == 0:
                rounds.append([])
                room = ROUND
            b = min(n, a + room)
            rounds[-1].append(_Piece(k, a, part.store, part.snap, part.idx[a:b], part.offsets[a:b]))
            room -= b - a
            a = b
    return rounds


def _failed(piece: _Piece, failed: _read.GatherFailed) -> PartFailed:
    return PartFailed(
        piece.part, _read.GatherFailed(failed.code, piece.first + failed.pos, failed.detail)
    )


def _failed_at(
    pieces: list[_Piece], starts: npt.NDArray[np.int64], code: int, pos: int, detail: int
) -> PartFailed:
    """The failure at position ``pos`` of a round (its pieces end to end from ``starts``)."""
    j = int(np.searchsorted(starts, pos, side="right")) - 1
    piece = pieces[j]
    if code == codes.GE_SUMS and piece.snap.sums is not None:
        detail = len(piece.snap.sums)  # the entries of that store's sidecar, not the staged
    return _failed(piece, _read.GatherFailed(code, pos - int(starts[j]), detail))


def _decode_round(
    pieces: list[_Piece], dst: Any, stride: int, *, verify: bool, threads: int
) -> int:
    if not pieces:
        return 0
    entries = []
    for piece in pieces:
        try:
            entries.append(piece.store._entries(piece.snap, piece.idx))
        except _read.GatherFailed as failed:
            raise _failed(piece, failed) from None
    sizes = [len(piece.idx) for piece in pieces]
    starts = np.cumsum([0, *sizes])
    if len(entries) == 1:
        table, limit = entries[0]
    else:
        # as bytes: numpy promotes a structured dtype once per array joined, which costs more
        table = np.concatenate([locs.view(np.uint8) for locs, _ in entries]).view(fmt.LOC_DTYPE)
        limit = np.concatenate([lim for _, lim in entries])
    bad = check(table, limit, stride)
    if bad is not None:
        raise _failed_at(pieces, starts, *bad) from None
    chunks, lengths, table = _staged(pieces, table, sizes)
    local = np.arange(len(table), dtype=np.int64)
    sums = None
    if verify:
        table, local, sums = _staged_sums(pieces, table, local)
    staged = replace(
        pieces[0].snap, table=table, tail_chunk=0, tail_offset=0, limits=lengths,
        maps=_native.chunks_from_buffers(chunks), sums=sums,
    )  # fmt: skip
    offsets = np.concatenate([piece.offsets for piece in pieces])
    kinds: dict[tuple[int, bool], list[int]] = {}
    for j, piece in enumerate(pieces):
        kinds.setdefault((id(piece.snap.ddict), piece.snap.strict), []).append(j)
    unchecked = 0
    for members in kinds.values():
        first = pieces[members[0]].snap
        at = None  # every record of the round, or the positions of this kind's pieces
        if len(kinds) > 1:
            at = np.concatenate([np.arange(starts[j], starts[j + 1]) for j in members])
        try:
            unchecked += _read.gather(
                replace(staged, ddict=first.ddict, strict=first.strict),
                local if at is None else local[at], dst, 0,
                offsets if at is None else offsets[at], verify=verify, threads=threads,
            )  # fmt: skip
        except _read.GatherFailed as failed:
            pos = failed.pos if at is None else int(at[failed.pos])
            raise _failed_at(pieces, starts, failed.code, pos, failed.detail) from None
    return unchecked


def check(
    table: npt.NDArray[np.void], limit: npt.NDArray[np.int64], stride: int
) -> tuple[int, int, int] | None:
    """Every check a mapped store's gather makes before it reads (size, chunk, bounds), on
    the entries of a round (``limit``: the readable size of each one's chunk, -1 for a chunk
    the store does not have): ``(code, position, detail)`` of the first bad record, as the
    core would name it, or None."""
    logic, phys = table["logic_length"], table["phys_length"]
    end = table["offset"].astype(np.int64) + phys
    bad = (logic > fmt.MAX_RECORD) | (phys > fmt.MAX_RECORD) | (end > limit)
    if stride:
        bad |= logic != stride
    if not bad.any():  # a missing chunk's limit is -1: out of bounds too
        return None
    pos = int(np.argmax(bad))
    size, stored, at, chunk_limit = int(logic[pos]), int(phys[pos]), int(end[pos]), int(limit[pos])
    if size > fmt.MAX_RECORD or stored > fmt.MAX_RECORD:
        return codes.GE_TOO_LARGE, pos, size if size > fmt.MAX_RECORD else stored
    if stride and size != stride:
        return codes.GE_DST, pos, size
    if chunk_limit < 0:
        return codes.GE_CHUNK, pos, int(table["chunk_id"][pos])
    return codes.GE_BOUNDS, pos, at


def _staged(
    pieces: list[_Piece], table: npt.NDArray[np.void], sizes: list[int]
) -> tuple[list[Buffer], npt.NDArray[np.uint64], npt.NDArray[np.void]]:
    """Fetch the stored bytes of the records in ``table`` (the pieces' entries end to end):
    the spans read (the chunks of the staged snapshot), their lengths, and a copy of
    ``table`` pointing into them."""
    owner = np.repeat(np.arange(len(pieces), dtype=np.int64), sizes)
    phys = table["phys_length"].astype(np.int64)
    begin = table["offset"].astype(np.int64)
    wanted = np.flatnonzero(phys > 0)  # an empty record needs no bytes
    key = owner[wanted] * _PER_PART + table["chunk_id"][wanted]
    order = np.argsort(key, kind="stable")
    records, key = wanted[order], key[order]
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    heads = np.concatenate(([0], cuts)).tolist() if len(records) else []
    ends = [*heads[1:], len(records)][: len(heads)]
    lo, hi = begin[records].tolist(), (begin[records] + phys[records]).tolist()
    requests: list[tuple[ObjectInfo, list[tuple[int, int]]]] = []
    for a, b in zip(heads, ends, strict=True):
        j, chunk = divmod(int(key[a]), _PER_PART)
        info = pieces[j].store._chunks[chunk]
        assert info is not None  # every chunk a record names was HEADed by _entries
        requests.append((info, list(zip(lo[a:b], hi[a:b], strict=True))))
    reader = pieces[0].store._reader
    if any(piece.store._reader is not reader for piece in pieces):
        raise AssertionError("the stores of one fetch share one reader")
    answers = reader.read_spans(requests)
    request = np.repeat(np.arange(len(requests), dtype=np.int64), np.diff([*heads, len(records)]))
    return pointed(table, records, request, answers)


def pointed(
    table: npt.NDArray[np.void],
    records: npt.NDArray[np.int64],
    request: npt.NDArray[np.int64],
    answers: Sequence[Sequence[Span]],
) -> tuple[list[Buffer], npt.NDArray[np.uint64], npt.NDArray[np.void]]:
    """The spans of ``answers`` as the chunks of a staged snapshot, their lengths, and a copy
    of ``table`` pointing into them: record ``records[k]`` lies in the spans of
    ``answers[request[k]]`` (which cover it; the other records, empty, point at offset 0 of
    chunk 0). A record across two spans is joined in a copy, a chunk of its own."""
    chunks: list[Buffer] = []
    span_keys: list[int] = []
    lengths: list[int] = []
    for r, spans in enumerate(answers):
        for base, data in spans:
            chunks.append(data)
            span_keys.append(r * _PER_REQUEST + base)
            lengths.append(memoryview(data).nbytes)
    keys = np.array(span_keys, np.int64)
    span_ends = keys + np.array(lengths, np.int64)
    begin = table["offset"][records].astype(np.int64)
    phys = table["phys_length"][records].astype(np.int64)
    wide = request * _PER_REQUEST + begin
    span = np.searchsorted(keys, wide, side="right") - 1
    inside = (span >= 0) & (wide + phys <= span_ends[np.maximum(span, 0)])
    chunk_of = np.zeros(len(table), np.int64)
    offset_of = np.zeros(len(table), np.int64)
    chunk_of[records] = span
    offset_of[records] = wide - keys[np.maximum(span, 0)]
    for p in np.flatnonzero(~inside).tolist():  # across a block edge: joined in a copy
        lo = int(begin[p])
        chunks.append(bytes(cut(answers[int(request[p])], lo, lo + int(phys[p]))))
        lengths.append(int(phys[p]))
        chunk_of[records[p]] = len(chunks) - 1
        offset_of[records[p]] = 0
    if not chunks:  # every record empty: they point at an empty chunk
        chunks.append(b"")
        lengths.append(0)
    staged = table.copy()
    staged["chunk_id"] = chunk_of
    staged["offset"] = offset_of
    return chunks, np.array(lengths, np.uint64), staged


def _staged_sums(
    pieces: list[_Piece], table: npt.NDArray[np.void], local: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.void], npt.NDArray[np.int64], npt.NDArray[np.void] | None]:
    """The staged table reordered with the records that have a checksum entry first, where
    each record now is, and those entries moved with their records (an entry that did not
    match its record's old place points nowhere), so the core decides checked, unchecked and
    damaged exactly as it would over the mapped store."""
    has = np.concatenate(
        [piece.idx < (0 if piece.snap.sums is None else len(piece.snap.sums))
         for piece in pieces]
    )  # fmt: skip
    m = int(has.sum())
    if m == 0:
        return table, local, None
    order = np.argsort(~has, kind="stable")
    local = np.empty_like(local)
    local[order] = np.arange(len(order))
    rows = [
        (piece.snap.sums[piece.idx[piece.idx < len(piece.snap.sums)]],
         piece.snap.table[piece.idx[piece.idx < len(piece.snap.sums)]])
        for piece in pieces if piece.snap.sums is not None
    ]  # fmt: skip
    sums = np.concatenate([s for s, _ in rows])
    old = np.concatenate([t for _, t in rows])
    moved = table[order]
    return moved, local, moved_sums(sums, old, moved[:m])


def moved_sums(
    sums: npt.NDArray[np.void], old: npt.NDArray[np.void], moved: npt.NDArray[np.void]
) -> npt.NDArray[np.void]:
    """``sums`` (checksum entries, a copy the caller owns) moved with their records, whose
    entries were ``old`` and are ``moved`` now: an entry that did not match its record's old
    place points nowhere, so the core still reports it as damage."""
    same = (
        (sums["offset"] == old["offset"]) & (sums["chunk_id"] == old["chunk_id"])
        & (sums["phys_length"] == old["phys_length"]) & (sums["codec"] == old["codec"])
    )  # fmt: skip
    sums["offset"] = np.where(same, moved["offset"], sums["offset"])
    sums["chunk_id"] = np.where(same, moved["chunk_id"], NO_CHUNK)
    return sums
