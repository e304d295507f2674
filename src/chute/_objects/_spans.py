"""Spans: how byte ranges of an object come back from a read, without a copy per range.

A read of several ranges of one object returns the bytes that cover them as *spans*,
``(start, bytes)`` pairs sorted by ``start`` that do not overlap: the answers of the merged
requests, or the parts of the cache's blocks that the ranges touch. A range lies inside one
span, or (a range across a block boundary of the cache) runs on through the next ones.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

Buffer = bytes | memoryview
"""Bytes read: a ``bytes`` object or a zero-copy view of a response or a mapped block."""
Span = tuple[int, Buffer]
"""Bytes of an object from offset ``start`` on: ``(start, bytes)``."""


def cut(spans: Sequence[Span], start: int, end: int, starts: Sequence[int] | None = None) -> Buffer:
    """Bytes ``[start, end)`` of the object out of ``spans`` (which cover them): a view into
    the span that holds them, or a copy joined across spans. ``starts`` is the spans' starts,
    where the caller has them.

    >>> spans = [(0, b"abcd"), (4, b"efgh"), (10, b"xy")]
    >>> [bytes(cut(spans, a, b)) for a, b in [(1, 3), (2, 6), (10, 12), (5, 5)]]
    [b'bc', b'cdef', b'xy', b'']
    """
    if start == end:
        return b""
    keys = [s for s, _ in spans] if starts is None else starts
    k = bisect_right(keys, start) - 1
    pieces: list[memoryview] = []
    at = start
    while at < end:
        if k < 0 or k >= len(spans):
            raise ValueError(f"bytes [{start}, {end}) are not covered by the spans read")
        base, data = spans[k]
        view = memoryview(data)
        if not base <= at < base + view.nbytes:
            raise ValueError(f"bytes [{start}, {end}) are not covered by the spans read")
        piece = view[at - base : end - base]
        pieces.append(piece)
        at += piece.nbytes
        k += 1
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
