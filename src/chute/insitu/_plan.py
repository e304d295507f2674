"""The planner: an epoch's sample order, its batches and the stored slabs each batch needs.

Everything here is vectorised numpy, so the Python work grows with chunks, not samples.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from chute.loader import Sampler

from ._split import chunk_samples


def permutation(n: int, seed: int, stream: str, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` that is a pure function of ``(seed, stream, epoch)``.

    It is the step loader's counter-based (Feistel) sampler drawing one whole cycle, so an
    order, and thus a resume, is the same under any numpy version. ``stream`` separates
    the independent permutations one epoch needs.
    """
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    digest = hashlib.blake2b(f"{seed}/{stream}".encode(), digest_size=8).digest()
    key = int.from_bytes(digest, "little")
    return Sampler(n, n, "cyclic", key).indices(epoch).astype(np.int64)


@dataclass(frozen=True)
class OrderSpec:
    """How one pass over a split orders its samples."""

    shuffle: bool
    seed: int
    epoch: int
    block_chunks: int
    shard: tuple[int, int] | None = None
    lead_chunks: int = 0  # chunks of the first window that the first batch draws from
    anchors: tuple[int, int] | None = None  # the samples that may be drawn (windowed views)
    spread: bool = False  # shard by samples, not chunks: an evaluation split, kept whole


def sample_order(
    chunk_ids: np.ndarray, chunk_size: int, n_samples: int, spec: OrderSpec
) -> np.ndarray:
    """Sample indices of one pass, in the order they are yielded.

    Shuffled passes permute the chunks per ``(seed, epoch)`` and shuffle samples within
    each window of ``block_chunks`` consecutive chunks. The first window is shuffled in
    two parts, its first ``lead_chunks`` chunks ahead of the rest, so the first batch
    waits for those chunks only, not for the whole window. With ``shard=(index, count)`` each
    rank takes every ``count``-th chunk of that permutation (disjoint chunk sets) and
    every rank's pass is cut to the shortest rank's length (equal batch counts); a cut
    that would leave every rank nothing is a ``ValueError``. With ``spread`` (an evaluation
    split) the pass is instead cut into ``count`` consecutive parts whose lengths differ by
    at most one, so every sample is read by exactly one rank. With ``anchors=(lo, hi)``
    only samples in ``[lo, hi)`` are drawn.
    """
    lo, hi = spec.anchors if spec.anchors is not None else (0, n_samples)

    def drawn(ids: np.ndarray) -> np.ndarray:  # samples each chunk contributes
        starts = ids * chunk_size
        ends = np.minimum(starts + chunk_size, n_samples)
        counts: np.ndarray = np.clip(np.minimum(ends, hi) - np.maximum(starts, lo), 0, None)
        return counts

    chunks = np.asarray(chunk_ids, np.int64)
    if spec.spread and spec.shard is not None:
        order = chunk_samples(chunks, chunk_size, n_samples)
        order = order[(order >= lo) & (order < hi)]
        index, count = spec.shard
        part: np.ndarray = np.array_split(order, count)[index]
        return part
    if spec.shuffle:
        chunks = chunks[permutation(len(chunks), spec.seed, "chunks", spec.epoch)]
    if spec.shard is not None:
        index, count = spec.shard
        lengths = drawn(chunks)
        per_rank = [int(lengths[r::count].sum()) for r in range(count)]
        keep = min(per_rank)
        if keep == 0 and any(per_rank):
            raise ValueError(
                f"it has {len(chunks)} chunks for {count} ranks (shard=({index}, {count})): "
                f"rank {per_rank.index(0)} would get no samples, and every rank's pass is "
                "cut to the shortest for equal batch counts, so every rank's would be empty. "
                "Use fewer ranks, smaller chunks along the sample axis or a larger split"
            )
        chunks = chunks[index::count]
    else:
        keep = None
    order = chunk_samples(chunks, chunk_size, n_samples)
    if spec.anchors is not None:
        order = order[(order >= lo) & (order < hi)]  # chunk by chunk, as before
    if spec.shuffle and len(order):
        lengths = drawn(chunks)
        position = np.arange(len(chunks))
        window = position // spec.block_chunks
        # two groups per window (the first window's lead chunks, the rest); order kept
        group = 2 * window + ((window == 0) & (position >= spec.lead_chunks))
        keys = permutation(len(order), spec.seed, "samples", spec.epoch)
        order = order[np.lexsort((keys, np.repeat(group, lengths)))]
    return order if keep is None else order[:keep]


@dataclass(frozen=True)
class SlabUse:
    """When each slab (one sample-axis chunk of one variable) is first and last needed."""

    slab: np.ndarray  # sample-axis chunk index, sorted by first use
    first: np.ndarray  # first batch that reads it
    last: np.ndarray  # last batch that reads it
    nbytes: np.ndarray  # decoded bytes


def slab_use(
    order: np.ndarray,
    batch_size: int,
    chunk_size: int,
    n_samples: int,
    sample_nbytes: int,
    start_batch: int = 0,
) -> SlabUse:
    """Slab first/last use for one variable, from ``start_batch`` on."""
    tail = order[start_batch * batch_size :]
    slabs = tail // chunk_size
    batches = np.arange(len(tail), dtype=np.int64) // batch_size + start_batch
    ids, first_pos = np.unique(slabs, return_index=True)
    _, last_rev = np.unique(slabs[::-1], return_index=True)
    first = batches[first_pos]
    last = batches[len(tail) - 1 - last_rev]
    by_first = np.lexsort((ids, first))
    ids, first, last = ids[by_first], first[by_first], last[by_first]
    rows = np.clip(n_samples - ids * chunk_size, 0, chunk_size)
    return SlabUse(slab=ids, first=first, last=last, nbytes=rows * sample_nbytes)


def working_set(uses: list[SlabUse], n_batches: int, lookahead: int = 0) -> int:
    """Peak bytes that must be resident at once when each slab is held from
    ``lookahead`` batches before its first use until after its last."""
    if n_batches == 0:
        return 0
    diff = np.zeros(n_batches + 1, dtype=np.int64)
    for use in uses:
        np.add.at(diff, np.maximum(use.first - lookahead, 0), use.nbytes)
        np.add.at(diff, use.last + 1, -use.nbytes)
    return int(np.cumsum(diff).max())
