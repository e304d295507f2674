"""How groups of a token stream are packed into sequences (`chute.PackedTokens`).

A pure function of a group's span and the document starts in it: no seed, no state, so any
process packs a group the same way and a resumed run reads the same sequences. The packing
runs in the compiled core (`chute._native.pack_groups`), many groups a call.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from chute._native import pack_groups as _pack
from chute.datasets._tokens import Packing


def pack_groups(
    starts: npt.NDArray[np.int64],
    stops: npt.NDArray[np.int64],
    bins: npt.NDArray[np.int64],
    document_starts: npt.NDArray[np.int64],
    counts: npt.NDArray[np.int64],
    seq_len: int,
) -> list[bytes]:
    """Tokens ``starts[g]:stops[g]`` of each group g packed into ``bins[g]`` sequences of
    ``seq_len`` (the rule is `pack_group`'s), its documents beginning at the next
    ``counts[g]`` of ``document_starts``; each group's packing as the compiled core's table
    (int64 ``[bins, edges (bins + 1), piece starts, piece lengths]`` as bytes: immutable, and
    read by the core without a buffer request; `Packing.of`)."""
    return _pack(starts, stops, bins, document_starts, counts, seq_len)


def pack_group(
    start: int, stop: int, document_starts: npt.NDArray[np.int64], seq_len: int, bins: int
) -> Packing:
    """Tokens ``start:stop`` packed into ``bins`` sequences of ``seq_len``, the documents
    beginning at ``document_starts`` (those in ``start:stop``, and ``stop`` itself where a
    document begins there or the stream ends: the last piece is then a whole document).

    Each document piece (cut at the group's edges) fills whole sequences with its first
    ``seq_len``-multiples. The documents shorter than that go first-fit-decreasing into
    the other sequences (longest first, ties by position); the gaps left are filled, in
    order, with the rest (the remainders of longer documents and of those cut by the
    group's edges, split as needed), then with any short document that fit nowhere whole.
    With ``bins * seq_len == stop - start`` no token is left out and none is padding.

    >>> p = pack_group(0, 16, np.array([0, 3, 9, 11, 16]), seq_len=8, bins=2)
    >>> [list(zip(p.starts[p.edges[b]:p.edges[b + 1]].tolist(),
    ...           p.lengths[p.edges[b]:p.edges[b + 1]].tolist())) for b in range(2)]
    [[(3, 6), (9, 2)], [(11, 5), (0, 3)]]
    """
    one = np.array([start], np.int64), np.array([stop], np.int64), np.array([bins], np.int64)
    docs = np.asarray(document_starts, np.int64)
    table = pack_groups(*one, docs, np.array([docs.size], np.int64), seq_len)[0]
    return Packing.of(table)
