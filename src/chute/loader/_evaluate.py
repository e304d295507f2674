"""Finite, ordered passes for evaluation: every record exactly once, no wrap-around."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal, ParamSpec, get_args

import numpy as np
import numpy.typing as npt

from chute._util.process_slice import SliceSpec, resolve_slice
from chute._util.renamed import legacy_arguments
from chute._util.state import StateLayout
from chute.loader._pipeline import Pipeline
from chute.loader._recipe import Record
from chute.loader._sampler import _check_u64
from chute.loader._streams import Batch, Streams, as_streams, check_streams
from chute.loader._subset import IndexSet

Last = Literal["partial", "pad"]
"""The final batch of a pass: ``"partial"`` (shorter) or ``"pad"`` (full, with a mask)."""

P = ParamSpec("P")

MASK = "mask"
"""The batch key of the row mask in ``last="pad"`` passes."""


class EvalPass(Pipeline):
    """One pass over the records in order, ``batch_size`` at a time; see `iterate`.

    `iterate` and `DataLoader.epoch` build one; a pass resumes from its ``state_dict`` too.

    >>> import numpy as np
    >>> from chute import EvalPass
    >>> labels = np.arange(5) * 10
    >>> with EvalPass({"y": labels}, batch_size=2) as p:
    ...     len(p), [batch["y"].tolist() for batch in p]
    (3, [[0, 10], [20, 30], [40]])
    """

    # 1: before sharded map= draws were keyed by the global position
    _STATE = StateLayout("EvalPass", (2, 1), ("step",), ours="pass")
    _GLOBAL_DRAWS = 2

    @legacy_arguments()
    def __init__(
        self,
        streams: Streams,
        batch_size: int,
        *,
        indices: npt.ArrayLike | None = None,
        last: Last = "partial",
        num_threads: int | None = None,
        prefetch: int = 4,
        transform: Callable[..., Batch] | None = None,
        shard: SliceSpec = None,
        timeout: float | None = None,
        map: Callable[..., Record] | None = None,
        workers: int = 0,
    ) -> None:
        super().__init__(as_streams(streams), num_threads, prefetch, transform, timeout,
                         map, workers)  # fmt: skip
        self._records = length = check_streams(self.streams)
        if last not in get_args(Last):
            raise ValueError(f"last must be one of {get_args(Last)}, got {last!r}")
        if last == "pad" and MASK in self.streams:
            raise ValueError(f"last='pad' adds a {MASK!r} entry, which a stream already uses")
        self.batch_size = _check_u64("batch_size", batch_size, minimum=1)
        self.subset = None if indices is None else IndexSet(indices, length)
        self.length = length if self.subset is None else len(self.subset)
        self.last: Last = last
        self.shard = resolve_slice(shard, self.batch_size)
        index, count = self.shard
        share = self.batch_size // count
        self._slice = (index * share, (index + 1) * share)
        self.steps = -(-self.length // self.batch_size)
        self._step = 0

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns; the pass ends at `steps`."""
        return self._step

    def _move(self, step: int) -> None:
        step = _check_u64("step", step)
        if step > self.steps:
            raise ValueError(f"step {step} is past the end of a pass of {self.steps} steps")
        self._step = step

    @property
    def _end(self) -> int:
        return self.steps

    def __len__(self) -> int:
        return self.steps

    def _config(self) -> dict[str, Any]:
        return {
            "pass": self.last,
            "batch_size": self.batch_size,
            "length": self._records,
            "indices": None if self.subset is None else self.subset.fingerprint,
        }

    def _plan(self, step: int) -> tuple[npt.NDArray[np.uint64], Mapping[str, Any]]:
        if not 0 <= step < self.steps:
            raise ValueError(f"step {step} is outside a pass of {self.steps} steps")
        first = step * self.batch_size
        positions = np.arange(first + self._slice[0], first + self._slice[1], dtype=np.uint64)
        extra: dict[str, Any] = {}
        if self.last == "pad":
            valid = positions < self.length
            extra[MASK] = valid
            positions = np.where(valid, positions, np.uint64(self.length - 1))
        else:
            positions = positions[positions < self.length]
        return (positions if self.subset is None else self.subset.map(positions)), extra

    def __repr__(self) -> str:
        return (
            f"EvalPass(streams={list(self.streams)}, batch_size={self.batch_size}, "
            f"records={self.length}, steps={self.steps}, last={self.last!r}, shard={self.shard})"
        )


def _signature_of(
    cls: Callable[P, EvalPass],
) -> Callable[[Callable[..., EvalPass]], Callable[P, EvalPass]]:
    """Give a front that forwards everything to ``cls`` the constructor's parameters, for
    type checkers (``P``) and for `inspect.signature` / ``help()``."""

    def front(fn: Callable[..., EvalPass]) -> Callable[P, EvalPass]:
        params = inspect.signature(cls).parameters.values()
        fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            list(params), return_annotation="EvalPass"
        )
        return fn

    return front


@_signature_of(EvalPass)
def iterate(*args: Any, **kwargs: Any) -> EvalPass:
    """``iterate(streams, batch_size, *, indices=None, last="partial", num_threads=None,
    prefetch=4, transform=None, shard=None, timeout=None, map=None, workers=0)``: a finite
    pass (an `EvalPass`) visiting every record (or each of ``indices``) exactly once, in
    order.

    Batches are ``batch_size`` records (the global batch, split by ``shard`` as in
    `DataLoader`); the final one is shorter with ``last="partial"``, or full with
    ``last="pad"``, which repeats the last record and adds ``batch["mask"]``, True for the
    real rows (fixed shapes for jit-compiled steps and multi-host collectives). Threads,
    worker processes, prefetch, map, transform, timeout and errors work as in the endless
    loader; ``len()`` is the
    number of steps. With shards, every process runs the same number of steps.

    >>> [b["x"].tolist() for b in iterate({"x": np.arange(5)}, batch_size=2)]
    [[0, 1], [2, 3], [4]]
    >>> [b["mask"].tolist() for b in iterate({"x": np.arange(5)}, 2, last="pad")][-1]
    [True, False]
    """
    return EvalPass(*args, **kwargs)
