"""Worker processes: a loader's batches built in processes of their own (``workers=N``, the
name the writers give their process pools), for per-record Python work that threads cannot
spread over cores.

Each worker is spawned (a fresh interpreter: no lock or thread of the parent inherited) with
the loader's streams and `Recipe` pickled once (a chute dataset pickles as its path or URL).
The parent sends it steps (``step, indices, extra``); it gathers, maps, collates and
transforms exactly as a loader thread does (`Recipe.finish`), then writes every plain-data
numpy array of the batch into a *slot*: an anonymous shared-memory file (``memfd``, so
nothing is left in ``/dev/shm`` by any crash) whose descriptor it passes to the parent once.
The parent hands out arrays over its mapping of the slot, without a copy; the slot goes
back to the worker (with its next step) once every array over it is gone. Other values in the
batch (strings, lists of bytes) travel pickled.

A worker dies with its parent (``PR_SET_PDEATHSIG``, and the end of its pipe); a worker
that dies is a `LoaderWorkerError` naming it, the step and the signal, and is replaced on
the next ``next()``. Stopping waits at most ``grace`` seconds, then kills.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import mmap
import os
import pickle
import signal
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing import connection, get_context, reduction
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.orphans import die_with_parent
from chute.errors import LoaderWorkerError
from chute.loader._recipe import Batch, Recipe
from chute.loader._streams import GathersInto, unfold

_ALIGN = 64
_OPEN: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@dataclass(frozen=True)
class _Ref:
    """Where an array of a batch lies in its slot."""

    offset: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _pack(obj: Any, placed: list[tuple[_Ref, np.ndarray]], at: list[int]) -> Any:
    """``obj`` with each plain-data array replaced by a `_Ref`; each array and where it goes
    in the slot are added to ``placed`` (``at[0]``: the slot's bytes so far)."""
    if type(obj) is np.ndarray and not obj.dtype.hasobject:
        ref = _Ref(at[0], obj.dtype, obj.shape)
        placed.append((ref, obj))
        at[0] += _aligned(obj.nbytes)
        return ref
    if isinstance(obj, dict):
        return {k: _pack(v, placed, at) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_pack(v, placed, at) for v in obj)
    return obj


def _unpack(obj: Any, root: npt.NDArray[np.uint8]) -> Any:
    """The batch of a skeleton, its arrays views of ``root`` (the slot's bytes): numpy keeps
    ``root`` as the base of every view, and of every view of those, so the slot is free once
    ``root`` is collected."""
    if isinstance(obj, _Ref):
        end = obj.offset + math.prod(obj.shape) * obj.dtype.itemsize
        return root[obj.offset : end].view(obj.dtype).reshape(obj.shape)
    if isinstance(obj, dict):
        return {k: _unpack(v, root) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_unpack(v, root) for v in obj)
    return obj


# -- in a worker ----------------------------------------------------------------------------


class _Slots:
    """A worker's slots: id -> (descriptor, mapping, size); those the parent gave back."""

    def __init__(self) -> None:
        self.maps: dict[int, tuple[int, mmap.mmap, int]] = {}
        self.free: list[int] = []
        self.sent: int | None = None  # a descriptor to send after the answer, if any
        self._ids = itertools.count()

    def take(self, need: int) -> tuple[int, bool]:
        """A slot of at least ``need`` bytes, and whether its descriptor is new to the parent."""
        fits = [i for i in self.free if self.maps[i][2] >= need]
        if fits:
            self.free.remove(fits[0])
            return fits[0], False
        slot = self.free.pop() if self.free else next(self._ids)
        if slot in self.maps:  # too small: a new file takes its place
            fd, mapped, _ = self.maps.pop(slot)
            mapped.close()
            os.close(fd)
        size = max(need + need // 4, 1 << 20)
        fd = os.memfd_create("chute-batch", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        self.maps[slot] = (fd, mmap.mmap(fd, size), size)
        return slot, True


def _serve(conn: Any, payload: bytes, parent: int) -> None:
    """A worker's life: build the steps it is sent until told to stop or its parent goes."""
    die_with_parent(parent)
    streams, recipe = pickle.loads(payload)
    slots = _Slots()
    direct = _direct(streams) if recipe.identity else None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        step, indices, extra, freed = message
        slots.free.extend(freed)
        try:
            if direct is not None:  # gathered straight into the slot: no copy
                conn.send(_gathered_into(slots, direct, indices, extra))
                if slots.sent is not None:
                    reduction.send_handle(conn, slots.sent, parent)
                continue
            batch = unfold({name: st.__getitems__(indices) for name, st in streams.items()})
            names = list(batch)
            batch.update(extra)
            batch = recipe.finish(step, batch, names)
            placed: list[tuple[_Ref, np.ndarray]] = []
            at = [0]
            skeleton = _pack(batch, placed, at)
            body = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as error:
            text = traceback.format_exc()
            try:
                sent = pickle.dumps(error)
            except Exception:
                sent = None
            conn.send(("error", sent, text))
            continue
        if not placed:
            conn.send(("ok", -1, 0, 0, body))
            continue
        slot, new = slots.take(at[0])
        fd, mapped, size = slots.maps[slot]
        _copy_in(mapped, placed)
        conn.send(("ok", slot, size if new else 0, at[0], body))
        if new:
            reduction.send_handle(conn, fd, parent)


def _copy_in(mapped: mmap.mmap, placed: list[tuple[_Ref, np.ndarray]]) -> None:
    """Each array of ``placed`` written into the slot's mapping at its place."""
    for ref, array in placed:
        np.frombuffer(mapped, array.dtype, array.size, ref.offset)[...] = array.reshape(-1)


@dataclass(frozen=True)
class _Into:
    """A stream a worker gathers straight into its slot, with what each batch needs of it."""

    stream: GathersInto
    dtype: np.dtype[Any]
    item_shape: tuple[int, ...]
    item_size: int  # elements per record


def _direct(streams: Mapping[str, Any]) -> dict[str, _Into] | None:
    """Every stream as an `_Into` when all can gather into a buffer, else None; decided once
    per worker (a Protocol check and the sizes are not redone per batch)."""
    into = {}
    for name, st in streams.items():
        if not isinstance(st, GathersInto) or st.dtype.hasobject:
            return None
        shape = tuple(st.item_shape)
        into[name] = _Into(st, np.dtype(st.dtype), shape, math.prod(shape))
    return into


def _gathered_into(
    slots: _Slots, streams: Mapping[str, _Into], indices: npt.NDArray[np.uint64], extra: Any
) -> tuple[Any, ...]:
    """The answer for a batch that needs no map or transform: each stream gathered straight
    into a slot (the extra entries, a mask at most, copied after them); sets ``slots.sent``
    to the slot's descriptor when the parent has not seen it yet."""
    n = len(indices)
    layout: dict[str, _Ref] = {}
    at = 0
    for name, into in streams.items():
        layout[name] = _Ref(at, into.dtype, (n, *into.item_shape))
        at += _aligned(n * into.item_size * into.dtype.itemsize)
    placed: list[tuple[_Ref, np.ndarray]] = []
    counter = [at]
    rest = _pack(dict(extra), placed, counter)
    slot, new = slots.take(counter[0])
    fd, mapped, size = slots.maps[slot]
    for name, into in streams.items():
        ref = layout[name]
        count = n * into.item_size
        out = np.frombuffer(mapped, ref.dtype, count, ref.offset).reshape(ref.shape)
        into.stream.gather_into(indices, out)
    _copy_in(mapped, placed)
    slots.sent = fd if new else None
    body = pickle.dumps({**layout, **rest}, protocol=pickle.HIGHEST_PROTOCOL)
    return ("ok", slot, size if new else 0, counter[0], body)


# -- in the parent --------------------------------------------------------------------------


class _Worker:
    """One worker process as the parent sees it."""

    def __init__(self, index: int, payload: bytes) -> None:
        self.index = index
        ours, theirs = get_context("spawn").Pipe(duplex=True)
        self.process = get_context("spawn").Process(
            target=_serve, args=(theirs, payload, os.getpid()), daemon=True,
            name=f"chute-loader-worker-{index}",
        )  # fmt: skip
        self.process.start()
        theirs.close()
        self.conn = ours
        self.waiting: deque[tuple[int, Future[Batch]]] = deque()
        self.slots: dict[int, memoryview] = {}
        self.freed: list[int] = []
        self.lock = threading.Lock()
        self.dead = False

    def give_back(self, slot: int) -> None:
        with self.lock:
            self.freed.append(slot)

    def take_freed(self) -> list[int]:
        with self.lock:
            freed, self.freed = self.freed, []
        return freed


class ProcessPool:
    """``count`` worker processes building batches with ``recipe`` over ``streams``; see the
    module's docstring. `submit` returns a future of the batch."""

    def __init__(
        self, count: int, streams: Mapping[str, Any], recipe: Recipe, grace: float
    ) -> None:
        try:
            self._payload = pickle.dumps((dict(streams), recipe))
        except Exception as error:
            raise TypeError(
                f"workers={count} builds batches in worker processes, so the streams, "
                "map= and transform= must pickle (functions defined at a module's top level, "
                f"not lambdas or closures): {error}"
            ) from error
        self.pid = os.getpid()
        self._grace = grace
        self._workers: list[_Worker | None] = [None] * count
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._stopped = False
        self._wake = os.pipe()  # a new worker, or stop: the collector looks again at once
        self._thread = threading.Thread(target=self._collect, name="chute-loader-collect",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        _OPEN.add(self)

    def submit(
        self, step: int, indices: npt.NDArray[np.uint64], extra: Mapping[str, Any]
    ) -> Future[Batch]:
        """The batch of ``step`` (its ``indices`` and ``extra`` entries), built by a worker."""
        k = next(self._turn) % len(self._workers)
        worker = self._workers[k]
        if worker is None or worker.dead:
            worker = self._workers[k] = _Worker(k, self._payload)
            os.write(self._wake[1], b"w")
        future: Future[Batch] = Future()
        with self._lock:  # _died marks the worker dead, then fails what it had, in this lock
            if worker.dead:
                future.set_exception(LoaderWorkerError(
                    f"loader worker {k} died before the batch of step {step} reached it; a "
                    "new worker takes its place"
                ))  # fmt: skip
                return future
            worker.waiting.append((step, future))
        # a worker that died meanwhile: its sentinel fails this step with the others it had
        with contextlib.suppress(OSError):
            worker.conn.send((step, indices, dict(extra), worker.take_freed()))
        return future

    def kill_busy(self) -> None:
        """Kill the workers still building something (a step past its timeout) and mark them
        dead at once, so the next `submit` replaces them instead of sending a step to a worker
        the collector has not yet seen die."""
        for worker in self._workers:
            if worker is not None and worker.waiting and not worker.dead:
                worker.process.kill()
                self._died(worker)
        with contextlib.suppress(OSError):  # the collector stops watching their pipes
            os.write(self._wake[1], b"k")

    def _collect(self) -> None:
        """Hand each worker's answers to their futures, in the order the steps were sent;
        a worker that died fails the steps it had."""
        while not self._stopped:
            live = [w for w in self._workers if w is not None and not w.dead]
            waits: dict[Any, tuple[_Worker, bool]] = {}
            for w in live:
                waits[w.conn] = (w, False)
                waits[w.process.sentinel] = (w, True)
            for ready in connection.wait([self._wake[0], *waits], timeout=1.0):
                if ready == self._wake[0]:
                    os.read(self._wake[0], 4096)
                    continue
                worker, died = waits[ready]
                if worker.dead:
                    continue
                if died:
                    self._died(worker)
                    continue
                try:
                    self._answer(worker)
                except (EOFError, OSError):
                    self._died(worker)

    def _answer(self, worker: _Worker) -> None:
        message = worker.conn.recv()
        with self._lock:
            step, future = worker.waiting.popleft()
        if message[0] == "error":
            _, sent, text = message
            try:
                error = pickle.loads(sent) if sent is not None else None
            except Exception:
                error = None
            if not isinstance(error, BaseException):
                error = RuntimeError(f"loader worker {worker.index} failed at step {step}")
            error.add_note(f"in loader worker {worker.index}, building step {step}:\n{text}")
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
            return
        _, slot, size, nbytes, body = message
        if size:
            fd = reduction.recv_handle(worker.conn)
            try:
                worker.slots[slot] = memoryview(mmap.mmap(fd, size))
            finally:
                os.close(fd)
        skeleton = pickle.loads(body)
        if slot < 0:
            batch = skeleton
        else:
            root = np.frombuffer(worker.slots[slot], np.uint8, count=nbytes)
            batch = _unpack(skeleton, root)
            weakref.finalize(root, worker.give_back, slot)
            del root
        if future.set_running_or_notify_cancel():
            future.set_result(batch)

    def _died(self, worker: _Worker) -> None:
        worker.dead = True
        worker.process.join(timeout=1.0)
        code = worker.process.exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with status {code}")  # fmt: skip
        with self._lock:
            waiting, worker.waiting = list(worker.waiting), deque()
        for step, future in waiting:
            error = LoaderWorkerError(
                f"loader worker {worker.index} (pid {worker.process.pid}) {how} while building "
                f"the batch of step {step}; a new worker takes its place"
            )
            if future.set_running_or_notify_cancel():
                future.set_exception(error)
        with self._lock, contextlib.suppress(OSError):  # not while `stop` sends on it
            worker.conn.close()

    def stop(self) -> None:
        """Tell every worker to stop; one still busy after ``grace`` seconds is killed."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(OSError):
            os.write(self._wake[1], b"s")
        workers = [w for w in self._workers if w is not None]
        for w in workers:  # a worker found dead has its pipe closed by `_died`, in the lock
            with self._lock, contextlib.suppress(OSError, ValueError):
                if not w.dead:
                    w.conn.send(None)
        for w in workers:
            w.process.join(timeout=self._grace)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=1.0)
            with contextlib.suppress(OSError):
                w.conn.close()
            with self._lock:
                waiting, w.waiting = list(w.waiting), deque()
            for _, future in waiting:
                future.cancel()
        self._workers = [None] * len(self._workers)
        self._thread.join(timeout=2.0)
        for fd in self._wake:
            with contextlib.suppress(OSError):
                os.close(fd)
        _OPEN.discard(self)


@atexit.register
def _stop_all() -> None:
    for pool in list(_OPEN):
        pool.stop()
