"""InSituDataset: shuffled, split-aware numpy batches straight from a Zarr v3 archive."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import CancelledError
from dataclasses import asdict, replace
from typing import Any, Literal

import numpy as np

from chute._util.buffers import Allocate, BatchBuffers
from chute._util.checks import check_int
from chute._util.closing import Closing
from chute._util.cores import usable_cores
from chute._util.process_slice import SliceSpec, resolve_slice
from chute._util.renamed import legacy_arguments
from chute._util.state import check_state, make_state

from ._aio import run_sync
from ._geometry import ArrayGeometry, read_geometries, valid_anchor_range
from ._options import InSituOptions, archive_stamp, check_keywords, identity_of
from ._plan import OrderSpec, SlabUse, sample_order, slab_use, working_set
from ._pool import ChunkPool
from ._report import limiting_stage
from ._scheduler import CLOSED_DURING_PASS, END, Engine, PassPlan
from ._setup import as_manifest, check_geometries, default_block_chunks
from ._shared import SharedChunks
from ._split import SplitManifest
from ._state import LAYOUT, order_fields, snapshot_hint
from ._store import CountingStore, StoreLike, open_store, session_of, store_name
from ._transforms import (
    Batch,
    BatchTransform,
    ChunkTransform,
    run_batch_transform,
    run_chunk_transform,
)
from ._view import VIEWS, InSituConfig, PassIterator, Prepare, SplitView, next_item

REMOTE_INFLIGHT_BYTES = 64 << 20  # bytes in flight that hide object-store latency
_BATCHES_HELD = 3  # beyond the queue: one being gathered, one in the pass, one consumed


def _keywords() -> list[str]:
    return [
        n
        for n, p in inspect.signature(InSituDataset.__init__).parameters.items()
        if p.kind is p.KEYWORD_ONLY or (n != "self" and p.kind is p.POSITIONAL_OR_KEYWORD)
    ]


class InSituDataset(Closing):
    """Shuffled, split-aware batches read in place from a Zarr archive or Icechunk session.

    Iterate a view: ``ds.train`` (chunk order permuted per ``(seed, epoch)``, samples
    shuffled within windows of ``block_chunks`` chunks; in chunk order with
    ``shuffle=False``), ``ds.val``, ``ds.test``, ``ds.all`` (deterministic). All views
    share one :class:`ChunkPool`, so a chunk is read and decoded once while it fits.
    Batches are :class:`Batch` dicts ``{variable: ndarray, "sample_indices": ...}``,
    samples on axis 0. Unset ``block_chunks``, ``max_inflight`` and
    ``cache_budget_bytes`` are derived from the core count, the chunk size and the
    budget; ``describe()`` shows what was chosen and what it costs. An unknown keyword
    is a ``TypeError`` naming the nearest valid one, raised before anything is read.

    >>> import tempfile, numpy as np, zarr
    >>> path = tempfile.mkdtemp() + "/weather.zarr"  # 40 samples in chunks of 10
    >>> t2m = zarr.open_group(path, mode="w").create_array("t2m", shape=(40, 2), chunks=(10, 2),
    ...                                                     dtype="f4")
    >>> t2m[:] = np.arange(80).reshape(40, 2)
    >>> from chute.insitu import InSituDataset, open_geometries, split_by_chunk
    >>> manifest = split_by_chunk(open_geometries(path)["t2m"], (0.5, 0.25, 0.25))
    >>> ds = InSituDataset(path, manifest, batch_size=8, seed=0)
    >>> for epoch in range(2):
    ...     ds.set_epoch(epoch)  # reshuffles train
    ...     seen = np.concatenate([batch.sample_indices for batch in ds.train])
    ...     print(sorted(seen.tolist()) == list(range(20)), len(seen))
    True 20
    True 20
    >>> batch = next(iter(ds.val))  # in order, no shuffle
    >>> batch["t2m"].shape, batch.sample_indices[:3].tolist()
    ((8, 2), [20, 21, 22])
    >>> ds.close()
    """

    @legacy_arguments(renamed={"prefetch_depth": "prefetch", "decode_threads": "num_threads"})
    def __init__(
        self,
        url: StoreLike,
        manifest: SplitManifest | Mapping[str, Any] | str | os.PathLike[str],
        geometries: Mapping[str, ArrayGeometry] | None = None,
        *,
        batch_size: int = 32,
        block_chunks: int | None = None,
        max_inflight: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        prefetch: int = 2,
        cache_budget_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        chunk_transforms: Sequence[ChunkTransform] = (),
        batch_transforms: Sequence[BatchTransform] = (),
        shard: SliceSpec = None,
        on_bad_chunk: Literal["raise", "skip", "nan"] = "raise",
        num_threads: int | None = None,
        options: InSituOptions | None = None,
        **store_kwargs: Any,
    ) -> None:
        check_keywords(url, store_kwargs, _keywords())
        given = InSituOptions(
            batch_size=batch_size, block_chunks=block_chunks, max_inflight=max_inflight,
            seed=seed, shuffle=shuffle, prefetch=prefetch, cache_budget_bytes=cache_budget_bytes,
            cache_dir=cache_dir, chunk_transforms=chunk_transforms,
            batch_transforms=batch_transforms, shard=shard, on_bad_chunk=on_bad_chunk,
            num_threads=num_threads, store_options=store_kwargs,
        )  # fmt: skip
        if options is None:
            options = given
        elif given != InSituOptions():
            raise TypeError(
                "InSituDataset() takes its options as options= or as keywords, not both"
            )
        elif not isinstance(options, InSituOptions):
            raise TypeError(f"options= takes an InSituOptions, got {type(options).__name__}")
        else:
            check_keywords(url, options.store_options, _keywords())
        self.options = o = options
        batch_size, block_chunks, max_inflight = o.batch_size, o.block_chunks, o.max_inflight
        cache_budget_bytes, shard, on_bad_chunk = o.cache_budget_bytes, o.shard, o.on_bad_chunk
        chunk_transforms, batch_transforms = o.chunk_transforms, o.batch_transforms
        try:
            index, count = resolve_slice(shard)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"shard: {exc}") from None
        session = session_of(url)
        if session is not None and not session.read_only:
            raise ValueError(
                "pass a read-only Icechunk session (repo.readonly_session(branch=..., tag=... "
                "or snapshot_id=...)): a writable one can change under the loader"
            )
        self.snapshot_id: str | None = None if session is None else str(session.snapshot_id)
        self.manifest = as_manifest(manifest)
        self.store = CountingStore(open_store(url, **o.store_options))
        name = store_name(url)
        self.geometries = check_geometries(
            self.manifest,
            dict(geometries) if geometries is not None else read_geometries(self.store, name),
            explicit=geometries is not None,
        )
        cores = usable_cores()
        stored = self._stored_chunk_nbytes()
        if max_inflight is None:
            max_inflight = 2 * cores
            if isinstance(url, str) and url.startswith("s3://"):
                max_inflight = max(max_inflight, min(64, REMOTE_INFLIGHT_BYTES // max(stored, 1)))
        block_bytes = self.manifest.sample_chunk_size * sum(
            g.sample_nbytes for g in self.geometries.values()
        )
        if block_chunks is None:
            block_chunks = default_block_chunks(
                cores, max_inflight, batch_size, self.manifest.sample_chunk_size
            )
            if cache_budget_bytes is not None:
                block_chunks = max(1, min(block_chunks, cache_budget_bytes // (2 * block_bytes)))
        self._epoch = 0
        self._positions: dict[str, int] = dict.fromkeys(VIEWS, 0)
        self._open: weakref.WeakValueDictionary[str, PassIterator] = weakref.WeakValueDictionary()
        self._opening = threading.Lock()
        self._plans: dict[tuple[str, int], PassPlan] = {}
        self._consumer_wait = 0.0
        self._consumer_wall = 0.0
        self.config = InSituConfig(
            batch_size=batch_size,
            block_chunks=block_chunks,
            max_inflight=max_inflight,
            decode_threads=o.num_threads or cores,
            prefetch_depth=o.prefetch,
            cache_budget_bytes=cache_budget_bytes or 1,
            budget_is_automatic=cache_budget_bytes is None,
            seed=int(o.seed),
            shuffle=o.shuffle,
            shard=None if count == 1 else (index, count),
            on_bad_chunk=on_bad_chunk,
            cache_dir=None if o.cache_dir is None else os.fspath(o.cache_dir),
        )
        needed = max(self._required_bytes(v) for v in VIEWS)
        if cache_budget_bytes is None:
            budget = max(max(self._working_set(v, lookahead=True) for v in VIEWS), 1)
            self.config = replace(self.config, cache_budget_bytes=budget)
        elif cache_budget_bytes < needed:
            raise ValueError(
                f"cache_budget_bytes={cache_budget_bytes} is below the {needed} bytes one pass "
                f"must hold at once (block_chunks={block_chunks}, batch_size={batch_size}); "
                "raise the budget or lower block_chunks"
            )
        self.pool = ChunkPool(self.config.cache_budget_bytes)
        shared = None
        if self.config.cache_dir is not None:
            stamp = run_sync(archive_stamp(self.store.wrapped, self.geometries))
            identity = identity_of(url, self.snapshot_id, self.geometries, chunk_transforms, stamp)
            shared = SharedChunks(self.config.cache_dir, identity, self.config.cache_budget_bytes)
        try:
            self._engine = Engine(
                self.store,
                self.geometries,
                self.pool,
                max_inflight=self.config.max_inflight,
                decode_threads=self.config.decode_threads,
                batches_held=_BATCHES_HELD + self.config.prefetch_depth,
                chunk_transforms=chunk_transforms,
                batch_transforms=batch_transforms,
                on_bad_chunk=on_bad_chunk,
                shared=shared,
            )
        except BaseException:
            if shared is not None:
                shared.close()
            raise
        self._finalizer = weakref.finalize(self, self._engine.close)

    # -- views and epochs --------------------------------------------------------------

    @property
    def train(self) -> SplitView:
        return SplitView(self, "train")

    @property
    def val(self) -> SplitView:
        return SplitView(self, "val")

    @property
    def test(self) -> SplitView:
        return SplitView(self, "test")

    @property
    def all(self) -> SplitView:
        return SplitView(self, "all")

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (reshuffles ``train``) and restart every view at its first batch.

        Refused while a pass is open: close or finish its iterator first.
        """
        epoch = check_int("epoch", epoch, maximum=2**64 - 1)  # the order's counter
        self._refuse_if_open("set_epoch()")
        self._epoch = epoch
        self._positions = dict.fromkeys(VIEWS, 0)

    @property
    def bad_chunks(self) -> list[str]:
        """Store keys of the chunks skipped (``on_bad_chunk="skip"``) or filled with NaN
        (``"nan"``), each once."""
        return list(self._engine.bad_chunks)

    def use_allocator(self, allocate: Allocate, *, extra_batches: int = 0) -> None:
        """Make batch arrays with ``allocate`` (page-locked memory, for
        ``chute.frameworks.to_device``), recycling ``extra_batches`` more of them."""
        held = _BATCHES_HELD + self.config.prefetch_depth + extra_batches
        self._engine._outputs = BatchBuffers(held * len(self.geometries), allocate)

    # -- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where every view stands (batches consumed this epoch) and the configuration
        that fixes the batch order, including the Icechunk snapshot read, and its
        fingerprint; JSON-serialisable."""
        return make_state(
            LAYOUT, self._order_fields(), epoch=self._epoch, positions=dict(self._positions)
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next pass over each view continues after its consumed batches.

        Refuses a state whose batch order would differ, naming each differing field with
        its saved and current value (manifest, seed, batch size, window, shuffle, shard,
        the chute epoch-order revision, or the Icechunk snapshot: a branch that moved on
        since the state was saved would read other data): a
        `chute.errors.StateMismatchError`.
        """
        state = check_state(state, LAYOUT, self._order_fields(), hint=snapshot_hint)
        self._refuse_if_open("load_state_dict()")
        epoch = state["epoch"]
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise ValueError(f"bad epoch {epoch!r} in the state")
        before = self._epoch, self._positions
        self.set_epoch(epoch)
        try:
            for name, pos in dict(state.get("positions", {})).items():
                if (
                    name not in self._positions
                    or isinstance(pos, bool)
                    or not isinstance(pos, int)
                    or not 0 <= pos <= self.pass_plan(name).n_batches
                ):
                    raise ValueError(f"bad position {pos!r} for view {name!r}")
                self._positions[name] = pos
        except BaseException:
            self._epoch, self._positions = before  # a refused state moves nothing
            raise

    def _order_fields(self) -> dict[str, Any]:
        c = self.config
        return order_fields(
            self.manifest.to_dict(),
            seed=c.seed,
            batch_size=c.batch_size,
            block_chunks=c.block_chunks,
            shuffle=c.shuffle,
            shard=c.shard,
            snapshot_id=self.snapshot_id,
            offsets={n: g.offset for n, g in self.geometries.items() if g.offset},
        )

    def _refuse_if_open(self, what: str) -> None:
        if self._open:
            raise RuntimeError(
                f"{what} while a pass over {sorted(self._open)} is open: finish the pass or "
                "close its iterator first"
            )

    # -- planning ----------------------------------------------------------------------

    def pass_plan(self, view: str) -> PassPlan:
        """The current epoch's plan of ``view``'s pass (internal: for the views)."""
        key = (view, self._epoch)
        plan = self._plans.get(key)
        if plan is None:
            c, m = self.config, self.manifest
            lead = math.ceil(c.batch_size / m.sample_chunk_size)
            shuffled = view == "train" and c.shuffle
            spec = OrderSpec(
                shuffled, c.seed, self._epoch, c.block_chunks, c.shard, lead, self._anchors(),
                spread=view != "train",
            )  # fmt: skip
            try:
                order = sample_order(m.chunk_ids(view), m.sample_chunk_size, m.n_samples, spec)
            except ValueError as exc:
                raise ValueError(f"the {view!r} split cannot be sharded: {exc}") from None
            plan = PassPlan(order=order, batch_size=c.batch_size, uses=self._uses(order, 0))
            self._plans = {k: p for k, p in self._plans.items() if k[1] == self._epoch}
            self._plans[key] = plan
        return plan

    def _anchors(self) -> tuple[int, int] | None:
        """The samples a pass may draw when windowed views would read past an edge."""
        offsets = [g.offset for g in self.geometries.values()]
        if not any(offsets):
            return None
        return valid_anchor_range(offsets, self.manifest.n_samples)

    def _uses(self, order: np.ndarray, start: int) -> dict[str, SlabUse]:
        b = self.config.batch_size
        return {
            name: slab_use(
                order + g.offset, b, g.sample_chunk_size, g.n_samples, g.sample_nbytes, start
            )
            for name, g in self.geometries.items()
        }

    def _stored_chunk_nbytes(self) -> int:
        """Decoded bytes of the largest stored object among the variables."""
        return max(
            math.prod(g.stored_chunks) * np.dtype(g.dtype).itemsize
            for g in self.geometries.values()
        )

    def _required_bytes(self, view: str) -> int:
        """Bytes a pass over ``view`` must hold at once, in any epoch.

        A deterministic pass is the same every epoch, so its plan says exactly. A shuffled
        pass holds a window's slabs from its first batch to its last, so for variables
        whose chunks tile the manifest's, at most the windows one batch can touch are
        alive, whatever the permutation. A slab shared by two manifest chunks (chunks that
        do not tile) stays pinned from the first window that reads it to the last, which
        may be the whole pass, so all of that variable's slabs are counted.
        """
        plan = self.pass_plan(view)
        if view != "train" or not self.config.shuffle:
            return working_set(list(plan.uses.values()), plan.n_batches)
        c, m = self.config, self.manifest
        size = m.sample_chunk_size
        short = bool(m.n_samples % size) and m.n_chunks - 1 in m.chunk_ids(view)
        # windows one batch can touch; the one short chunk, if any, shortens one window
        windows = math.ceil(c.batch_size / (c.block_chunks * size)) + 1 + short
        tiled = shared = 0
        for name, g in self.geometries.items():
            if size % g.sample_chunk_size == 0 and g.offset == 0:
                tiled += size // g.sample_chunk_size * g.slab_nbytes
            else:
                shared += int(plan.uses[name].nbytes.sum())
        split_bytes = sum(int(u.nbytes.sum()) for u in plan.uses.values())
        return min(windows * c.block_chunks * tiled + shared, split_bytes)

    def _working_set(self, view: str, *, lookahead: bool) -> int:
        plan = self.pass_plan(view)
        ahead = 0
        if lookahead:
            window = self.config.block_chunks * self.manifest.sample_chunk_size
            ahead = math.ceil(window / self.config.batch_size) + 1
        return working_set(list(plan.uses.values()), plan.n_batches, ahead)

    # -- passes: what the views use (ViewSource) -----------------------------------------

    def position(self, view: str) -> int:
        """Batches of ``view``'s pass done this epoch: handed out, or left out as empty by
        ``on_bad_chunk="skip"`` (internal: for the views)."""
        return self._positions[view]

    def open_pass(self, view: str, prepare: Prepare | None = None) -> PassIterator:
        """A new iterator over ``view``'s pass (internal: ``iter(ds.train)`` calls it)."""
        if self._engine.closed:
            raise RuntimeError("this InSituDataset is closed")
        with self._opening:  # two threads starting the same view: one of them raises
            if view in self._open:
                raise RuntimeError(
                    f"ds.{view} is already being iterated ({self._positions[view]} batches "
                    "handed out): a second iterator would repeat its batches. Finish the first "
                    "pass, or close() its iterator, then iterate again to continue after its "
                    "last batch"
                )
            it = PassIterator(self, view, prepare)
            self._open[view] = it
            return it

    def end_pass(self, view: str, it: PassIterator) -> None:
        """Forget ``it`` as ``view``'s open pass, if it still is (internal: for the views)."""
        if self._open.get(view) is it:
            del self._open[view]

    def run_pass(self, view: str, prepare: Prepare | None = None) -> Generator[Any, None, None]:
        """The batches of ``view``'s pass from its position on (internal: for the views);
        with ``prepare`` (a device stage's pass, ``chute.frameworks.to_device``) every array
        of a batch is put in the ring (page-locked memory for CUDA: nothing is copied from
        pageable memory), then ``prepare`` runs on it, on the gather thread."""
        full = self.pass_plan(view)
        start = self._positions[view]
        if start >= full.n_batches:  # saved after its last batch: the pass is over
            self._positions[view] = 0
            return
        c = self.config
        uses = self._uses(full.order, start) if start else full.uses
        plan = PassPlan(order=full.order, batch_size=c.batch_size, uses=uses, start_batch=start)
        out: queue.Queue[Any] = queue.Queue()
        credits = asyncio.Semaphore(c.prefetch_depth)
        loop = self._engine.loop
        began = time.perf_counter()
        future = self._engine.start_pass(plan, out, credits, prepare)
        try:
            while True:
                waited = time.perf_counter()
                try:
                    item = next_item(out, future)
                    if not isinstance(item, BaseException) and item is not END:
                        loop.call_soon_threadsafe(credits.release)
                except (RuntimeError, CancelledError):
                    if self._engine.closed:  # by close() from another thread
                        raise RuntimeError(CLOSED_DURING_PASS) from None
                    raise
                self._consumer_wait += time.perf_counter() - waited
                if item is END:
                    break
                if isinstance(item, BaseException):
                    raise item
                planned, batch = item
                self._positions[view] = planned + 1  # past any batch a skipped chunk emptied
                yield batch
            self._positions[view] = 0
        finally:
            future.cancel()
            self._consumer_wall += time.perf_counter() - began

    # -- reporting -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters: store reads, pool hits/misses/evictions, resident and peak bytes, slabs
        this process decoded, slabs it mapped from another process's decode and damaged
        or stale slab files of the on-disk pool it removed (to decode again)."""
        pool = asdict(self.pool.stats)
        shared = self._engine.shared
        return {
            **pool,
            "store_reads": sum(self.store.gets.values()),
            "store_bytes": self.store.bytes_read,
            "decodes": self._engine.decodes,
            "shared_hits": self._engine.shared_hits,
            "shared_discarded": 0 if shared is None else shared.discarded,
            "bad_chunks": self.bad_chunks,
        }

    def batch_spec(self) -> dict[str, tuple[tuple[int | None, ...], np.dtype[Any]]]:
        """``{key: (shape, dtype)}`` of the batches, ``None`` for the batch axis.

        Found by running the chunk and batch transforms on empty arrays, so it holds
        for transforms that change a dtype or add a key; a framework needs it up front
        (``tf.data``'s ``output_signature``).
        """
        batch = Batch()
        for name, g in self.geometries.items():
            chunk = np.zeros((0, *g.sample_shape), dtype=g.dtype)
            for t in self._engine.chunk_transforms:
                chunk = run_chunk_transform(t, name, chunk)
            batch[name] = chunk
        batch["sample_indices"] = np.zeros(0, dtype=np.int64)
        for bt in self._engine.batch_transforms:
            batch = run_batch_transform(bt, batch)
        return {k: ((None, *np.shape(v)[1:]), np.asarray(v).dtype) for k, v in batch.items()}

    def print_summary(self) -> None:
        """Print ``describe()`` (what insitubatch's ``print_summary`` shows, as JSON)."""
        print(json.dumps(self.describe(), indent=2, default=str))

    def describe(self) -> dict[str, Any]:
        """The configuration, the memory it holds, and the stage that limits throughput."""
        c = self.config
        batch_bytes = c.batch_size * sum(g.sample_nbytes for g in self.geometries.values())
        stored = self._stored_chunk_nbytes()
        memory = {
            "pool_budget_bytes": c.cache_budget_bytes,
            "working_set_bytes": self._working_set("train", lookahead=False),
            "queue_bytes": (c.prefetch_depth + _BATCHES_HELD) * batch_bytes,
            "decode_scratch_bytes": c.decode_threads * 2 * stored,
        }
        memory["total_bytes"] = sum(memory.values()) - memory["working_set_bytes"]
        stage, why = self._limiting_stage()
        return {
            "variables": {
                name: {
                    "shape": g.shape,
                    "dtype": g.dtype,
                    "stored_chunks": g.stored_chunks,
                    "slab_bytes": g.slab_nbytes,
                    "stored_chunks_per_slab": g.chunks_per_slab,
                }
                for name, g in self.geometries.items()
            },
            "config": asdict(c),
            "snapshot_id": self.snapshot_id,
            "splits": {
                v: {"samples": len(self.pass_plan(v).order), "batches": self.pass_plan(v).n_batches}
                for v in VIEWS
            },
            "memory": memory,
            "stats": self.stats(),
            "limiting_stage": stage,
            "why": why,
        }

    def _limiting_stage(self) -> tuple[str, str]:
        return limiting_stage(
            self._consumer_wait, self._consumer_wall, self._engine.times, self.store.seconds
        )

    def close(self) -> None:
        """Stop the engine and release the pool."""
        self._finalizer()
