"""What a loader does with a step's gathered records: the per-record ``map``, the collate, the
batch ``transform``, and the random generators they may ask for.

One `Recipe`, run on the loader's threads or in its worker processes (it pickles), so the
stream of batches is the same for any number of either. A ``map`` or ``transform`` that has a
parameter named ``rng`` gets a ``numpy.random.Generator`` that is a pure function of the run:
Philox keyed by ``(seed, step)``, its counter set by the record's position in the step's
*global* batch (``offset``, the first position of this host's slice with ``shard=``, plus the
record's place in the slice), so a record draws the same numbers sharded or not, on any
number of hosts. The transform gets a lane of its own, keyed by ``(seed, step)`` alone: the
same generator on every host. Augmentations are then the same across a resume, any worker
count and any machine, and differ from cycle to cycle, since the step does.

>>> import numpy as np
>>> def flip(record, rng):
...     return {"x": record["x"][::-1] if rng.random() < 0.5 else record["x"]}
>>> recipe = Recipe(map=flip, transform=None, seed=0)
>>> batch = recipe.finish(7, {"x": np.arange(6).reshape(3, 2)})
>>> np.array_equal(batch["x"], recipe.finish(7, {"x": np.arange(6).reshape(3, 2)})["x"])
True
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Batch = dict[str, Any]
Record = dict[str, Any]

_U64 = (1 << 64) - 1
_TRANSFORM_LANE = 1  # the counter word that tells the transform's generator from the records'


def wants_rng(fn: Callable[..., Any] | None) -> bool:
    """Whether ``fn`` takes a parameter named ``rng`` (by keyword)."""
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    rng = params.get("rng")
    return rng is not None and rng.kind in (rng.POSITIONAL_OR_KEYWORD, rng.KEYWORD_ONLY)


def generator(seed: int, step: int, position: int, lane: int = 0) -> np.random.Generator:
    """The generator of record ``position`` at ``step`` of a run seeded ``seed`` (``lane`` 1:
    the batch transform's): Philox, its key ``(seed, step)``, its counter starting at
    ``(0, 0, position, lane)``, so no two records' draws overlap short of 2**64 blocks each.

    >>> a = generator(0, 5, 1).integers(1 << 30, size=3)
    >>> b = generator(0, 5, 1).integers(1 << 30, size=3)
    >>> bool((a == b).all()), bool((a == generator(0, 6, 1).integers(1 << 30, size=3)).all())
    (True, False)
    """
    key = np.array([seed & _U64, step & _U64], np.uint64)
    counter = np.array([0, 0, position & _U64, lane], np.uint64)
    return np.random.Generator(np.random.Philox(key=key, counter=counter))


def split(value: Any, n: int) -> list[Any]:
    """A gathered batch of ``n`` records as its records: rows of an array, rows of a packed
    ``(values, row_splits)`` pair, or the items of a sequence."""
    if isinstance(value, np.ndarray):
        return list(value)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], np.ndarray):
        values, splits = value
        if len(splits) == n + 1:
            at = splits.astype(np.int64).tolist()
            return [values[at[k] : at[k + 1]] for k in range(n)]
    if isinstance(value, Sequence) and len(value) == n:
        return list(value)
    raise TypeError(
        f"cannot split a gathered {type(value).__name__} into {n} records for map=: a stream "
        "must gather an array, a (values, row_splits) pair or a sequence of records"
    )


def collate(records: Sequence[Mapping[str, Any]]) -> Batch:
    """Records (dicts) as a batch: each key's values stacked where they are arrays or numbers
    of one shape and dtype, else kept as a list (arrays of varying shapes, say, or bytes)."""
    if not records:
        return {}
    for k, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TypeError(f"map= must return a dict (one record), got a "
                            f"{type(record).__name__} for record {k} of the batch")  # fmt: skip
    keys = list(records[0])  # the batch's order; other records may list them in any order
    for k, record in enumerate(records):
        if record.keys() != records[0].keys():
            raise TypeError(
                f"map= returned keys {sorted(map(str, record))} for record {k} of the batch, "
                f"{sorted(map(str, keys))} for record 0: every record needs the same keys"
            )
    return {key: _stack([record[key] for record in records]) for key in keys}


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if not isinstance(first, (np.ndarray, np.generic, int, float)):
        return values
    arrays = [np.asarray(v) for v in values]
    same = all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype for a in arrays)
    return np.stack(arrays) if same and not arrays[0].dtype.hasobject else values


@dataclass(frozen=True)
class Recipe:
    """The per-record ``map`` (a record dict in, a record dict out), the batch ``transform``
    (a batch dict in, a batch dict out), the seed their generators derive from and ``offset``,
    the position in the global batch of this host's first record (``shard=``)."""

    map: Callable[..., Record] | None
    transform: Callable[..., Batch] | None
    seed: int
    offset: int = 0

    def __post_init__(self) -> None:
        for name in ("map", "transform"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                what = "record dict" if name == "map" else "batch dict"
                raise TypeError(f"{name} must be a callable taking and returning a {what}")

    @property
    def identity(self) -> bool:
        """Whether the recipe leaves a gathered batch as it is."""
        return self.map is None and self.transform is None

    def finish(self, step: int, batch: Batch, streams: Sequence[str] | None = None) -> Batch:
        """``batch`` (the streams ``streams`` gathered, default all its entries, plus any
        others) mapped record by record, collated, then transformed. The mapped batch is
        what ``map`` returns, then the other entries it did not name: the gathered streams
        are replaced, not kept beside it."""
        if self.map is not None:
            names = list(batch) if streams is None else list(streams)
            mapped = self._mapped(step, {k: batch[k] for k in names})
            rest = {k: v for k, v in batch.items() if k not in mapped and k not in names}
            batch = {**mapped, **rest}
        if self.transform is not None:
            if wants_rng(self.transform):
                rng = generator(self.seed, step, 0, _TRANSFORM_LANE)
                batch = self.transform(batch, rng=rng)
            else:
                batch = self.transform(batch)
        return batch

    def _mapped(self, step: int, gathered: Mapping[str, Any]) -> Batch:
        assert self.map is not None
        n = _count(gathered)
        columns = {name: split(value, n) for name, value in gathered.items()}
        records = [{name: column[k] for name, column in columns.items()} for k in range(n)]
        fn = self.map
        if wants_rng(fn):
            at = self.offset
            out = [fn(r, rng=generator(self.seed, step, at + k)) for k, r in enumerate(records)]
        else:
            out = [fn(r) for r in records]
        return collate(out)


def _count(gathered: Mapping[str, Any]) -> int:
    """How many records a gathered batch holds (its first stream's)."""
    for value in gathered.values():
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], np.ndarray):
            return len(value[1]) - 1
        return len(value)
    return 0
