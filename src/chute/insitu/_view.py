"""A dataset's split views, the iterator of one pass over a view, and the resolved config."""

from __future__ import annotations

import queue
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from ._scheduler import END, PassPlan
from ._transforms import Batch

ViewName = Literal["train", "val", "test", "all"]
Prepare = Callable[[Batch], Any]
"""A device stage's host-side work on a finished batch (see ``ViewSource.run_pass``)."""
VIEWS: tuple[ViewName, ...] = ("train", "val", "test", "all")


class ViewSource(Protocol):
    """What a view and its pass iterator use of their dataset, and all they use of it.

    :class:`~chute.insitu.InSituDataset` implements it; this module depends on the
    protocol only, so the dependency runs one way, from the dataset to its views. The
    methods are internal (for the views), except ``batch_spec``, which the framework
    hand-offs reach through ``view.dataset``.
    """

    def open_pass(self, view: str, prepare: Prepare | None = None) -> PassIterator:
        """A new iterator over ``view``'s pass, registered as open (refused while one is);
        ``prepare``: see ``run_pass``."""
        ...

    def run_pass(self, view: str, prepare: Prepare | None = None) -> Generator[Any, None, None]:
        """The batches of ``view``'s pass, from its position on, advancing it. With
        ``prepare`` (a device stage's pass) every array of a batch is put in the dataset's
        ring, then ``prepare`` runs on the batch, both on the gather thread."""
        ...

    def end_pass(self, view: str, it: PassIterator) -> None:
        """Forget ``it`` as ``view``'s open pass (if it still is), freeing the view."""
        ...

    def pass_plan(self, view: str) -> PassPlan:
        """The current epoch's plan of ``view``'s pass."""
        ...

    def position(self, view: str) -> int:
        """Batches of ``view``'s pass handed out this epoch."""
        ...

    def batch_spec(self) -> dict[str, tuple[tuple[int | None, ...], np.dtype[Any]]]:
        """``{key: (shape, dtype)}`` of the batches, ``None`` for the batch axis."""
        ...


@dataclass(frozen=True)
class InSituConfig:
    """The resolved settings of a dataset (defaults filled in from the machine and data).

    >>> import tempfile, numpy as np, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> t2m[:] = np.arange(80).reshape(40, 2)
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> ds = InSituDataset(path, manifest, batch_size=8)
    >>> ds.config.batch_size, ds.config.shuffle, ds.config.budget_is_automatic
    (8, True, True)
    >>> ds.close()
    """

    batch_size: int
    block_chunks: int
    max_inflight: int
    decode_threads: int
    prefetch_depth: int
    cache_budget_bytes: int
    budget_is_automatic: bool
    seed: int
    shuffle: bool
    shard: tuple[int, int] | None
    on_bad_chunk: Literal["raise", "skip", "nan"]
    cache_dir: str | None


class SplitView:
    """One split of a dataset; iterating it runs one pass (an epoch for ``train``).

    A pass resumes from the dataset's ``state_dict``, after the batches it handed out:

    >>> import tempfile, numpy as np, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> t2m[:] = np.arange(80).reshape(40, 2)
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> ds = InSituDataset(path, manifest, batch_size=8)
    >>> len(ds.train), ds.train.n_samples
    (3, 20)
    >>> epoch = iter(ds.train)
    >>> first = next(epoch); state = ds.state_dict(); epoch.close()  # a checkpoint
    >>> resumed = InSituDataset(path, manifest, batch_size=8)
    >>> resumed.load_state_dict(state)
    >>> rest = [batch.sample_indices for batch in resumed.train]  # batches 2 and 3
    >>> sorted(np.concatenate([first.sample_indices, *rest]).tolist()) == list(range(20))
    True
    >>> ds.close(); resumed.close()
    """

    def __init__(self, dataset: ViewSource, name: ViewName) -> None:
        self._dataset = dataset
        self.name = name

    def __iter__(self) -> PassIterator:
        """Start a pass. A second ``iter()`` while a pass of this view is still open (not
        exhausted nor closed) raises ``RuntimeError``: two iterators over one pass would
        hand out the same batches twice."""
        return self._dataset.open_pass(self.name)

    @property
    def dataset(self) -> ViewSource:
        """The dataset this view belongs to (an :class:`~chute.insitu.InSituDataset`)."""
        return self._dataset

    def __len__(self) -> int:
        """Batches in the current epoch's pass (including any already consumed)."""
        return self._dataset.pass_plan(self.name).n_batches

    @property
    def n_samples(self) -> int:
        return len(self._dataset.pass_plan(self.name).order)

    @property
    def position(self) -> int:
        """Batches of this epoch's pass handed out so far, counting those a skipped chunk
        emptied (what ``state_dict`` records)."""
        return self._dataset.position(self.name)

    def __repr__(self) -> str:
        return f"SplitView({self.name!r}, batches={len(self)})"


class PassIterator:
    """The iterator of one pass over a view; the view is free again once it is exhausted,
    fails, is closed, or is garbage collected."""

    def __init__(self, dataset: ViewSource, view: str, prepare: Prepare | None = None) -> None:
        self._dataset = dataset
        self.view = view
        self._batches = dataset.run_pass(view, prepare)

    def __iter__(self) -> PassIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._batches)
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        """End the pass early; the next iteration of the view continues after its batches."""
        self._batches.close()
        self._release()

    def _release(self) -> None:
        self._dataset.end_pass(self.view, self)


def next_item(out: queue.Queue[Any], future: Any) -> Any:
    """The next queue item, surfacing a crash of the producer instead of hanging."""
    while True:
        try:
            return out.get(timeout=0.2)
        except queue.Empty:
            if future.done():
                try:
                    return out.get_nowait()
                except queue.Empty:
                    future.result()
                    return END
