"""How one group of a token stream is packed into sequences (`chute.PackedTokens`).

A pure function of the group's span and the document starts in it: no seed, no state, so
any process packs a group the same way and a resumed run reads the same sequences.
"""

from __future__ import annotations

import itertools
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
    begins = set(document_starts.tolist())
    marks = sorted({start, stop} | {b for b in begins if start < b < stop})
    rows: list[list[tuple[int, int]]] = []
    intact: list[tuple[int, int]] = []  # whole short documents: kept whole where they fit
    rest: list[tuple[int, int]] = []  # parts of longer or cut documents: split freely
    for a, b in itertools.pairwise(marks):
        whole, tail = divmod(b - a, seq_len)
        rows.extend([(a + k * seq_len, seq_len)] for k in range(whole))
        if tail:
            piece = (a + whole * seq_len, tail)
            keep = whole == 0 and a in begins and (b in begins or b < stop)
            (intact if keep else rest).append(piece)
    if len(rows) > bins:
        raise ValueError(f"{stop - start} tokens do not fit {bins} sequences of {seq_len}")
    room = [seq_len] * (bins - len(rows))
    placed: list[list[tuple[int, int]]] = [[] for _ in room]
    open_bins = list(range(len(room)))
    left: list[tuple[int, int]] = []
    for s, n in sorted(intact, key=lambda piece: (-piece[1], piece[0])):
        for k, b in enumerate(open_bins):  # first fit
            if room[b] >= n:
                placed[b].append((s, n))
                room[b] -= n
                if room[b] == 0:
                    del open_bins[k]
                break
        else:
            left.append((s, n))
    b = 0
    for s, n in rest + left:  # split across the gaps, in order
        while n:
            while b < len(room) and room[b] == 0:
                b += 1
            if b == len(room):
                raise ValueError(f"{stop - start} tokens do not fit {bins} sequences")
            take = min(n, room[b])
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
