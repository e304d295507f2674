"""The endless step loader: dict batches keyed by step, gathered ahead by worker threads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from chute._util.process_slice import SliceSpec, resolve_slice
from chute._util.renamed import legacy_arguments
from chute._util.state import StateLayout
from chute.errors import SamplerError
from chute.loader._evaluate import EvalPass, Last
from chute.loader._mix import MixSampler, Mixture
from chute.loader._pipeline import Pipeline
from chute.loader._recipe import Record
from chute.loader._renamed import translate
from chute.loader._sampler import (
    _U64,
    OrderSampler,
    Sampler,
    SamplerLike,
    SamplerMode,
    WeightedSampler,
    _check_u64,
    sampler_config,
)
from chute.loader._streams import (
    Batch,
    DrawsItself,
    Stream,
    Streams,
    as_streams,
    check_streams,
)
from chute.loader._subset import IndexSet
from chute.loader._window import ShardWindowSampler, window_sampler

_DEFAULT_BATCH = 256
LoaderMode = SamplerMode | Literal["window"]
"""A mode name `DataLoader(sampler=...)` takes: a `Sampler` mode, or ``"window"`` (a
`ShardWindowSampler` over the streams' shards)."""
STEP_END = _U64 - 1
"""The step at which the endless loader ends: reading a step moves the uint64 step counter
one past it, so the last step that can be read is ``2**64 - 2``."""


def _make_sampler(
    sampler: LoaderMode | SamplerLike,
    length: int,
    batch_size: int | None,
    seed: int | None,
    window: int | None = None,
    streams: Mapping[str, Stream] | None = None,
    subset: bool = False,
) -> SamplerLike:
    """The loader's sampler over ``length`` positions, from a mode name or a sampler object;
    ``"window"`` groups them by the shards of the sharded datasets among ``streams``."""
    if sampler == "window":
        batch = _DEFAULT_BATCH if batch_size is None else batch_size
        return window_sampler(streams or {}, length, batch, seed or 0, window, subset=subset)
    if window is not None:
        raise TypeError("window= is the shard-window sampler's: pass it with sampler='window'")
    own = [s for s in (streams or {}).values() if isinstance(s, DrawsItself)]
    if isinstance(sampler, str) and own and not subset:
        if len(own) > 1:
            raise ValueError(
                "a loader draws one mixture (or packed stream) by its own order; mix the "
                "mixtures' sources instead"
            )
        batch = _DEFAULT_BATCH if batch_size is None else batch_size
        drawn = own[0].sampler(batch, 0 if seed is None else seed, sampler)
        if drawn is not None:
            return drawn
    if isinstance(sampler, str):
        return Sampler(length, _DEFAULT_BATCH if batch_size is None else batch_size, sampler,
                       0 if seed is None else seed)  # fmt: skip
    if isinstance(sampler, (int, np.integer)) and not isinstance(sampler, bool):
        raise ValueError(
            f"sampler={sampler!r}: chute names the modes sampler='sequential', 'iid', 'cyclic' "
            "(loaderx's mode codes 0, 1, 2) and 'window'; loaderx's positional order differs "
            "from chute's, so pass DataLoader arguments by name"
        )
    if not isinstance(sampler, SamplerLike):
        raise TypeError(
            "sampler= takes 'sequential', 'iid', 'cyclic', 'window' or a sampler object (length, "
            f"batch_size, step, seek, indices(step, start, stop)), got {type(sampler).__name__}"
        )
    if seed is not None:
        raise TypeError("seed= goes to the sampler object itself, not to the DataLoader")
    name = type(sampler).__qualname__
    _check_u64(f"the batch_size of sampler {name}", sampler.batch_size, minimum=1)
    _check_u64(f"the length of sampler {name}", sampler.length, minimum=1)
    if batch_size is not None and _check_u64("batch_size", batch_size, 1) != sampler.batch_size:
        raise ValueError(
            f"batch_size={batch_size} differs from the sampler's batch_size "
            f"{sampler.batch_size}; leave batch_size= out when passing a sampler object"
        )
    if sampler.length != length:
        raise ValueError(
            f"the sampler draws from {sampler.length} positions, the loader has {length} "
            "records (the streams' length, or len(indices) with indices=)"
        )
    return sampler


def _check_positions(
    sampler: SamplerLike, step: int, span: tuple[int, int], positions: object, length: int
) -> npt.NDArray[np.uint64]:
    """What ``sampler.indices(step, *span)`` returned, as uint64 positions, once it is
    known to be ``span``'s count of integers in ``[0, length)``: the records (or subset
    members) the loader has, whatever the sampler's own ``length`` says by then."""
    start, stop = span
    array = np.asarray(positions)
    problem = None
    if array.dtype.kind not in "iu":
        problem = f"positions of dtype {array.dtype}, not integers"
    elif array.ndim != 1:
        problem = f"an array of shape {array.shape}, not a 1-D array of positions"
    elif array.size != stop - start:
        problem = f"{array.size} positions for a batch slice of {stop - start}"
    elif array.dtype.kind == "i" and int(array.min()) < 0:
        problem = f"position {int(array.min())}, negative"
    elif int(array.max()) >= length:
        problem = f"position {int(array.max())}, outside [0, {length})"
    if problem is not None:
        raise SamplerError(
            f"sampler {type(sampler).__qualname__} at step {step} gave {problem}; "
            f"indices(step, {start}, {stop}) must return {stop - start} integer positions "
            f"in [0, {length})"
        )
    return array.astype(np.uint64, copy=False)


#: The samplers of chute, which draw only in ``[0, length)``: the loader need not check them.
_OURS = (Sampler, WeightedSampler, ShardWindowSampler, MixSampler, OrderSampler)

#: The arguments after ``batch_size``, in the order they could be passed by position.
_POSITIONAL = ("sampler", "seed", "start_step", "num_threads", "prefetch", "transform", "shard")


class DataLoader(Pipeline):
    """Yields dict batches forever; the batch at step s depends only on (configuration, s).

    A stream is anything with ``__len__`` and a batch ``__getitems__(indices)``; numpy arrays
    are accepted as they are. Every stream is gathered at the same indices, so record i lines
    up across streams. ``num_threads`` workers gather and collate up to ``prefetch`` steps
    ahead, yet batches come out in step order, so the stream of batches is the same for any
    threading. ``transform`` is the collate (a batch dict in, a batch dict out) and runs on the
    workers. An error raised by a gather or the transform is re-raised by ``next()`` with its
    original traceback. With ``timeout=`` (seconds), a batch not ready in time raises
    `LoaderTimeoutError` instead of waiting for ever; the workers are daemon threads, so a
    transform that never returns does not hold up ``close()`` or the interpreter's exit.

    ``map`` is a per-record function (a record dict in, a record dict out) run before the
    collate; a ``map`` or ``transform`` with an ``rng`` parameter gets a generator that is a
    pure function of ``(seed, step, position)`` (`chute.loader._recipe`), so augmentations
    resume exactly. ``workers=N`` builds batches in N spawned processes instead of threads
    (for Python work that holds the GIL), handed over through shared memory; the stream of
    batches is the same either way.

    ``sampler`` is a mode name (``"cyclic"``, ``"iid"``, ``"sequential"``, drawn with
    ``batch_size`` and ``seed``; ``"window"``, a `ShardWindowSampler` over the shards of the
    sharded dataset among the streams, ``window=`` shards at a time, default 4) or a sampler
    object such as `WeightedSampler`, which carries its own batch size and seed; what it
    returns for each step is checked (`SamplerError`: a wrong count, a position out of
    range, not integers). ``indices=`` restricts the loader
    to those records (a held-out split, say): the sampler then draws positions in
    ``[0, len(indices))``.

    ``batch_size`` is the global batch. With ``shard=(index, count)`` each process gets its own
    contiguous ``batch_size // count`` slice of it, so all processes together read exactly the
    unsharded stream, and a run can resume on a different number of processes.

    >>> loader = DataLoader({"x": np.arange(10)}, batch_size=4, sampler="sequential")
    >>> next(loader)["x"].tolist(), loader.step
    ([0, 1, 2, 3], 1)
    >>> state = loader.state_dict()  # JSON-able: save it with the checkpoint
    >>> loader.close()
    >>> resumed = DataLoader({"x": np.arange(10)}, batch_size=4, sampler="sequential")
    >>> resumed.load_state_dict(state)  # refused if the configuration differs
    >>> next(resumed)["x"].tolist()
    [4, 5, 6, 7]
    >>> resumed.close()
    """

    # 1: before subsets; 2: before sharded map= draws were keyed by the global position
    _STATE = StateLayout("DataLoader", (3, 2, 1), ("step",), ours="loader")
    _GLOBAL_DRAWS = 3

    @legacy_arguments(positional=_POSITIONAL)
    def __init__(
        self,
        streams: Streams,
        batch_size: int | None = None,
        *,
        sampler: LoaderMode | SamplerLike = "cyclic",
        seed: int | None = None,
        start_step: int | None = None,
        num_threads: int | None = None,
        prefetch: int | None = None,
        transform: Callable[..., Batch] | None = None,
        shard: SliceSpec = None,
        indices: npt.ArrayLike | None = None,
        timeout: float | None = None,
        window: int | None = None,
        map: Callable[..., Record] | None = None,
        workers: int = 0,
        **renamed: Any,
    ) -> None:
        if renamed:
            given: dict[str, Any] = {"num_threads": num_threads, "prefetch": prefetch}
            given["sampler"] = None if isinstance(sampler, str) and sampler == "cyclic" else sampler
            moved = translate(renamed, given, [*_POSITIONAL, "indices", "timeout", "window"])
            num_threads = moved.get("num_threads", num_threads)
            prefetch = moved.get("prefetch", prefetch)
            sampler = moved.get("sampler", sampler)
        super().__init__(as_streams(streams), num_threads, 4 if prefetch is None else prefetch,
                         transform, timeout, map, workers)  # fmt: skip
        self._length = length = check_streams(self.streams)
        self.subset = None if indices is None else IndexSet(indices, length)
        self._space = space = length if self.subset is None else len(self.subset)
        subset = self.subset is not None
        if self.subset is not None and any(isinstance(s, Mixture) for s in self.streams.values()):
            raise ValueError("indices= restricts a stream's records; a mixture's sources take "
                             "their own subsets (chute.split) before mixing")  # fmt: skip
        self.sampler = _make_sampler(sampler, space, batch_size, seed, window, self.streams, subset)
        if start_step is not None:
            self.sampler.seek(_check_u64("start_step", start_step, end=STEP_END))
        self.shard = resolve_slice(shard, self.sampler.batch_size)
        # chute's own samplers draw only in [0, length), sized as asked: nothing to check
        self._trusted = type(self.sampler) in _OURS and self.sampler.length <= space
        index, count = self.shard
        share = self.sampler.batch_size // count
        self._slice = (index * share, (index + 1) * share)

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns (the sampler's step)."""
        return self.sampler.step

    def _move(self, step: int) -> None:
        self.sampler.seek(step)

    @property
    def seed(self) -> int:
        """The sampler's seed: the generators of ``map`` and ``transform`` derive from it."""
        return int(getattr(self.sampler, "seed", 0))

    @property
    def _end(self) -> int:
        return STEP_END

    def seek(self, step: int) -> None:
        """Make ``step`` (at most ``2**64 - 2``) the next batch; work queued for other steps
        is dropped."""
        super().seek(_check_u64("step", step, end=STEP_END))

    @property
    def batch_size(self) -> int:
        """The global batch size (all shards together)."""
        return self.sampler.batch_size

    def _plan(self, step: int) -> tuple[npt.NDArray[np.uint64], Mapping[str, Any]]:
        positions = self.sampler.indices(step, *self._slice)
        if not self._trusted:
            positions = _check_positions(self.sampler, step, self._slice, positions, self._space)
        return (positions if self.subset is None else self.subset.map(positions)), {}

    def epoch(self, batch_size: int | None = None, last: Last = "partial") -> EvalPass:
        """One finite, ordered pass over this loader's records (its ``indices=`` if any).

        Same streams, transform, threads, prefetch, shard and timeout as the loader; see
        `iterate`.
        """
        return EvalPass(
            self.streams,
            self.batch_size if batch_size is None else batch_size,
            indices=None if self.subset is None else self.subset.array,
            last=last,
            num_threads=self.num_threads,
            prefetch=self.prefetch,
            transform=self.transform,
            shard=self.shard,
            timeout=self.timeout,
            map=self.map,
            workers=self.workers,
        )

    def _config(self) -> dict[str, Any]:
        return {
            **sampler_config(self.sampler),
            "length": self._length,
            "indices": None if self.subset is None else self.subset.fingerprint,
        }

    def __repr__(self) -> str:
        subset = "" if self.subset is None else f", indices={self.subset.fingerprint}"
        return (
            f"DataLoader(streams={list(self.streams)}, {self.sampler!r}{subset}, "
            f"shard={self.shard}, num_threads={self.num_threads}, prefetch={self.prefetch})"
        )
