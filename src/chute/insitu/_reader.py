"""Reading one slab: its stored chunks under the shared read budget, and what a bad chunk
becomes (``on_bad_chunk``: raised, skipped, or filled with NaN as insitubatch does)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from chute.errors import BadChunkError

from ._decode import DirectReader
from ._geometry import ArrayGeometry

OnBadChunk = Literal["raise", "skip", "nan"]
Part = tuple[tuple[slice, ...], tuple[int, ...]]  # a stored chunk's selection, grid coords


class SlabReader:
    """Reads slabs of the opened ``arrays``: whole stored chunks straight into the pool's
    buffer where a `DirectReader` can, everything else through zarr."""

    def __init__(
        self,
        geometries: dict[str, ArrayGeometry],
        arrays: dict[str, Any],
        direct: dict[str, DirectReader | None],
        max_inflight: int,
        on_bad_chunk: OnBadChunk,
        on_time: Callable[[Any, float], None],
    ) -> None:
        self.geometries = geometries
        self.arrays = arrays
        self._direct = direct
        self._sem = asyncio.Semaphore(max_inflight)
        self.on_bad_chunk = on_bad_chunk
        self._on_time = on_time
        self.bad_chunks: dict[str, None] = {}  # keys of skipped or NaN-filled chunks, once each

    def parts(self, name: str, j: int) -> list[Part]:
        """Selections and grid coordinates of the stored chunks making up slab ``j``."""
        g = self.geometries[name]
        axes = []
        for axis, (n, c) in enumerate(zip(g.shape, g.stored_chunks, strict=True)):
            if axis == g.sample_axis:
                axes.append([(slice(j * c, min((j + 1) * c, n)), j)])
            else:
                axes.append([(slice(s, min(s + c, n)), s // c) for s in range(0, n, c)])
        return [
            (tuple(p[0] for p in combo), tuple(p[1] for p in combo))
            for combo in itertools.product(*axes)
        ]

    def chunk_key(self, name: str, coords: tuple[int, ...]) -> str:
        arr = self.arrays[name]
        key = arr.metadata.encode_chunk_key(coords)
        return f"{arr.path}/{key}" if arr.path else str(key)

    async def _read(
        self,
        name: str,
        selection: tuple[slice, ...],
        coords: tuple[int, ...],
        buffer: Callable[[], np.ndarray] | None = None,
    ) -> np.ndarray:
        """One stored chunk, under the shared in-flight budget; decoded into ``buffer()``
        when given and the chunk is whole."""
        async with self._sem:
            direct = self._direct[name]
            data = None
            if direct is not None and all(
                s.stop - s.start == c for s, c in zip(selection, direct.chunk_shape, strict=True)
            ):
                size = direct.nbytes
                data = await direct.read(coords, buffer or (lambda: np.empty(size, dtype=np.uint8)))
            if data is None:
                start = time.perf_counter()
                data = np.asarray(await self.arrays[name].getitem(selection))
                self._on_time("decode", time.perf_counter() - start)
            return data

    async def read_slab(
        self, key: tuple[str, int], buffer: Callable[[], np.ndarray]
    ) -> tuple[np.ndarray | None, bool]:
        """The slab's samples on axis 0 (``None`` for a skipped bad chunk) and whether
        every stored chunk of it read cleanly (a NaN-filled one did not)."""
        name, j = key
        g = self.geometries[name]
        parts = self.parts(name, j)
        shape = list(g.shape)
        n, c = g.shape[g.sample_axis], g.stored_chunks[g.sample_axis]
        shape[g.sample_axis] = min((j + 1) * c, n) - j * c
        if not parts:  # an axis of length 0: nothing stored, nothing to read
            return np.moveaxis(np.empty(shape, dtype=g.dtype), g.sample_axis, 0), True
        if len(parts) == 1:
            results: list[Any] = [
                await _settle(self._read(name, *parts[0], buffer)),
            ]
        else:
            results = await asyncio.gather(
                *(self._read(name, sel, coords) for sel, coords in parts),
                return_exceptions=True,
            )
        clean = True
        data = None if len(parts) == 1 else np.empty(shape, dtype=g.dtype)
        for (sel, coords), part in zip(parts, results, strict=True):
            if isinstance(part, BaseException):
                if not isinstance(part, Exception):
                    raise part
                error = BadChunkError(self.chunk_key(name, coords), part)
                if self.on_bad_chunk == "raise":
                    raise error from part
                self.bad_chunks[error.key] = None
                if self.on_bad_chunk == "skip":
                    return None, False
                clean = False
                part = np.full([s.stop - s.start for s in sel], self._bad_fill(name), g.dtype)
            if data is None:
                data = part
            else:
                local = list(sel)
                local[g.sample_axis] = slice(None)
                data[tuple(local)] = part
        assert data is not None
        return np.moveaxis(data, g.sample_axis, 0), clean

    def _bad_fill(self, name: str) -> Any:
        """What a bad chunk is filled with under ``on_bad_chunk="nan"``: NaN for a float
        array, else the array's fill value (0 if it has none), as insitubatch does."""
        dtype = np.dtype(self.geometries[name].dtype)
        if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
            return np.nan
        fill = getattr(self.arrays[name].metadata, "fill_value", None)
        return 0 if fill is None else fill


async def _settle(coro: Any) -> Any:
    """``coro``'s result, or the exception it raised (as ``gather(return_exceptions=True)``)."""
    try:
        return await coro
    except Exception as exc:
        return exc
