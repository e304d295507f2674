"""The endless step loader: dict batches keyed by step, gathered ahead by worker threads."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from chute._buffers import BatchBuffers
from chute._sharding import Shard, resolve_shard
from chute.sampler import Sampler, SamplerMode

__all__ = ["Batch", "DataLoader", "GathersInto", "Stream"]

Batch = dict[str, Any]
"""One batch: stream name to what the stream's ``__getitems__`` returned (after the transform)."""

_STATE_VERSION = 1


@runtime_checkable
class Stream(Protocol):
    """What the loader reads: a length and a batch gather (``chute.Dataset``, a numpy array
    wrapper, ``chute.RaggedDataset``...)."""

    def __len__(self) -> int: ...

    def __getitems__(self, indices: npt.NDArray[np.uint64]) -> Any: ...


@runtime_checkable
class GathersInto(Protocol):
    """A stream that can write a batch into a given array of ``(n, *item_shape)`` and
    ``dtype`` (``chute.Dataset``): the loader then gathers into its recycled buffers."""

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def item_shape(self) -> tuple[int, ...]: ...

    def gather_into(
        self, indices: npt.NDArray[np.uint64], out: npt.NDArray[Any]
    ) -> npt.NDArray[Any]: ...


class _ArrayStream:
    """An in-memory numpy array (or memory map) as a stream: one fancy-index per batch."""

    def __init__(self, array: npt.NDArray[Any]) -> None:
        if array.ndim == 0:
            raise ValueError("a 0-d array has no records to sample")
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.array.dtype

    @property
    def item_shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape[1:])

    def __getitems__(self, indices: npt.NDArray[np.uint64]) -> npt.NDArray[Any]:
        return self.array[indices]

    def gather_into(
        self, indices: npt.NDArray[np.uint64], out: npt.NDArray[Any]
    ) -> npt.NDArray[Any]:
        return np.take(self.array, indices, axis=0, out=out)


def _as_streams(streams: Mapping[str, Stream | npt.NDArray[Any]]) -> dict[str, Stream]:
    if not isinstance(streams, Mapping) or not streams:
        raise ValueError("streams must be a non-empty dict of name -> dataset")
    return {
        name: _ArrayStream(s) if isinstance(s, np.ndarray) else s for name, s in streams.items()
    }


def _check_streams(streams: Mapping[str, Stream]) -> int:
    """The common length of ``streams``; a clear error for anything the loader cannot use."""
    lengths: dict[str, int] = {}
    for name, stream in streams.items():
        if not isinstance(stream, Stream):
            raise TypeError(
                f"stream {name!r} ({type(stream).__name__}) needs __len__ and a batch "
                "__getitems__(indices)"
            )
        lengths[name] = len(stream)
        if lengths[name] == 0:
            raise ValueError(f"stream {name!r} is empty: there is nothing to sample")
    if len(set(lengths.values())) > 1:
        raise ValueError(f"streams must have equal lengths, got {lengths}")
    return next(iter(lengths.values()))


