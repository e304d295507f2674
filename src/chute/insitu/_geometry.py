"""What the loader needs to know about one stored array, read from Zarr metadata."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import zarr
from zarr.abc.store import Store

from chute._objects import check_options
from chute._util.checks import check_int

from ._aio import run_sync
from ._store import CountingStore, StoreLike, open_store, store_name


@dataclass(frozen=True)
class ArrayGeometry:
    """Shape, dtype and chunking of one Zarr array, and which axis holds the samples.

    ``chunks`` is the chunk shape zarr decodes; ``shards`` the shard shape of a sharded
    array (else ``None``). The stored object the loader fetches is the shard when there
    is one, else the chunk: ``stored_chunks``. insitubatch's attribute names
    (``inner_shape``, ``inner_chunks``, ``chunk_bytes``, ``chunk_of``,
    ``samples_in_chunk``) read the same facts. ``offset`` makes a *windowed view*: under a
    batch's anchor sample ``t`` the variable is read at ``t + offset`` (``g.shift(1)`` is
    the next step of ``g``, e.g. a forecast target); anchors whose reads would leave the
    array are not drawn (``valid_anchor_range``).

    >>> g = ArrayGeometry("t2m", shape=(20, 3, 4), chunks=(8, 3, 4), dtype="<f4")
    >>> g.n_chunks, g.inner_shape, g.chunk_bytes, g.samples_in_chunk(2)
    (3, (3, 4), 384, range(16, 20))
    """

    path: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    sample_axis: int = 0
    shards: tuple[int, ...] | None = None
    offset: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.offset, bool) or not isinstance(self.offset, int):
            raise TypeError(f"{self.path!r}: offset must be an int, got {self.offset!r}")
        if not 0 <= self.sample_axis < len(self.shape):
            raise ValueError(
                f"{self.path!r}: sample_axis={self.sample_axis} outside its {len(self.shape)} axes"
            )
        if len(self.chunks) != len(self.shape) or any(c <= 0 for c in self.chunks):
            raise ValueError(f"{self.path!r}: chunks {self.chunks} do not fit shape {self.shape}")

    @property
    def stored_chunks(self) -> tuple[int, ...]:
        """Shape of one stored object (the shard if sharded)."""
        return self.shards if self.shards is not None else self.chunks

    @property
    def n_samples(self) -> int:
        return self.shape[self.sample_axis]

    @property
    def sample_chunk_size(self) -> int:
        """Samples per stored object along the sample axis."""
        return self.stored_chunks[self.sample_axis]

    @property
    def n_chunks(self) -> int:
        """Stored objects along the sample axis."""
        return math.ceil(self.n_samples / self.sample_chunk_size)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample (the array shape without the sample axis)."""
        return self.shape[: self.sample_axis] + self.shape[self.sample_axis + 1 :]

    @property
    def sample_nbytes(self) -> int:
        return math.prod(self.sample_shape) * np.dtype(self.dtype).itemsize

    @property
    def slab_nbytes(self) -> int:
        """Decoded bytes of one full sample-axis chunk across every other axis."""
        return self.sample_chunk_size * self.sample_nbytes

    # -- insitubatch's names for the same facts ----------------------------------------

    def shift(self, by: int) -> ArrayGeometry:
        """A windowed view of the same array read ``by`` samples further along: under a
        batch's anchor sample ``t`` it yields sample ``t + offset + by``."""
        return replace(self, offset=self.offset + by)

    @property
    def inner_shape(self) -> tuple[int, ...]:
        """Shape of one sample (``sample_shape``)."""
        return self.sample_shape

    @property
    def inner_chunks(self) -> tuple[int, ...]:
        """Stored-chunk shape on the axes other than the sample axis."""
        c = self.stored_chunks
        return c[: self.sample_axis] + c[self.sample_axis + 1 :]

    @property
    def chunk_bytes(self) -> int:
        """Decoded bytes of one whole sample-axis chunk (``slab_nbytes``)."""
        return self.slab_nbytes

    def chunk_of(self, sample_index: int) -> int:
        """The sample-axis chunk holding ``sample_index``."""
        if not 0 <= sample_index < self.n_samples:
            raise IndexError(f"sample {sample_index} outside [0, {self.n_samples})")
        return sample_index // self.sample_chunk_size

    def samples_in_chunk(self, chunk_index: int) -> range:
        """The sample indices of sample-axis chunk ``chunk_index``."""
        if not 0 <= chunk_index < self.n_chunks:
            raise IndexError(f"chunk {chunk_index} outside [0, {self.n_chunks})")
        start = chunk_index * self.sample_chunk_size
        return range(start, min(start + self.sample_chunk_size, self.n_samples))

    @property
    def chunks_per_slab(self) -> int:
        """Stored objects that make up one sample-axis chunk."""
        per_axis = [
            math.ceil(n / c)
            for i, (n, c) in enumerate(zip(self.shape, self.stored_chunks, strict=True))
            if i != self.sample_axis
        ]
        return math.prod(per_axis)


