"""The shard-window sampler: a shuffle whose working set is a few shards, not the dataset.

A sharded dataset is many shards of consecutive records. Each cycle permutes the order of the
shards, cuts that order into windows of ``window`` consecutive shards, and permutes the records
of each window; the cycle's batches run through the windows one after the other. At any step a
batch reads one window's shards (two where it straddles a window boundary), so a cache of a few
shards per host serves a whole epoch with every shard fetched once.

Both permutations are the cyclic sampler's keyed Feistel network, keyed by (seed, cycle) for
the shard order (the compiled ``fill``, once per cycle) and by (seed, cycle, window) for a
window's records (``fill_window``, which also finds each record's shard), so the batch at any
step is computed directly, as in every mode.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._native import fill as _fill
from chute._native import fill_window as _fill_window
from chute._util.checks import check_int
from chute._util.renamed import legacy_arguments
from chute.loader._sampler import _MODES, _U64, StepSampler, _check_u64
from chute.loader._streams import Stream

__all__ = ["ShardWindowSampler"]

_CYCLIC = _MODES["cyclic"]
_MASK = _U64 - 1
_GOLDEN = 0x9E3779B97F4A7C15
_SHARD_DOMAIN = 0x5368617264735F4F  # keeps the shard order apart from cyclic draws of a seed
_RECORD_DOMAIN = 0x57696E646F775F52  # and a window's record order apart from both
_CACHED_CYCLES = 2  # a prefetching loader works on two cycles at once only at their boundary
DEFAULT_WINDOW = 4


def _mix64(z: int) -> int:
    """SplitMix64's finaliser (the compiled sampler's mixer): a bijection of 64-bit ints."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass(frozen=True)
class _Cycle:
    """One cycle laid out: its shard order, where each shard and each window begins in the
    cycle's stream of records, and what turns a stream offset into a record index."""

    order: npt.NDArray[np.uint64]  # shard at each place of the cycle's order
    begins: npt.NDArray[np.uint64]  # stream offset of each place, then the total (places + 1)
    shift: npt.NDArray[np.uint64]  # record = offset + shift[place] (mod 2**64)
    edges: list[int]  # stream offset of each window, then the total (bisected per batch)


