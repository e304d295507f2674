"""Sequences for language models from a `chute.TokenDataset`, as streams of the step loader.

`TokenWindows` cuts the token stream into fixed windows (concat-and-chunk); `PackedTokens`
packs documents into sequences, whole where they fit, with ``segment_ids`` and
``positions`` so attention stays within a document; `varlen` turns a packed batch into the
flat, padding-free layout of variable-length attention kernels (``cu_seqlens``).

Both streams are pure functions of the record number, so the loader's sampler decides the
order: ``sampler="cyclic"`` (the default) is a fresh permutation of all windows (or
sequences) each epoch, keyed by the seed, seekable to any step in O(1), resumed exactly and
sliced across processes with ``shard=`` like any other stream.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from chute._native import read_windows
from chute._util.checks import check_int
from chute.datasets import TokenDataset
from chute.datasets._tokens import (
    Packing,
    native_read,
    positions_of,
    ranges,
    read_packed_rows,
    read_token_spans,
)
from chute.loader._packing import pack_groups
from chute.loader._sampler import OrderSampler, lane_order
from chute.loader._streams import Batch

__all__ = ["PackedTokens", "TokenWindows", "varlen"]

#: The most lanes a packed stream reads side by side (each keeps its group's sequences).
_MOST_LANES = 4096


def _check_tokens(tokens: object, what: str) -> TokenDataset:
    if not isinstance(tokens, TokenDataset):
        raise TypeError(
            f"{what} reads a chute.TokenDataset (written by chute.write_tokens), "
            f"not a {type(tokens).__name__}"
        )
    return tokens


def _window_segments(
    starts: npt.NDArray[np.int64],
    width: int,
    documents: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
) -> dict[str, npt.NDArray[np.int32]]:
    """``segment_ids`` (1, 2 ... within each window) and ``positions`` (from 0 in each
    segment) of windows of ``width`` tokens from ``starts``, a segment beginning at each
    window's first token and at each document start inside it (``documents``, ``counts[k]``
    of them in window k, rising)."""
    n = starts.size
    inside = documents - np.repeat(starts, counts)  # from each window's first token
    row = np.repeat(np.arange(n, dtype=np.int64), counts)
    firsts = np.arange(n, dtype=np.int64) * width
    breaks = np.concatenate([firsts, (row * width + inside)[inside > 0]])
    breaks.sort()
    length = np.diff(np.append(breaks, n * width))  # the segments tile the windows
    first = np.searchsorted(breaks, firsts)  # each window's first segment
    per_window = np.diff(np.append(first, breaks.size))
    ordinal = np.arange(1, breaks.size + 1) - np.repeat(first, per_window)
    ids = np.repeat(ordinal.astype(np.int32), length)
    places = ranges(np.zeros(breaks.size, np.int64), length).astype(np.int32)
    return {"segment_ids": ids.reshape(n, width), "positions": places.reshape(n, width)}


class TokenWindows:
    """Fixed windows over a token stream: window ``w`` is tokens ``w * seq_len`` to
    ``(w + 1) * seq_len`` inclusive (``seq_len + 1`` tokens: inputs ``[:, :-1]``, next-token
    targets ``[:, 1:]``), across document and record edges (concat-and-chunk); the tokens
    after the last whole window are not read.

    A batch is ``{"tokens": (n, seq_len + 1)}``; with ``documents=True`` also
    ``"segment_ids"`` and ``"positions"`` of the same shape, which restart where a document
    begins inside the window (to mask attention across documents).

    >>> import tempfile, numpy as np
    >>> from chute import DataLoader, TokenWindows, write_tokens
    >>> ds = write_tokens(tempfile.mkdtemp() + "/c", [np.arange(10), np.arange(50, 57)],
    ...                   dtype=np.uint16)
    >>> windows = TokenWindows(ds, seq_len=4)
    >>> len(windows), windows.__getitems__(np.array([2]))["tokens"].tolist()
    (4, [[8, 9, 50, 51, 52]])
    >>> with DataLoader(windows, batch_size=2, seed=0) as loader:  # one epoch, shuffled
    ...     sorted(r[0] for _ in range(2) for r in next(loader)["tokens"].tolist())
    [0, 4, 8, 52]
    """

    def __init__(self, tokens: TokenDataset, seq_len: int, *, documents: bool = False) -> None:
        self.tokens = _check_tokens(tokens, "TokenWindows")
        self.seq_len = check_int("seq_len", seq_len, minimum=1)
        self.documents = bool(documents)
        self._length = (tokens.num_tokens - 1) // self.seq_len
        if self._length == 0:
            raise ValueError(
                f"seq_len={seq_len} leaves no window: the stream holds {tokens.num_tokens} "
                f"tokens, a window reads seq_len + 1"
            )

    def __len__(self) -> int:
        return self._length

    def __getitems__(self, indices: npt.NDArray[Any]) -> Batch:
        return self.read_mixed([self], None, indices)

    def alike(self, other: object) -> bool:
        """Whether ``other`` is windows of the same shape and dtype, read together with
        these by `read_mixed`."""
        return isinstance(other, TokenWindows) and (
            other.seq_len,
            other.documents,
            other.tokens.dtype,
        ) == (self.seq_len, self.documents, self.tokens.dtype)

    @staticmethod
    def read_mixed(
        streams: list[TokenWindows], offsets: npt.NDArray[np.int64] | None, indices: Any
    ) -> Batch:
        """Position ``p`` is window ``p - offsets[s]`` of ``streams[s]``, s the last stream
        with ``offsets[s] <= p`` (``offsets``: each stream's first position, and the end;
        None: one stream, windows by number): every window read in one call of the compiled
        core across the streams' datasets, which also finds their streams and checks their
        range. With ``offsets``, the batch's ``"source"`` is each window's stream."""
        first = streams[0]
        seq_len, width = first.seq_len, first.seq_len + 1
        positions = positions_of(indices)
        n = positions.size
        tokens = np.empty((n, width), first.tokens.dtype)
        source = None if offsets is None else np.empty(n, np.int16)
        counts = np.empty(n, np.int64) if first.documents else None

        def read(sources: list[Any], threads: int) -> tuple[Any, ...]:
            return read_windows(sources, offsets, positions, seq_len, tokens, source, counts,
                                threads)  # fmt: skip

        def place() -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64]]:
            """Each window's stream and first token, in numpy (off the fast path)."""
            at = np.zeros(n, np.intp)
            local = positions.astype(np.int64)
            if offsets is not None:
                at = np.searchsorted(offsets, local, side="right") - 1
                local = local - offsets[at]
            return at, local * seq_len

        def touched(s: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
            at, starts = place()
            inside = (starts >= 0) & (starts + width <= streams[s].tokens.num_tokens)
            mine = starts[(at == s) & inside]  # the read names any other: ``outside``
            return mine, np.full(mine.size, width, np.int64)

        def outside(k: int) -> NoReturn:
            raise IndexError(f"window {int(positions[k])} is outside the stream's windows")

        datasets = [w.tokens for w in streams]
        result = native_read(datasets, read, touched, lambda k: int(place()[0][k]), outside)
        batch: Batch = {"tokens": tokens}
        if counts is not None:
            documents = np.frombuffer(result[4] or b"", np.int64)
            batch.update(_window_segments(place()[1], width, documents, counts))
        if source is not None:
            batch["source"] = source
        return batch

    def __repr__(self) -> str:
        return (
            f"TokenWindows({self.tokens!r}, seq_len={self.seq_len}, windows={self._length}"
            f"{', documents=True' if self.documents else ''})"
        )


class PackedTokens:
    """Documents packed into sequences of ``seq_len`` tokens, whole where they fit.

    The stream is taken ``group`` sequences' worth of tokens at a time; within a group, each
    document (or the part of it in the group) fills as many whole sequences as it can, and
    the remainders are packed first-fit-decreasing into the group's other sequences, the
    few that fit nowhere whole being split to fill the gaps. Every group but the last is
    filled exactly (no padding); only documents longer than ``seq_len``, those crossing a
    group's edge and the few used to fill gaps are split. A group is packed when first asked
    for (its document starts read, the groups a batch asks for packed together in the
    compiled core): no pass over the corpus, ever. The packings of the last ``4 * lanes``
    groups are kept (a few bytes per document); a batch's rows are then laid out and their
    tokens read where they lie, in one call.

    Drawn ``sampler="cyclic"`` (the loader's default), each pass over the sequences takes
    the groups in a fresh order keyed by the seed and reads ``lanes`` of them side by side:
    a batch holds sequences of up to ``lanes`` groups, and each group is packed once a
    pass. ``sampler="iid"`` or
    ``"sequential"`` draw sequences from the whole stream as for any stream, at the cost
    of a group read for nearly every sequence.

    A batch is ``{"tokens", "segment_ids", "positions"}``, each ``(n, seq_len)``:
    ``segment_ids`` number the document pieces of a row from 1 (0 is padding),
    ``positions`` count from 0 in each piece. For next-token prediction take inputs
    ``tokens[:, :-1]``, targets ``tokens[:, 1:]`` and weigh the loss by
    ``segment_ids[:, 1:] == segment_ids[:, :-1]``.

    >>> import tempfile, numpy as np
    >>> from chute import PackedTokens, write_tokens
    >>> docs = [np.full(3, 1), np.full(6, 2), np.full(2, 3), np.full(5, 4)]
    >>> ds = write_tokens(tempfile.mkdtemp() + "/c", docs, dtype=np.uint16)
    >>> packed = PackedTokens(ds, seq_len=8, group=2)
    >>> batch = packed.__getitems__(np.arange(len(packed)))
    >>> batch["tokens"].tolist()
    [[2, 2, 2, 2, 2, 2, 3, 3], [4, 4, 4, 4, 4, 1, 1, 1]]
    >>> batch["segment_ids"].tolist()
    [[1, 1, 1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 1, 2, 2, 2]]
    """

    def __init__(
        self, tokens: TokenDataset, seq_len: int, *, group: int = 32, lanes: int = 64
    ) -> None:
        self.tokens = _check_tokens(tokens, "PackedTokens")
        self.seq_len = check_int("seq_len", seq_len, minimum=1)
        self.group = check_int("group", group, minimum=1, maximum=1 << 16)
        self.lanes = check_int("lanes", lanes, minimum=1, maximum=_MOST_LANES)
        span = self.seq_len * self.group
        self._full, rest = divmod(tokens.num_tokens, span)
        self._tail = -(-rest // self.seq_len)  # sequences of the last, shorter group
        self._length = self._full * self.group + self._tail
        self._kept = 4 * self.lanes  # the blocks of lanes being read, and the next ones
        self._lock = threading.Lock()
        self._packed: OrderedDict[int, bytes] = OrderedDict()
        self._busy: dict[int, threading.Event] = {}

    def __len__(self) -> int:
        return self._length

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"], state["_packed"], state["_busy"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._packed = OrderedDict()
        self._busy = {}

    def order(self, seed: int, first: int, n: int) -> npt.NDArray[np.uint64]:
        """Draws ``first .. first + n - 1`` of the passes keyed by ``seed`` (what
        ``sampler="cyclic"`` reads): each pass takes the groups in a fresh order, ``lanes``
        side by side (`chute.loader._sampler.lane_order`)."""
        return lane_order(self._full, self.group, self._tail, self.lanes, seed, first, n)

    def sampler(self, batch_size: int, seed: int, mode: str) -> OrderSampler | None:
        """The loader's sampler for ``mode``: this stream's own order for ``"cyclic"``;
        None (drawn as any stream) for the others."""
        return OrderSampler(self, batch_size, seed=seed) if mode == "cyclic" else None

    def fingerprint(self) -> dict[str, Any]:
        """What decides the sequences and their order, for a loader's saved state."""
        return {"kind": "packed", "seq_len": self.seq_len, "group": self.group,
                "lanes": self.lanes, "tokens": self.tokens.num_tokens}  # fmt: skip

    def packing(self, group: int) -> Packing:
        """How group ``group`` is packed."""
        return Packing.of(self._tables([group])[0])

    def _tables(self, groups: list[int]) -> list[bytes]:
        """The packing tables of ``groups`` (distinct): kept (the last ``4 * lanes`` packed,
        oldest dropped first), packed now (those missing, together, outside the lock), or
        awaited from the thread packing them already (consecutive batches share groups)."""
        done: dict[int, bytes] = {}
        mine: list[int] = []
        theirs: list[tuple[int, threading.Event]] = []
        packing = threading.Event()  # set once this call's groups are packed (or failed)
        with self._lock:
            for g in groups:
                table = self._packed.get(g)
                if table is not None:
                    done[g] = table
                elif g in self._busy:
                    theirs.append((g, self._busy[g]))
                else:
                    self._busy[g] = packing
                    mine.append(g)
        if mine:
            made: list[bytes] = []
            try:
                made = self._pack(mine)
                done.update(zip(mine, made, strict=True))
            finally:
                with self._lock:
                    self._packed.update(zip(mine, made, strict=False))
                    while len(self._packed) > self._kept:
                        self._packed.popitem(last=False)
                    for g in mine:
                        del self._busy[g]
                packing.set()
        for g, event in theirs:
            event.wait()
            with self._lock:
                found = self._packed.get(g)
            done[g] = found if found is not None else self._pack([g])[0]  # theirs failed
        return [done[g] for g in groups]

    def _spans(self, groups: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], ...]:
        """Each group's first token, end, and reach (one token past its end, within the
        stream: a document starting at the end makes the last piece a whole document)."""
        end = self.tokens.num_tokens
        start = groups * (self.seq_len * self.group)
        stop = np.minimum(start + self.seq_len * self.group, end)
        return start, stop, np.minimum(stop + 1, end)

    def _pack(self, groups: list[int]) -> list[bytes]:
        """The packing tables of ``groups``, from their document starts, in one read and one
        call of the compiled core."""
        g = np.array(groups, np.int64)
        start, stop, reach = self._spans(g)
        read = read_token_spans([self.tokens], None, start, reach - start, documents=True,
                                copy=False, held_only=True)  # fmt: skip
        begins, counts = read.starts, read.counts
        last = np.flatnonzero(stop == self.tokens.num_tokens)
        if last.size:  # the stream's end closes its last document
            at = int(counts[: last[0] + 1].sum())
            begins = np.insert(begins, at, self.tokens.num_tokens)
            counts = counts.copy()
            counts[last[0]] += 1
        bins = np.where(g < self._full, self.group, self._tail).astype(np.int64)
        return pack_groups(start, stop, bins, begins, counts, self.seq_len)

    def __getitems__(self, indices: npt.NDArray[Any]) -> Batch:
        rows = positions_of(indices)  # a negative one is past any length
        try:  # every group packed already: the cache itself is the call's table of tables
            return read_packed_rows(self.tokens, self._packed, rows, self.group, self.seq_len)
        except (KeyError, IndexError):  # a group not packed yet, or a row past the stream
            if rows.size and int(rows.max()) >= self._length:
                raise IndexError(f"a sequence outside [0, {self._length})") from None
        distinct = np.unique(rows // self.group).tolist()
        tables = dict(zip(distinct, self._tables(distinct), strict=True))
        return read_packed_rows(self.tokens, tables, rows, self.group, self.seq_len)

    def __repr__(self) -> str:
        return (
            f"PackedTokens({self.tokens!r}, seq_len={self.seq_len}, group={self.group}, "
            f"lanes={self.lanes}, sequences={self._length})"
        )


def varlen(batch: Batch) -> Batch:
    """A packed batch (``tokens``, ``segment_ids``, ``positions`` of ``(n, seq_len)``) as
    one flat, padding-free sequence for variable-length attention: ``tokens`` and
    ``positions`` of ``(total,)``, ``cu_seqlens`` (int32, the segments' edges: segment k is
    ``tokens[cu_seqlens[k]:cu_seqlens[k + 1]]``) and ``max_seqlen``; other entries pass.
    Use it as the loader's ``transform=``.

    >>> batch = {"tokens": np.array([[5, 6, 7], [8, 9, 0]]),
    ...          "segment_ids": np.array([[1, 1, 2], [1, 1, 0]]),
    ...          "positions": np.array([[0, 1, 0], [0, 1, 0]])}
    >>> out = varlen(batch)
    >>> out["tokens"].tolist(), out["cu_seqlens"].tolist(), out["max_seqlen"]
    ([5, 6, 7, 8, 9], [0, 2, 3, 5], 2)
    """
    if "segment_ids" not in batch or "positions" not in batch:
        raise ValueError(
            "varlen takes a batch with segment ids and positions (chute.PackedTokens, or "
            f"TokenWindows(..., documents=True)); this one holds {sorted(batch)}"
        )
    shapes = {k: np.shape(batch[k]) for k in ("tokens", "segment_ids", "positions")}
    if len(set(shapes.values())) > 1 or len(shapes["tokens"]) != 2:
        raise ValueError(f"varlen takes (n, seq_len) tokens, segment ids and positions: {shapes}")
    segment_ids = np.asarray(batch["segment_ids"])
    keep = segment_ids.reshape(-1) != 0
    flat_ids = segment_ids.reshape(-1)[keep]
    row = np.repeat(np.arange(segment_ids.shape[0]), segment_ids.shape[1])[keep]
    edge = np.ones(flat_ids.size, bool)
    edge[1:] = (flat_ids[1:] != flat_ids[:-1]) | (row[1:] != row[:-1])
    cu = np.append(np.flatnonzero(edge), flat_ids.size).astype(np.int32)
    out = {k: v for k, v in batch.items() if k != "segment_ids"}
    out["tokens"] = np.asarray(batch["tokens"]).reshape(-1)[keep]
    out["positions"] = np.asarray(batch["positions"]).reshape(-1)[keep]
    out["cu_seqlens"] = cu
    out["max_seqlen"] = int(np.diff(cu).max()) if cu.size > 1 else 0
    return out