def valid_anchor_range(offsets: Iterable[int], n_samples: int) -> tuple[int, int]:
    """Half-open ``(lo, hi)`` of the anchors ``t`` whose every read ``t + offset`` lies in
    ``[0, n_samples)``; empty (``lo == hi``) when the offsets span the whole array.

    >>> valid_anchor_range([-1, 0, 1], 10)
    (1, 9)
    """
    offs = [int(o) for o in offsets] or [0]
    lo = max(0, -min(offs))
    hi = max(lo, min(n_samples, n_samples - max(offs)))
    return lo, hi


def geometry_of(array: Any, sample_axis: int) -> ArrayGeometry:
    """The geometry of an opened zarr (async) array."""
    shards = array.shards
    return ArrayGeometry(
        path=array.path,
        shape=tuple(int(n) for n in array.shape),
        chunks=tuple(int(c) for c in array.chunks),
        dtype=np.dtype(array.dtype).str,
        sample_axis=sample_axis,
        shards=None if shards is None else tuple(int(s) for s in shards),
    )


async def _open_geometries(
    store: Store, variables: list[str] | None, sample_axis: int, name: str = ""
) -> dict[str, ArrayGeometry]:
    node = await zarr.api.asynchronous.open(store=store, mode="r")
    if isinstance(node, zarr.AsyncArray):
        arrays = {node.path or name: node}
    else:
        arrays = {name: arr async for name, arr in node.arrays()}
    if variables is not None:
        missing = [v for v in variables if v not in arrays]
        if missing:
            raise KeyError(f"variables {missing} not in the Zarr group (has {sorted(arrays)})")
        arrays = {v: arrays[v] for v in variables}
        short = {v: a.ndim for v, a in arrays.items() if a.ndim <= sample_axis}
        if short:
            raise ValueError(
                f"sample_axis={sample_axis} is outside the axes of {short} "
                "(variable: number of axes)"
            )
    else:
        every = arrays
        arrays = {k: a for k, a in sorted(arrays.items()) if a.ndim > sample_axis}
        if not arrays:
            axes = {k: a.ndim for k, a in sorted(every.items())}
            raise ValueError(
                f"no array has a sample_axis={sample_axis} (number of axes per array: {axes})"
            )
    return {name: geometry_of(arr, sample_axis) for name, arr in arrays.items()}


def read_geometries(store: Store, name: str) -> dict[str, ArrayGeometry]:
    """Every array of an opened store with a sample axis 0 (an array at the root is ``name``)."""
    return run_sync(_open_geometries(store, None, 0, name))


def _check_axis(sample_axis: int) -> None:
    check_int("sample_axis", sample_axis)


def open_geometries(
    url: StoreLike,
    variables: list[str] | str | None = None,
    *,
    sample_axis: int = 0,
    **store_kwargs: Any,
) -> dict[str, ArrayGeometry]:
    """Read ``{name: ArrayGeometry}`` from the Zarr v3 metadata at ``url``.

    ``url`` is a group (every array with a ``sample_axis``, or just ``variables``) or a
    single array, named after the last part of its path (``"store.zarr/t2m"`` gives
    ``{"t2m": ...}``). ``variables`` is a list of names or one name. Zarr v2 arrays are
    read too. Only metadata is read.

    >>> import tempfile, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"
    >>> group = zarr.open_group(path, mode="w")
    >>> _ = group.create_array("t2m", shape=(40, 3, 4), chunks=(10, 3, 4), dtype="f4")
    >>> _ = group.create_array("lat", shape=(3,), chunks=(3,), dtype="f8")
    >>> g = open_geometries(path, ["t2m"])["t2m"]
    >>> g.shape, g.n_chunks, g.sample_shape, g.dtype
    ((40, 3, 4), 4, (3, 4), '<f4')
    """
    _check_axis(sample_axis)
    check_options(url, store_kwargs, "open_geometries", ["variables", "sample_axis"])
    if isinstance(variables, str):  # one name, not its letters
        variables = [variables]
    elif variables is not None and not all(isinstance(v, str) for v in variables):
        raise TypeError(f"variables must be a name or a list of names, got {variables!r}")
    store = CountingStore(open_store(url, **store_kwargs))  # local files: one safe rule
    return run_sync(_open_geometries(store, variables, sample_axis, store_name(url)))
