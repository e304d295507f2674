"""Ordered prefetch: batches built ahead on worker threads, handed out in step order.

The endless `DataLoader` and the finite evaluation pass share this engine; each says which
indices a step reads (`_plan`), where the step counter lives, and whether the steps end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import os
import threading
import time
import weakref
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt

from chute._util.buffers import BatchBuffers
from chute._util.checks import check_int
from chute._util.closing import Closing
from chute._util.cores import usable_cores
from chute._util.state import StateLayout, check_state, make_state
from chute.errors import LoaderInUseError, LoaderTimeoutError
from chute.loader._processes import ProcessPool
from chute.loader._recipe import Recipe, Record, wants_rng
from chute.loader._sampler import _check_u64
from chute.loader._streams import Batch, GathersInto, ReadsAhead, Stream, unfold
from chute.loader._workers import CLOSE_WAIT, Workers

#: The most batches a loader builds ahead. A few keep the workers busy; past that, more only
#: hold memory (every batch ahead is a whole batch in RAM) and delay the first one.
MAX_PREFETCH = 256


def check_prefetch(prefetch: object, num_threads: object) -> tuple[int, int]:
    """Validated ``(prefetch, num_threads)``; ``num_threads=None`` is min(prefetch, cores)."""
    ahead = check_int(
        "prefetch", prefetch, minimum=1, maximum=MAX_PREFETCH, unit=" batches",
        why=": every batch ahead is held in memory, and 2-8 are enough to keep the workers busy",
    )  # fmt: skip
    if num_threads is None:
        return ahead, min(ahead, usable_cores())
    return ahead, check_int("num_threads", num_threads, minimum=1, maximum=MAX_PREFETCH)


def check_timeout(timeout: object) -> float | None:
    """Validated ``timeout``: seconds a batch may take, or None to wait for ever."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    seconds = float(timeout)
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(
            f"timeout must be a positive, finite number of seconds (None: wait for ever), "
            f"got {timeout!r}"
        )
    return seconds


#: Which device stage the calling thread acts for (see `Pipeline.fed_by`).
_CALLER = threading.local()

#: A step built in less than this many seconds goes to a worker with its next neighbours
#: (``prefetch // (num_threads + 1)`` steps a task, so every worker and the consumer can each
#: hold one run): waking a worker and handing its result back costs some 15 us here, as much
#: as building a batch of token windows.
CHEAP_STEP = 200e-6


@dataclass(slots=True)
class _Run:
    """Consecutive steps ``first .. first + count - 1`` queued as one task; its outcome
    (the batches built, and the error that stopped it at the step after them) once taken."""

    future: Future[Any]
    first: int
    count: int
    batches: list[Any] | None = None
    error: BaseException | None = None


def _build_run(
    build: Callable[[int], Batch], first: int, count: int
) -> tuple[list[Batch], BaseException | None, float]:
    """Steps ``first ..`` built in order until ``count`` are or one fails; the batches, the
    failure (None) and the seconds each batch took."""
    batches: list[Batch] = []
    error: BaseException | None = None
    start = time.perf_counter()
    for step in range(first, first + count):
        try:
            batches.append(build(step))
        except BaseException as e:  # handed to the consumer when it reaches that step
            error = e
            break
    return batches, error, (time.perf_counter() - start) / max(len(batches), 1)