def _check_lengths(shard_lengths: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """The shard lengths as a uint64 array, once they are a non-empty 1-D sequence of
    non-negative integers with a total in ``[1, 2**64)``."""
    given = np.asarray(shard_lengths)
    if given.shape == (0,):
        raise ValueError("shard_lengths is empty: a shard-window sampler needs at least one shard")
    if given.dtype == np.bool_ or given.dtype.kind not in "iuO" or given.ndim != 1:
        raise TypeError(
            "shard_lengths must be a 1-D sequence of ints (records per shard), got "
            f"{given.dtype} of shape {given.shape}"
        )
    if given.dtype.kind == "O":  # Python ints past int64, or a mix of types
        for i, n in enumerate(given):
            check_int(f"shard_lengths[{i}]", n, maximum=_U64 - 1)
        given = given.astype(np.uint64)
    elif given.dtype.kind == "i" and (given < 0).any():
        bad = int(np.argmax(given < 0))
        raise ValueError(f"shard_lengths[{bad}] is {int(given[bad])}: a shard holds >= 0 records")
    lengths = given.astype(np.uint64)
    total = np.cumsum(lengths, dtype=np.uint64)
    if (total[1:] < total[:-1]).any():  # a sum past 2**64 wraps below the one before it
        raise ValueError("shard_lengths add up to 2**64 records or more")
    if total[-1] == 0:
        raise ValueError(f"the {lengths.size} shards hold no records: there is nothing to sample")
    lengths.flags.writeable = False
    return lengths


class ShardWindowSampler(StepSampler):
    """Shuffles a sharded dataset a window of shards at a time, so few shards are in use.

    Records ``[0, sum(shard_lengths))`` form consecutive shards of the given lengths. Cycle
    ``c`` permutes the order of the shards (keyed by seed and ``c``), cuts it into windows of
    ``window`` consecutive shards (the last may hold fewer) and permutes each window's records
    (keyed by seed, ``c`` and the window); its ``length // batch_size`` steps draw full batches
    through that sequence, and the remainder, the last ``length % batch_size`` records of the
    last window, is dropped (other records each cycle, as the order changes). So each cycle
    draws every record at most once, and every record exactly once when the batch size
    divides the length.

    A batch reads the shards of one window, or of two where it straddles a window boundary
    (more only when a window holds fewer records than a batch): with a cache of ``2 * window``
    shards per host a cycle fetches each shard once. Larger windows mix more shards per batch;
    ``window >= len(shard_lengths)`` is a full shuffle.

    Any step is computed directly: ``seek`` is O(1), a batch slice costs O(its length + log
    shards), with one Python step per window it touches. The first batch drawn from a cycle
    lays the cycle out, O(shards) once (the last two cycles are kept).

    >>> s = ShardWindowSampler([4, 4, 4, 4], batch_size=4, window=2, seed=0)
    >>> s.steps_per_cycle
    4
    >>> cycle = sorted(int(i) for step in range(4) for i in s.indices(step))
    >>> cycle == list(range(16))  # every record once per cycle
    True
    >>> shards = {int(i) // 4 for i in s.indices(0)}  # the first window's two shards
    >>> shards <= {int(x) for x in s.shard_order(0)[:2]}
    True
    """

    @legacy_arguments()
    def __init__(
        self,
        shard_lengths: npt.ArrayLike,
        batch_size: int,
        *,
        window: int = DEFAULT_WINDOW,
        seed: int = 0,
    ) -> None:
        lengths = _check_lengths(shard_lengths)
        starts = np.zeros(lengths.size, np.uint64)
        np.cumsum(lengths[:-1], out=starts[1:])
        super().__init__(int(starts[-1] + lengths[-1]), batch_size, seed=seed)
        self.window = check_int("window", window, minimum=1, unit=" shards")
        if self.batch_size > self.length:
            raise ValueError(
                f"a batch of {self.batch_size} cannot be drawn without replacement from "
                f"{self.length} records; use a smaller batch"
            )
        self._lengths = lengths
        self._starts = starts
        self._digest = hashlib.blake2b(lengths.tobytes(), digest_size=8).hexdigest()
        self._shard_key = _mix64(self.seed ^ _SHARD_DOMAIN)
        self._record_key = _mix64(self.seed ^ _RECORD_DOMAIN)
        self._cycles: dict[int, _Cycle] = {}
        self._lock = threading.Lock()

    @property
    def shard_lengths(self) -> npt.NDArray[np.uint64]:
        """Records per shard, in index order (read-only)."""
        return self._lengths

    @property
    def steps_per_cycle(self) -> int:
        """Steps in one cycle: ``length // batch_size``."""
        return self.length // self.batch_size

    def shard_order(self, cycle: int) -> npt.NDArray[np.uint64]:
        """The order of the shards in ``cycle`` (cycle ``c`` holds steps ``c *
        steps_per_cycle`` onwards); its windows are consecutive runs of ``window`` shards.
        What a cache may fetch ahead."""
        return self._cycle(_check_u64("cycle", cycle)).order.copy()

    def _cycle(self, cycle: int) -> _Cycle:
        laid = self._cycles.get(cycle)
        if laid is not None:
            return laid
        places = self._lengths.size
        order = np.empty(places, np.uint64)
        _fill(_CYCLIC, places, places, self._shard_key, cycle, 0, order)
        begins = np.zeros(places + 1, np.uint64)
        np.cumsum(self._lengths[order], out=begins[1:])
        shift = self._starts[order] - begins[:-1]  # wraps below 0; the sum with an offset does not
        edges = begins[np.r_[0:places:self.window, places]].tolist()  # fmt: skip
        laid = _Cycle(order, begins, shift, edges)
        with self._lock:  # the loader's workers draw concurrently
            self._cycles[cycle] = laid
            while len(self._cycles) > _CACHED_CYCLES:
                del self._cycles[next(iter(self._cycles))]
        return laid

    def fill(self, step: int, start: int, out: npt.NDArray[np.uint64]) -> None:
        if not len(out):
            return
        cycle, at = divmod(step, self.steps_per_cycle)
        laid = self._cycle(cycle)
        first = at * self.batch_size + start
        end = first + len(out)
        edges, places = laid.edges, self._lengths.size
        w = bisect.bisect_right(edges, first) - 1
        pos = first
        while pos < end:
            low, high = edges[w], edges[w + 1]
            if high > pos:  # a window of empty shards holds no position
                stop = min(end, high)
                head, tail = w * self.window, min((w + 1) * self.window, places)
                key = _mix64(self._record_key ^ ((w + 1) * _GOLDEN & _MASK))
                _fill_window(laid.begins[head : tail + 1], laid.shift[head:tail], key, cycle,
                             pos - low, out[pos - first : stop - first])  # fmt: skip
                pos = stop
            w += 1

    def fingerprint(self) -> Any:
        return {"kind": "window", "window": self.window, "shards": self._digest}

    def __repr__(self) -> str:
        return (
            f"ShardWindowSampler(shards={self._lengths.size}, length={self.length}, "
            f"batch_size={self.batch_size}, window={self.window}, seed={self.seed}, "
            f"step={self._step})"
        )


def window_sampler(
    streams: Mapping[str, Stream],
    length: int,
    batch_size: int,
    seed: int,
    window: int | None,
    subset: bool,
) -> ShardWindowSampler:
    """The loader's ``sampler="window"``: a `ShardWindowSampler` over the shards of the
    sharded dataset(s) among ``streams`` (their ``shard_lengths``, which must agree and add up
    to the streams' ``length``)."""
    if subset:
        raise ValueError(
            "sampler='window' windows the dataset's own shards, which indices= would cut "
            "through; pass a ShardWindowSampler over the subset's own grouping instead"
        )
    found: dict[str, npt.NDArray[Any]] = {}
    for name, stream in streams.items():
        lengths = getattr(stream, "shard_lengths", None)
        if lengths is not None:
            found[name] = np.asarray(lengths)
    if not found:
        raise ValueError(
            f"sampler='window' needs a sharded dataset among the streams; {sorted(streams)} "
            "have no shards (write one with chute.write_dataset(..., shard_records=n), or pass "
            "sampler=chute.ShardWindowSampler(shard_lengths, batch_size))"
        )
    (name, lengths), *others = found.items()
    for other, theirs in others:
        if not np.array_equal(lengths, theirs):
            raise ValueError(
                f"sampler='window': streams {name!r} and {other!r} are sharded differently "
                f"({lengths.size} and {theirs.size} shards); the windows need one grouping"
            )
    sampler = ShardWindowSampler(
        lengths, batch_size, window=DEFAULT_WINDOW if window is None else window, seed=seed
    )
    if sampler.length != length:
        raise ValueError(
            f"sampler='window': the shards of stream {name!r} hold {sampler.length} records, "
            f"the streams {length}"
        )
    return sampler