class DataLoader:
    """Yields dict batches forever; the batch at step s depends only on (seed, s).

    A stream is anything with ``__len__`` and a batch ``__getitems__(indices)``; numpy arrays
    are accepted as they are. Every stream is gathered at the same indices, so record i lines
    up across streams. ``num_threads`` workers gather and collate up to ``prefetch`` steps
    ahead, yet batches come out in step order, so the stream of batches is the same for any
    threading. ``transform`` is the collate (a batch dict in, a batch dict out) and runs on the
    workers. An error raised by a gather or the transform is re-raised by ``next()`` with its
    original traceback.

    ``batch_size`` is the global batch. With ``shard=(index, count)`` each process gets its own
    contiguous ``batch_size // count`` slice of it, so all processes together read exactly the
    unsharded stream, and a run can resume on a different number of processes.
    """

    def __init__(
        self,
        streams: Mapping[str, Stream | npt.NDArray[Any]],
        batch_size: int = 256,
        sampler: SamplerMode = "cyclic",
        seed: int = 0,
        start_step: int = 0,
        num_threads: int | None = None,
        prefetch: int = 4,
        transform: Callable[[Batch], Batch] | None = None,
        shard: Shard = None,
    ) -> None:
        self.streams = _as_streams(streams)
        length = _check_streams(self.streams)
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        if num_threads is None:
            num_threads = min(prefetch, os.cpu_count() or 1)
        if num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {num_threads}")
        if transform is not None and not callable(transform):
            raise TypeError("transform must be a callable taking and returning a batch dict")
        self.sampler = Sampler(length, batch_size, sampler, seed)
        self.sampler.seek(start_step)
        self.shard = resolve_shard(shard, batch_size)
        index, count = self.shard
        share = batch_size // count
        self._slice = (index * share, (index + 1) * share)
        self.transform = transform
        self.prefetch = prefetch
        self.num_threads = num_threads
        self._pending: deque[Future[Batch]] = deque()
        self._next_submit = self.sampler.step
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            num_threads, thread_name_prefix="chute-loader"
        )
        self._buffers: BatchBuffers | None = None

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns."""
        return self.sampler.step

    @property
    def batch_size(self) -> int:
        """The global batch size (all shards together)."""
        return self.sampler.batch_size

    def batch_at(self, step: int) -> Batch:
        """The batch of ``step``, built on the calling thread; does not move the loader."""
        indices = self.sampler.indices(step, *self._slice)
        batch = {name: self._gather(stream, indices) for name, stream in self.streams.items()}
        batch = batch if self.transform is None else self.transform(batch)
        return batch if self._buffers is None else self._buffers.adopt(batch)

    def use_buffers(self, buffers: BatchBuffers | None) -> None:
        """Gather batches into ``buffers`` (recycled, e.g. page-locked, arrays) instead of
        fresh ones; what the transform returns is copied in too. ``None``: fresh arrays.
        ``chute.frameworks.to_device`` sets this; an array stays out of reuse while
        anything references it, so batches already handed out are never overwritten."""
        self._buffers = buffers

    def _gather(self, stream: Stream, indices: npt.NDArray[np.uint64]) -> Any:
        buffers = self._buffers
        if buffers is None or not isinstance(stream, GathersInto):
            return stream.__getitems__(indices)
        out = buffers.empty((len(indices), *stream.item_shape), stream.dtype)
        return stream.gather_into(indices, out)

    def seek(self, step: int) -> None:
        """Make ``step`` the next batch; work queued for other steps is dropped."""
        self.sampler.seek(step)
        self._drop_pending()
        self._next_submit = self.sampler.step

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able record of where the global stream stands."""
        return {
            "version": _STATE_VERSION,
            "step": self.step,
            "seed": self.sampler.seed,
            "sampler": self.sampler.mode,
            "batch_size": self.sampler.batch_size,
            "length": self.sampler.length,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the state's step; refuses a state from a different stream of batches."""
        if state.get("version") != _STATE_VERSION or "step" not in state:
            raise ValueError(f"not a chute DataLoader state (version {_STATE_VERSION}): {state}")
        ours = self.state_dict()
        clashes = {
            key: (state.get(key), ours[key])
            for key in ("seed", "sampler", "batch_size", "length")
            if state.get(key) != ours[key]
        }
        if clashes:
            detail = ", ".join(f"{k}: saved {s!r}, loader {o!r}" for k, (s, o) in clashes.items())
            raise ValueError(f"the saved state belongs to a different stream of batches ({detail})")
        self.seek(int(state["step"]))

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> Batch:
        pool = self._pool
        if pool is None:
            raise RuntimeError("the DataLoader is closed")
        if self._next_submit - len(self._pending) != self.step:  # the sampler was moved
            self.seek(self.step)
        while len(self._pending) < self.prefetch:
            self._pending.append(pool.submit(self.batch_at, self._next_submit))
            self._next_submit += 1
        future = self._pending.popleft()
        try:
            batch = future.result()
        except BaseException:
            self.seek(self.step)  # stay at the failed step; drop what was queued behind it
            raise
        self.sampler.seek(self.step + 1)
        return batch

    def _drop_pending(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        """Stop the worker threads; waits only for batches already being gathered."""
        if self._pool is not None:
            self._drop_pending()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DataLoader(streams={list(self.streams)}, {self.sampler!r}, shard={self.shard}, "
            f"num_threads={self.num_threads}, prefetch={self.prefetch})"
        )
