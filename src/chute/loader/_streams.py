"""What the loader reads: named streams of equal length, gathered at the same indices."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from chute.loader._sampler import SamplerLike

Batch = dict[str, Any]
"""One batch: stream name to what the stream's ``__getitems__`` returned (after the transform)."""


@runtime_checkable
class Stream(Protocol):
    """What the loader reads: a length and a batch gather (``chute.Dataset``, a numpy array
    wrapper, ``chute.RaggedDataset``...).

    Anything with these two methods is a stream, such as one computed on the fly:

    >>> import numpy as np
    >>> from chute import DataLoader
    >>> class Squares:
    ...     def __len__(self): return 100
    ...     def __getitems__(self, indices): return indices.astype(np.int64) ** 2
    >>> with DataLoader({"sq": Squares()}, batch_size=3, sampler="sequential") as loader:
    ...     next(loader)["sq"].tolist(), next(loader)["sq"].tolist()
    ([0, 1, 4], [9, 16, 25])
    """

    def __len__(self) -> int: ...

    def __getitems__(self, indices: npt.NDArray[np.uint64]) -> Any: ...


@runtime_checkable
class GathersInto(Protocol):
    """A stream that can write a batch into a given array of ``(n, *item_shape)`` and
    ``dtype`` (``chute.Dataset``, numpy arrays): the loader then gathers into its recycled
    buffers when it has some (``use_buffers``)."""

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def item_shape(self) -> tuple[int, ...]: ...

    def gather_into(
        self, indices: npt.NDArray[np.uint64], out: npt.NDArray[Any]
    ) -> npt.NDArray[Any]: ...


@runtime_checkable
class ReadsAhead(Protocol):
    """A stream that can start fetching a later batch's records in the background
    (``chute.Dataset`` in object storage opens the shards ahead); returns whether doing so
    does anything for it, so the loader stops asking one that never gains."""

    def readahead(self, indices: npt.NDArray[np.uint64]) -> bool: ...


@runtime_checkable
class Ordered(Protocol):
    """A stream with an order of its own, which ``sampler="cyclic"`` follows: its draws
    ``first .. first + n - 1`` of an endless run of passes, each pass a permutation of its
    records keyed by ``seed`` and the pass (`chute.PackedTokens` reads its groups side by
    side, so a group is packed once a pass, not once a sequence)."""

    def __len__(self) -> int: ...

    def __getitems__(self, indices: npt.NDArray[np.uint64]) -> Any: ...

    def order(self, seed: int, first: int, n: int) -> npt.NDArray[np.uint64]: ...


@runtime_checkable
class DrawsItself(Protocol):
    """A stream that supplies the loader's sampler for a mode name (`chute.mix`: each
    source drawn at its weight; `chute.PackedTokens`: its groups read side by side), or
    None to be drawn as any stream."""

    def __len__(self) -> int: ...

    def __getitems__(self, indices: npt.NDArray[np.uint64]) -> Any: ...

    def sampler(self, batch_size: int, seed: int, mode: str) -> SamplerLike | None: ...


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


ALONE = ""
"""The name a stream passed alone goes by: its gathered dict is the batch (`unfold`)."""


Streams = Mapping[str, "Stream | npt.NDArray[Any]"] | Stream
"""What a loader reads: named streams (numpy arrays taken as they are), or one stream alone
that gathers a dict of named arrays."""


def as_streams(streams: Streams) -> dict[str, Stream]:
    """The streams as a dict, numpy arrays wrapped; a stream passed alone (one that gathers a
    dict of named arrays, as `chute.TokenWindows`) is named `ALONE`."""
    if not isinstance(streams, Mapping) and isinstance(streams, Stream):
        return {ALONE: streams}
    if not isinstance(streams, Mapping) or not streams:
        raise ValueError(
            "streams must be a non-empty dict of name -> dataset, or one stream that gathers "
            "a dict of named arrays (chute.TokenWindows, chute.PackedTokens, chute.mix)"
        )
    return {
        name: _ArrayStream(s) if isinstance(s, np.ndarray) else s for name, s in streams.items()
    }


def check_streams(streams: Mapping[str, Stream]) -> int:
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


def unfold(batch: Batch) -> Batch:
    """A gathered batch with the dict of a stream passed alone spread into it."""
    if ALONE not in batch:
        return batch
    columns = batch.pop(ALONE)
    if not isinstance(columns, Mapping):
        raise TypeError(
            f"a stream passed alone must gather a dict of named arrays (as chute.TokenWindows "
            f"does); this one gathered a {type(columns).__name__}: name it, "
            "DataLoader({'x': stream}, ...)"
        )
    return {**columns, **batch}