class Pipeline(Closing):
    """``num_threads`` workers gather and transform up to ``prefetch`` steps ahead; ``next()``
    returns them in step order, so the stream of batches is the same for any threading. An
    error in a gather or the transform is re-raised by ``next()`` with its traceback, and the
    pipeline stays at the failed step; so does a batch not ready within ``timeout`` seconds
    (`LoaderTimeoutError`). The workers are daemon threads: a transform that never returns
    holds up neither `close` nor the interpreter's exit."""

    def __init__(
        self,
        streams: dict[str, Stream],
        num_threads: int | None,
        prefetch: int,
        transform: Callable[..., Batch] | None,
        timeout: float | None = None,
        map: Callable[..., Record] | None = None,
        workers: int = 0,
    ) -> None:
        self.prefetch, self.num_threads = check_prefetch(prefetch, num_threads)
        self.workers = check_int("workers", workers, minimum=0, maximum=256)
        self.timeout = check_timeout(timeout)
        Recipe(map, transform, 0)  # checks both are callables, before any batch
        self.streams = streams
        self.transform = transform
        self.map = map
        self._ahead = [s for s in streams.values() if isinstance(s, ReadsAhead)]
        # which streams can write into a ring buffer, decided once: a Protocol check is slow
        self._into = {
            name: (s, tuple(s.item_shape), np.dtype(s.dtype))
            for name, s in streams.items()
            if isinstance(s, GathersInto) and not s.dtype.hasobject
        }
        self._pending: deque[_Run] = deque()
        self._next_submit = 0
        self._expect: int | None = 0  # the step the queue holds next (None: a new pool)
        self._step_cost = math.inf  # seconds a step took to build, lately (inf: unknown)
        self._pool: Workers | ProcessPool | None = None
        self._closed = False
        self._buffers: BatchBuffers | None = None
        self._prepare: Callable[[Batch], Any] | None = None
        self._owner: weakref.ref[object] | None = None  # the device stage fed, if any
        # one consumer at a time: two threads calling next() each get their own steps
        self._consuming = threading.RLock()
        # this process's part of each global batch (shard=): positions [start, stop)
        self.shard: tuple[int, int] = (0, 1)
        self._slice: tuple[int, int] = (0, 0)

    @property
    @abstractmethod
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns."""

    @abstractmethod
    def _move(self, step: int) -> None:
        """Set the step counter (validated)."""

    @property
    def _end(self) -> int | None:
        """The step at which iteration stops (None: never)."""
        return None

    @abstractmethod
    def _plan(self, step: int) -> tuple[npt.NDArray[np.uint64], Mapping[str, Any]]:
        """The record indices this process reads at ``step``, and entries added to the batch."""

    _STATE: ClassVar[StateLayout]
    """The kind and versions of this pipeline's states (see `chute._util.state`)."""

    _GLOBAL_DRAWS: ClassVar[int]
    """The first state version whose ``map`` draws are keyed by a record's position in the
    global batch (before it: in this host's slice, so other draws on shards past the first)."""

    def _layout(self) -> StateLayout:
        """`_STATE`, without the versions whose sharded ``map`` drew other numbers when this
        pipeline is sharded and its ``map`` draws: such a state is refused, not resumed with
        other augmentations."""
        if self.shard[1] == 1 or not wants_rng(self.map):
            return self._STATE
        versions = tuple(v for v in self._STATE.versions if v >= self._GLOBAL_DRAWS)
        note = (
            f"; a sharded {self._STATE.kind} whose map= takes rng drew other numbers on shards "
            f"past the first before version {self._GLOBAL_DRAWS} (they were keyed by the "
            "position in the host's slice): resuming would change the augmentations, so "
            "seek(step) to resume with today's draws on purpose"
        )
        return dataclasses.replace(self._STATE, versions=versions, note=note)

    @abstractmethod
    def _config(self) -> dict[str, Any]:
        """The JSON-able configuration that decides the stream of batches."""

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able record of where the stream stands (``step``) and what it is
        (the configuration and its fingerprint)."""
        return make_state(self._layout(), self._config(), step=self.step)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the state's step; refuses a state of a different stream of batches
        (`chute.errors.StateMismatchError`, naming the fields that differ)."""
        self._check_caller()
        checked = check_state(state, self._layout(), self._config())
        self.seek(_check_u64("the saved step", checked["step"]))

    @property
    def seed(self) -> int:
        """What the generators of ``map`` and ``transform`` derive from (with the step)."""
        return 0

    @property
    def recipe(self) -> Recipe:
        """What is done with a step's gathered records (see `chute.loader._recipe`)."""
        return Recipe(self.map, self.transform, self.seed, self._slice[0])

    def batch_at(self, step: int) -> Batch:
        """The batch of ``step``, built on the calling thread; does not move the pipeline."""
        return self._build(step, *self._plan(step))

    def _build(self, step: int, indices: npt.NDArray[np.uint64], extra: Mapping[str, Any]) -> Batch:
        batch = unfold({name: self._gather(name, s, indices) for name, s in self.streams.items()})
        names = list(batch)
        batch.update(extra)
        batch = self.recipe.finish(step, batch, names)
        return batch if self._buffers is None else self._for_device(batch)

    def use_buffers(
        self, buffers: BatchBuffers | None, prepare: Callable[[Batch], Any] | None = None
    ) -> None:
        """Gather batches into ``buffers`` (recycled, e.g. page-locked, arrays) instead of
        fresh ones; what the transform returns is copied in too, then ``prepare`` (a device
        stage's host-side work) runs on the batch, on the worker thread. ``None``: fresh
        arrays. ``chute.frameworks.to_device`` sets this; an array stays out of reuse while
        anything references it, so batches already handed out are never overwritten."""
        self._buffers = buffers
        self._prepare = None if buffers is None else prepare

    def _for_device(self, batch: Batch) -> Any:
        """A built batch made ready for the device stage: every array in the ring, prepared."""
        assert self._buffers is not None
        batch = self._buffers.adopt(batch)
        return batch if self._prepare is None else self._prepare(batch)

    def _gather(self, name: str, stream: Stream, indices: npt.NDArray[np.uint64]) -> Any:
        buffers = self._buffers
        into = self._into.get(name)
        if buffers is None or into is None:
            return stream.__getitems__(indices)
        target, item_shape, dtype = into
        return target.gather_into(indices, buffers.empty((len(indices), *item_shape), dtype))

    def attach(self, owner: object) -> None:
        """Hand the stream to ``owner`` (a device stage, `chute.frameworks.to_device`): from
        now on only calls it makes through `fed_by` move it. Another stage, or ``next`` /
        ``seek`` / ``load_state_dict`` called on this loader directly, would split the
        batches between two consumers: `LoaderInUseError`. Held weakly: a stage dropped
        without closing frees the loader too."""
        held = self._holder()
        if held is not None and held is not owner:
            raise LoaderInUseError(
                f"{type(self).__name__} already feeds {held!r}: a second device stage would "
                "split its batches between the two; close that one first, or use it"
            )
        self._owner = weakref.ref(owner)

    def detach(self, owner: object) -> None:
        """Take the stream back from ``owner`` (its stage closed)."""
        if self._holder() is owner:
            self._owner = None

    @contextlib.contextmanager
    def fed_by(self, owner: object) -> Iterator[None]:
        """The block's calls come from ``owner``, the stage this stream is attached to."""
        before = getattr(_CALLER, "owner", None)
        _CALLER.owner = owner
        try:
            yield
        finally:
            _CALLER.owner = before

    def _holder(self) -> object | None:
        return None if self._owner is None else self._owner()

    def _check_caller(self) -> None:
        held = self._holder()
        if held is not None and getattr(_CALLER, "owner", None) is not held:
            raise LoaderInUseError(
                f"{type(self).__name__} feeds {held!r}: take its batches, seek and resume "
                "through that stage (or close it first); moving the loader directly would "
                "split its stream between two consumers"
            )

    def seek(self, step: int) -> None:
        """Make ``step`` the next batch; work queued for other steps is dropped."""
        with self._consuming:
            self._check_caller()
            self._move(step)
            self._drop_pending()
            self._next_submit = self._expect = self.step

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Batch:
        """The next step's batch; threads calling it at once are served one after another,
        each step once."""
        with self._consuming:
            return self._next()

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(f"the {type(self).__name__} is closed")

    def _next(self) -> Batch:
        if self._closed:
            raise self._closed_error()
        self._check_caller()
        end, step = self._end, self.step
        if end is not None and step >= end:
            self._stop_workers()  # a finished pass holds no threads; seek() starts them again
            raise StopIteration
        pool = self._pool
        if pool is None or pool.pid != os.getpid():  # none yet, or a forked copy's
            self._drop_pending()
            grace = CLOSE_WAIT if self.timeout is None else self.timeout
            if self.workers:
                pool = ProcessPool(self.workers, self.streams, self.recipe, grace)
            else:
                pool = Workers(self.num_threads, "chute-loader", grace)
            self._pool = pool
            self._expect = None
        if self._expect != step:  # the step was moved, or the pool is new
            self.seek(step)
        if self._next_submit - step < self.prefetch:
            self._submit(pool, step, end)
        try:
            if self._closed or not self._pending:  # closed by another thread meanwhile
                raise self._closed_error()
            run = self._pending[0]
            if run.batches is None:
                self._take(run, pool)
            if self._closed:
                raise self._closed_error()
            assert run.batches is not None
            at = step - run.first
            if at == len(run.batches):
                assert run.error is not None
                raise run.error
            batch: Batch = run.batches[at]
            run.batches[at] = None  # the caller holds the batch alone (buffers recycle)
        except BaseException:
            self.seek(step)  # stay at the failed step; drop what was queued behind it
            if self._closed:  # its work was cancelled by close()
                raise self._closed_error() from None
            raise
        if at + 1 == run.count and self._pending and self._pending[0] is run:
            self._pending.popleft()
        self._move(step + 1)
        self._expect = step + 1
        return batch

    def _submit(self, pool: Workers | ProcessPool, step: int, end: int | None) -> None:
        """Queue steps up to ``prefetch`` ahead of ``step``: cheap ones in runs (see
        `CHEAP_STEP`), as long as the runs leave the consumer one to take meanwhile."""
        run = 1
        if isinstance(pool, Workers) and self.timeout is None and self._step_cost < CHEAP_STEP:
            run = max(1, self.prefetch // (self.num_threads + 1))
        while True:
            first = self._next_submit
            count = min(run, self.prefetch - (first - step))
            if end is not None:
                count = min(count, end - first)
            if count <= 0 or (count < run and self._pending):
                return
            if isinstance(pool, ProcessPool):  # the workers read: nothing to read ahead here
                future: Future[Any] = pool.submit(first, *self._plan(first))
            else:
                build: Callable[[int], Batch] = self.batch_at
                if self._ahead:  # a queued step's shards in object storage start opening now
                    plans = {s: self._plan(s) for s in range(first, first + count)}
                    for indices, _ in plans.values():
                        self._ahead = [s for s in self._ahead if s.readahead(indices)]
                    build = functools.partial(self._build_planned, plans)
                future = pool.submit(_build_run, build, first, count)
            self._pending.append(_Run(future, first, count))
            self._next_submit += count

    def _build_planned(
        self, plans: Mapping[int, tuple[npt.NDArray[np.uint64], Mapping[str, Any]]], step: int
    ) -> Batch:
        return self._build(step, *plans[step])

    def _take(self, run: _Run, pool: Workers | ProcessPool) -> None:
        """Wait (at most ``timeout``) for the run's outcome and keep it on the run."""
        if self.timeout is not None and not wait([run.future], self.timeout).done:
            left = "its worker thread is left to it"
            if isinstance(pool, ProcessPool):  # a stuck worker is replaced, not waited on
                pool.kill_busy()
                left = "its worker process was killed and a new one takes its place"
            raise LoaderTimeoutError(
                f"the batch of step {self.step} was not ready within timeout="
                f"{self.timeout} s: a gather, the map or the transform has not returned "
                f"({left}); the next next() tries this step again"
            )
        if isinstance(pool, ProcessPool):
            batch = run.future.result()
            run.batches = [batch if self._buffers is None else self._for_device(batch)]
            return
        run.batches, run.error, cost = run.future.result()
        if run.batches:
            self._step_cost = cost

    def _drop_pending(self) -> None:
        for run in self._pending:
            run.future.cancel()
        self._pending.clear()

    def _stop_workers(self) -> None:
        self._drop_pending()
        if self._pool is not None:
            self._pool.stop()
            self._pool = None

    def close(self) -> None:
        """Stop the worker threads. Batches already being built get at most ``timeout``
        seconds (2 s without one) to finish; one still running then (a stuck transform) is
        left to its daemon thread, which keeps neither this call nor the interpreter."""
        self._closed = True
        self._stop_workers()
