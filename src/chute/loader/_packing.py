"""How one group of a token stream is packed into sequences (`chute.PackedTokens`).

A pure function of the group's span and the document starts in it: no seed, no state, so
any process packs a group the same way and a resumed run reads the same sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Packing:
    """The pieces of a packed group: sequence ``b`` is the stream spans
    ``starts[edges[b]:edges[b + 1]]`` (each ``lengths[...]`` tokens long), in that order."""

    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    edges: npt.NDArray[np.int64]


def pack_group(
    start: int, stop: int, document_starts: npt.NDArray[np.int64], seq_len: int, bins: int
) -> Packing:
    """Tokens ``start:stop`` packed into ``bins`` sequences of ``seq_len``, the documents
    beginning at ``document_starts`` (those in ``start:stop``, and ``stop`` itself where a
    document begins there or the stream ends: the last piece is then a whole document).

    Each document piece (cut at the group's edges) fills whole sequences with its first
    ``seq_len``-multiples. The documents shorter than that go first-fit-decreasing into
    the other sequences; the gaps left are filled, in order, with the rest (the remainders
    of longer documents and of those cut by the group's edges, split as needed), then with
    any short document that fit nowhere whole. With ``bins * seq_len == stop - start`` no
    token is left out and none is padding.

    >>> p = pack_group(0, 16, np.array([0, 3, 9, 11, 16]), seq_len=8, bins=2)
    >>> [list(zip(p.starts[p.edges[b]:p.edges[b + 1]].tolist(),
    ...           p.lengths[p.edges[b]:p.edges[b + 1]].tolist())) for b in range(2)]
    [[(3, 6), (9, 2)], [(11, 5), (0, 3)]]
    """
    edges = np.unique(np.concatenate([[start, stop], document_starts])).astype(np.int64)
    piece_start, piece_length = edges[:-1], np.diff(edges)
    whole = piece_length // seq_len
    rows: list[list[tuple[int, int]]] = [
        [(s + k * seq_len, seq_len)]
        for s, w in zip(piece_start.tolist(), whole.tolist(), strict=True)
        for k in range(w)
    ]
    if len(rows) > bins:
        raise ValueError(f"{stop - start} tokens do not fit {bins} sequences of {seq_len}")
    tails_start = piece_start + whole * seq_len
    tails_length = piece_length - whole * seq_len
    # a tail that is a whole document is kept whole where it fits; the others (parts of
    # longer documents, or of one cut by the group's edges) are split freely to fill gaps
    intact = (whole == 0) & np.isin(piece_start, document_starts)
    intact &= np.isin(piece_start + piece_length, document_starts) | (edges[1:] < stop)
    room = np.full(bins - len(rows), seq_len, np.int64)
    placed: list[list[tuple[int, int]]] = [[] for _ in range(room.size)]
    left: list[tuple[int, int]] = []
    order = np.lexsort((tails_start, -tails_length))  # longest first, then stream order
    for k in order[intact[order]].tolist():
        s, n = int(tails_start[k]), int(tails_length[k])
        fits = np.flatnonzero(room >= n)
        if fits.size:
            placed[int(fits[0])].append((s, n))
            room[fits[0]] -= n
        else:
            left.append((s, n))
    rest = [(int(tails_start[k]), int(tails_length[k]))
            for k in np.flatnonzero(~intact & (tails_length > 0)).tolist()]  # fmt: skip
    b = 0
    for s, n in rest + left:  # split across the gaps, in order
        while n:
            while b < room.size and room[b] == 0:
                b += 1
            if b == room.size:
                raise ValueError(f"{stop - start} tokens do not fit {bins} sequences")
            take = min(n, int(room[b]))
            placed[b].append((s, take))
            room[b] -= take
            s, n = s + take, n - take
    rows.extend(placed)
    flat = [piece for row in rows for piece in row]
    counts = np.array([len(row) for row in rows], np.int64)
    return Packing(
        starts=np.array([s for s, _ in flat], np.int64),
        lengths=np.array([n for _, n in flat], np.int64),
        edges=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
    )
