"""Chunk-aligned train/val/test splits, saved as a small JSON manifest."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ._geometry import ArrayGeometry

SplitName = Literal["train", "val", "test"]
SPLITS: tuple[SplitName, ...] = ("train", "val", "test")


@dataclass(frozen=True)
class SplitManifest:
    """Which sample-axis chunks belong to which split.

    Chunk ``i`` holds samples ``[i * sample_chunk_size, min((i + 1) * sample_chunk_size,
    n_samples))``; a chunk belongs to exactly one split, so no stored chunk is read by
    two splits. The JSON form (``to_json`` / ``from_json``) is the one insitubatch writes.

    >>> import os, tempfile
    >>> m = SplitManifest(n_chunks=4, sample_chunk_size=10, n_samples=35,
    ...                   chunks={"train": (0, 1), "val": (2,), "test": (3,)})
    >>> m.ranges("train"), m.sample_indices("test").tolist()
    ([(0, 20)], [30, 31, 32, 33, 34])
    >>> path = os.path.join(tempfile.mkdtemp(), "split.json")
    >>> m.to_json(path)
    >>> SplitManifest.from_json(path) == m
    True
    """

    n_chunks: int
    sample_chunk_size: int
    n_samples: int
    chunks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.sample_chunk_size <= 0 or self.n_samples < 0:
            raise ValueError(
                f"bad manifest: sample_chunk_size={self.sample_chunk_size}, "
                f"n_samples={self.n_samples}"
            )
        if self.n_chunks != math.ceil(self.n_samples / self.sample_chunk_size):
            expected = math.ceil(self.n_samples / self.sample_chunk_size)
            raise ValueError(
                f"bad manifest: {self.n_samples} samples in chunks of {self.sample_chunk_size} "
                f"make {expected} chunks, not n_chunks={self.n_chunks}"
            )
        unknown = set(self.chunks) - set(SPLITS)
        if unknown:
            raise ValueError(f"bad manifest: unknown splits {sorted(unknown)}")
        seen: set[int] = set()
        for name, ids in self.chunks.items():
            bad = [i for i in ids if not 0 <= i < self.n_chunks]
            if bad:
                raise ValueError(f"bad manifest: split {name!r} has chunks {bad[:5]} out of range")
            overlap = seen.intersection(ids)
            if overlap:
                raise ValueError(f"bad manifest: chunks {sorted(overlap)[:5]} in two splits")
            seen.update(ids)

    def chunk_ids(self, split: str) -> np.ndarray:
        """The split's chunk indices (all chunks for ``"all"``), as int64."""
        if split == "all":
            return np.arange(self.n_chunks, dtype=np.int64)
        if split not in SPLITS:
            raise KeyError(f"unknown split {split!r}; expected one of {(*SPLITS, 'all')}")
        return np.asarray(self.chunks.get(split, ()), dtype=np.int64)

    def sample_indices(self, split: str) -> np.ndarray:
        """Every sample index of ``split``, in chunk order."""
        return chunk_samples(self.chunk_ids(split), self.sample_chunk_size, self.n_samples)

    def ranges(self, split: str) -> list[tuple[int, int]]:
        """The split's samples as merged half-open ``(start, stop)`` ranges."""
        out: list[tuple[int, int]] = []
        for c in sorted(int(i) for i in self.chunk_ids(split)):
            start = c * self.sample_chunk_size
            stop = min(start + self.sample_chunk_size, self.n_samples)
            if out and out[-1][1] == start:
                out[-1] = (out[-1][0], stop)
            else:
                out.append((start, stop))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_chunks": self.n_chunks,
            "sample_chunk_size": self.sample_chunk_size,
            "n_samples": self.n_samples,
            "chunks": {k: [int(i) for i in v] for k, v in self.chunks.items()},
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SplitManifest:
        try:
            return cls(
                n_chunks=int(data["n_chunks"]),
                sample_chunk_size=int(data["sample_chunk_size"]),
                n_samples=int(data["n_samples"]),
                chunks={str(k): tuple(int(i) for i in v) for k, v in data["chunks"].items()},
                seed=int(data.get("seed", 0)),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a split manifest: {exc!r}") from exc

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write the manifest atomically (a crash leaves the old file or the new one)."""
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> SplitManifest:
        with open(path) as f:
            return cls.from_dict(json.load(f))


def chunk_samples(chunk_ids: np.ndarray, chunk_size: int, n_samples: int) -> np.ndarray:
    """Concatenated sample indices of ``chunk_ids`` (vectorised over chunks)."""
    starts = chunk_ids.astype(np.int64) * chunk_size
    lengths = np.clip(n_samples - starts, 0, chunk_size)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    within = np.arange(total, dtype=np.int64) - np.repeat(offsets, lengths)
    return np.repeat(starts, lengths) + within


def _split_counts(n: int, fractions: tuple[float, ...]) -> list[int]:
    """Chunk counts per split: train and val rounded, test takes the rest (as insitubatch)."""
    train = min(n, round(fractions[0] * n))
    val = min(n - train, round(fractions[1] * n))
    return [train, val, n - train - val]


def split_by_chunk(
    geometry: ArrayGeometry,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
    contiguous: bool = True,
    *,
    sample_range: tuple[int, int] | None = None,
) -> SplitManifest:
    """Partition ``geometry``'s sample-axis chunks into train/val/test.

    ``fractions`` are of chunks. ``contiguous=True`` gives each split one run of chunks
    (safe for time series); otherwise chunks are assigned at random from ``seed``.
    ``sample_range=(start, stop)`` first restricts the split to the chunks overlapping
    samples ``[start, stop)``, each kept whole (splits are made of whole chunks), so a
    window starting or ending inside a chunk takes in that chunk's other samples too.

    >>> from chute.insitu import ArrayGeometry
    >>> g = ArrayGeometry("t2m", shape=(100, 4), chunks=(10, 4), dtype="<f4")
    >>> m = split_by_chunk(g, (0.5, 0.25, 0.25), sample_range=(15, 52))
    >>> m.chunks
    {'train': (1, 2), 'val': (3,), 'test': (4, 5)}
    """
    if len(fractions) != 3 or any(not math.isfinite(f) or f < 0 for f in fractions):
        raise ValueError(f"fractions must be three non-negative numbers, got {fractions}")
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions must sum to 1, got {fractions} (sum {sum(fractions)})")
    first, last = 0, geometry.n_chunks
    if sample_range is not None:
        first, last = _chunk_window(geometry, sample_range)
    n = last - first
    counts = _split_counts(n, fractions)
    if fractions[0] > 0 and counts[0] == 0:
        raise ValueError(f"{geometry.path!r} has {n} chunks, too few to give train any")
    order = np.arange(first, last, dtype=np.int64)
    if not contiguous:
        order = first + np.random.default_rng(seed).permutation(n)
    bounds = np.cumsum([0, *counts])
    chunks: dict[str, tuple[int, ...]] = {
        name: tuple(int(i) for i in np.sort(order[bounds[k] : bounds[k + 1]]))
        for k, name in enumerate(SPLITS)
    }
    return SplitManifest(
        n_chunks=geometry.n_chunks,
        sample_chunk_size=geometry.sample_chunk_size,
        n_samples=geometry.n_samples,
        chunks=chunks,
        seed=seed,
    )


def _chunk_window(geometry: ArrayGeometry, sample_range: tuple[int, int]) -> tuple[int, int]:
    """The chunks ``[first, last)`` that overlap samples ``[start, stop)``."""
    try:
        start, stop = (int(v) for v in sample_range)
    except (TypeError, ValueError):
        raise ValueError(f"sample_range must be (start, stop), got {sample_range!r}") from None
    if not 0 <= start < stop <= geometry.n_samples:
        raise ValueError(
            f"sample_range {sample_range} must satisfy 0 <= start < stop <= "
            f"{geometry.n_samples} (the samples of {geometry.path!r})"
        )
    size = geometry.sample_chunk_size
    return start // size, math.ceil(stop / size)
