"""The device stage: batches copied to an accelerator while the next ones are gathered.

``to_device(source, device, depth=2)`` wraps a `chute.DataLoader` (endless, seekable) or
an iterable of batches such as a ``chute.insitu`` view. The source then gathers into its
ring of recycled host buffers (page-locked when the target is a CUDA device, allocated by
the framework); this stage starts each batch's copy without waiting (torch: a non-blocking
copy on a stream of its own; JAX: ``jax.device_put``), keeps ``depth`` copies in flight, and
hands the consumer device arrays in source order. A host buffer goes back to the ring only
once its copy has completed (the copy's own event, never a device-wide synchronize).
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload

from chute._util.buffers import Allocate, BatchBuffers
from chute._util.checks import check_int
from chute._util.closing import Closing
from chute._util.renamed import legacy_arguments
from chute._util.waiting import first_failure
from chute.loader._pipeline import MAX_PREFETCH

if TYPE_CHECKING:
    from chute.loader import DataLoader

__all__ = ["DeviceLoader", "DeviceView", "to_device"]


class Ticket(Protocol):
    """One batch's copy in flight."""

    def done(self) -> bool:
        """Whether the copy completed (raises if it failed)."""
        ...

    def wait(self) -> None:
        """Block until this copy (only this one) completed; raises if it failed."""
        ...


class Mover(Protocol):
    """What a framework supplies: host memory for the ring, host-side work on each batch,
    and asynchronous copies."""

    allocate: Allocate

    def prepare(self, batch: Any) -> Any:
        """``batch`` (numpy leaves in the ring) made ready for `start`, with the work that
        need not wait for the consumer (JAX: the 64-bit narrowing, pinned staging). The
        source runs it on its worker thread where it has one (a loader, an insitu view)."""
        ...

    def start(self, batch: Any) -> tuple[Any, Ticket]:
        """Begin copying ``batch`` (numpy leaves) to the device: the device batch and its ticket.

        The device batch is fresh memory; ``batch`` must stay untouched until the ticket is done.
        """
        ...

    def hand_over(self, batch: Any, ticket: Ticket) -> Any:
        """Make ``batch`` safe for the consumer to use (its work queued after the copy)."""
        ...


@dataclass
class _Entry:
    before: int  # the source's step (loader) or position (view) before this batch
    after: int  # ... and once it is delivered
    host: Any = None  # held until the copy completed: the ring reuses nothing referenced
    device: Any = None
    ticket: Ticket | None = None
    error: BaseException | None = None


class _Pipeline:
    """Batches taken from a source with their copies started, delivered in order."""

    def __init__(self, mover: Mover, depth: int) -> None:
        self.mover = mover
        self.depth = depth
        self.ahead: deque[_Entry] = deque()  # copy started, not yet delivered
        self.copying: deque[_Entry] = deque()  # delivered; host held until the copy is done
        self.exhausted = False

    def fill(self, take: Callable[[], Any], key: Callable[[], int]) -> None:
        """Take batches until ``depth`` copies are in flight, the source ends or fails;
        ``key`` is the source's step or position."""
        while len(self.ahead) < self.depth and not self.exhausted:
            if self.ahead and self.ahead[-1].error is not None:
                return  # nothing is taken past a failure
            at = key()
            try:
                host = take()
            except StopIteration:
                self.exhausted = True
                return
            except BaseException as error:
                self.ahead.append(_Entry(at, at, error=error))
                return
            try:
                device, ticket = self.mover.start(host)
            except BaseException as error:  # a failed copy: reported in order, batch released
                self.ahead.append(_Entry(at, at, error=error))
                return
            self.ahead.append(_Entry(at, key(), host, device, ticket))

    def pop(self) -> Any:
        """The next device batch; the source's or the copy's error where it failed."""
        entry = self.ahead.popleft()
        if entry.error is not None:
            error, entry.error = entry.error, None
            raise error
        assert entry.ticket is not None
        self.copying.append(entry)
        try:
            return self.mover.hand_over(entry.device, entry.ticket)
        finally:
            entry.device = None
            self.reap()

    def reap(self) -> None:
        """Release the host buffers of completed copies; wait for the oldest beyond ``depth``.
        A failed copy is dropped, then its error raised."""
        copying = self.copying
        while copying:
            ticket = copying[0].ticket
            assert ticket is not None
            try:
                if len(copying) > self.depth:
                    ticket.wait()
                elif not ticket.done():
                    return
            except BaseException:
                copying.popleft()
                raise
            copying.popleft()

    def drain(self, quiet: bool = False) -> None:
        """Wait for every copy started, then drop all batches (seek, resume, close). The
        first failure of a delivered batch's copy is raised afterwards unless ``quiet``."""
        delivered, ahead = list(self.copying), list(self.ahead)
        self.copying.clear()
        self.ahead.clear()
        self.exhausted = False
        failure = first_failure(e.ticket.wait for e in delivered if e.ticket is not None)
        first_failure(e.ticket.wait for e in ahead if e.ticket is not None)  # dropped unseen
        if failure is not None and not quiet:
            raise failure


def _check_depth(depth: int) -> int:
    """``depth`` as an int in ``[1, MAX_PREFETCH]``: it is bounded as ``prefetch`` is, since
    each copy in flight holds a whole batch of host and device memory."""
    return check_int(
        "depth", depth, minimum=1, maximum=MAX_PREFETCH, unit=" copies",
        why=": each copy in flight holds a batch in host and device memory, and 2-3 are "
        "enough to hide the copies",
    )  # fmt: skip


class DeviceLoader(Closing):
    """A `chute.DataLoader` (or an evaluation pass, ``loader.epoch()``) whose batches arrive
    on a device (see `to_device`).

    Endless (or finite) like what it wraps, with the same batches at the same steps: ``step`` is
    the step of the batch the next ``next()`` returns, and ``state_dict`` /
    ``load_state_dict`` / ``seek`` resume exactly there, whatever is in flight. A gather or
    copy error is raised by the ``next()`` that would have returned that batch; the next
    ``next()`` retries it. Closing it closes the loader.

    >>> import numpy as np, chute
    >>> from chute.frameworks import to_device
    >>> def make():
    ...     return chute.DataLoader({"x": np.arange(10)}, batch_size=2, sampler="sequential")
    >>> with to_device(make(), "cpu") as dev:  # "cuda:0" on a GPU
    ...     print(next(dev)["x"].tolist(), dev.step)
    ...     state = dev.state_dict()  # where the next batch is, not where the copies are
    [0, 1] 1
    >>> with to_device(make(), "cpu") as dev:
    ...     dev.load_state_dict(state)
    ...     print(next(dev)["x"].tolist())
    [2, 3]
    """

    def __init__(self, loader: Any, mover: Mover, depth: int = 2) -> None:
        depth = _check_depth(depth)
        loader.attach(self)  # LoaderInUseError while another stage holds it
        self.loader = loader
        self.mover = mover
        self.depth = depth
        # in flight at once: the loader's prefetch, `depth` copies ahead, `depth` copying
        batches = loader.prefetch + 2 * depth + 2
        ring = BatchBuffers(batches * 2 * len(loader.streams), mover.allocate)
        loader.use_buffers(ring, mover.prepare)
        self._pipe = _Pipeline(mover, self.depth)

    @property
    def step(self) -> int:
        """The step of the batch the next ``next()`` returns."""
        ahead = self._pipe.ahead
        return ahead[0].before if ahead else self._loader_step()

    def _take(self) -> Any:
        with self.loader.fed_by(self):
            return next(self.loader)

    def _loader_step(self) -> int:
        return int(self.loader.step)

    def __iter__(self) -> DeviceLoader:
        return self

    def __next__(self) -> Any:
        pipe = self._pipe
        pipe.fill(self._take, self._loader_step)
        if not pipe.ahead:  # a finished evaluation pass; seek() starts it again
            pipe.exhausted = False
            raise StopIteration
        at = self.step
        try:
            batch = pipe.pop()
        except BaseException:
            pipe.drain(quiet=True)
            with self.loader.fed_by(self):
                self.loader.seek(at)  # stay at the failed step, as the loader itself does
            raise
        pipe.fill(self._take, self._loader_step)  # the next copy starts before we return
        return batch

    def seek(self, step: int) -> None:
        """Make ``step`` the next batch; copies in flight are waited for and dropped (a
        delivered batch's failed copy is raised, after the seek took effect)."""
        try:
            self._pipe.drain()
        finally:
            with self.loader.fed_by(self):
                self.loader.seek(step)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state at the consumer's step (not at the batches in flight)."""
        return {**self.loader.state_dict(), "step": self.step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the state's step: the copies in flight are waited for and dropped,
        then the loader checks the state (`chute.errors.StateMismatchError` for a foreign
        one) and moves there; a refused state leaves it at its step."""
        at = self.step
        try:
            self._pipe.drain()
        finally:
            with self.loader.fed_by(self):
                try:
                    self.loader.load_state_dict(state)
                except BaseException:
                    self.loader.seek(at)  # the loader had run ahead of the consumer
                    raise

    def close(self) -> None:
        """Wait for the copies in flight, then close the loader."""
        try:
            self._pipe.drain()
        finally:
            self.loader.detach(self)
            self.loader.use_buffers(None)
            self.loader.close()

    def __repr__(self) -> str:
        return f"DeviceLoader({self.loader!r}, depth={self.depth})"


class DeviceView:
    """An iterable of batches (a ``chute.insitu`` view) whose batches arrive on a device.

    Each ``iter()`` runs one pass of the source, ``depth`` copies ahead. For an insitu view,
    ``state_dict`` is the dataset's with this view's position at the batches delivered (not
    those in flight), so a resumed pass continues exactly after the last batch you got;
    ``load_state_dict`` ends a pass still running (its copies dropped) and puts the dataset
    there. An error ends the pass, after the batches before it were delivered.

    Any iterable of batches works; an insitu ``ds.train`` view also resumes.

    >>> import numpy as np
    >>> from chute.frameworks import to_device
    >>> batches = [{"x": np.arange(3)}, {"x": np.arange(3, 5)}]
    >>> view = to_device(batches, "cpu")  # a DeviceView: one pass per iter()
    >>> [(b["x"].tolist(), str(b["x"].device)) for b in view]
    [([0, 1, 2], 'cpu'), ([3, 4], 'cpu')]
    """

    def __init__(self, source: Iterable[Any], mover: Mover, depth: int = 2) -> None:
        self.source = source
        self.mover = mover
        self.depth = _check_depth(depth)
        self._delivered: int | None = None  # the view's position while a pass runs
        self._running: weakref.ref[Generator[Any, None, None]] | None = None  # that pass
        dataset: Any = getattr(source, "dataset", None)
        self._insitu = hasattr(dataset, "use_allocator") and hasattr(dataset, "open_pass")
        if self._insitu:
            dataset.use_allocator(mover.allocate, extra_batches=2 * depth + 1)

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        running = self._pass()
        self._running = weakref.ref(running)  # weak: a pass dropped by its consumer ends
        return running

    def _position(self) -> int:
        return int(getattr(self.source, "position", 0))

    def _open(self) -> tuple[Iterator[Any], Callable[[], Any]]:
        """A pass over the source, and how to take its next batch ready for the mover: an
        insitu view puts every array in its ring and prepares the batch on its gather
        thread; any other iterable's batches are prepared here, on the consumer's thread."""
        prepare = self.mover.prepare
        if self._insitu:
            view: Any = self.source
            it: Iterator[Any] = view.dataset.open_pass(view.name, prepare)
            return it, it.__next__
        it = iter(self.source)
        return it, lambda: prepare(next(it))

    def _pass(self) -> Generator[Any, None, None]:
        pipe = _Pipeline(self.mover, self.depth)
        it, take = self._open()
        self._delivered = self._position()
        try:
            while True:
                pipe.fill(take, self._position)
                if not pipe.ahead:
                    return
                after = pipe.ahead[0].after
                batch = pipe.pop()
                self._delivered = after
                pipe.fill(take, self._position)  # the next copy starts first
                yield batch
        finally:
            ended = pipe.exhausted and not pipe.ahead
            delivered, self._delivered = self._delivered, None
            quiet = sys.exc_info()[0] is not None
            close = getattr(it, "close", None)
            if close is not None:
                close()
            if not ended and delivered is not None:
                self._rewind(delivered)
            pipe.drain(quiet=quiet)

    def _rewind(self, position: int) -> None:
        """After a pass cut short (an error, a break), put the view back at the batches
        delivered: the source counted those taken ahead as consumed."""
        dataset = getattr(self.source, "dataset", None)
        name = getattr(self.source, "name", None)
        if dataset is None or name is None:
            return
        state = dataset.state_dict()
        if state["positions"].get(name) != position:
            dataset.load_state_dict({**state, "positions": {**state["positions"], name: position}})

    def _dataset(self) -> tuple[Any, str]:
        """The insitu dataset behind the source (which holds the state) and the view's name."""
        dataset = getattr(self.source, "dataset", None)
        name = getattr(self.source, "name", None)
        if dataset is None or name is None:
            raise TypeError(f"{type(self.source).__name__} has no state to save or load")
        return dataset, name

    def state_dict(self) -> dict[str, Any]:
        """The insitu dataset's state, with this view at the batches delivered so far."""
        dataset, name = self._dataset()
        state: dict[str, Any] = dataset.state_dict()
        if self._delivered is not None:
            state["positions"] = {**state["positions"], name: self._delivered}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the insitu dataset at ``state`` (this view's or the dataset's
        ``state_dict()``; a foreign one is refused by the dataset's check). A pass of this
        view still running is ended first: its copies in flight are waited for and dropped.
        The next ``iter()`` continues at the saved position."""
        dataset, _ = self._dataset()
        running = None if self._running is None else self._running()
        if running is not None:
            running.close()
        dataset.load_state_dict(state)

    def __repr__(self) -> str:
        return f"DeviceView({self.source!r}, depth={self.depth})"


def _framework(device: Any) -> Literal["torch", "jax"]:
    root = type(device).__module__.split(".")[0]
    return "jax" if root in ("jax", "jaxlib") else "torch"


@overload
def to_device(
    source: DataLoader,
    device: Any = None,
    *,
    depth: int = 2,
    framework: Literal["torch", "jax"] | None = None,
) -> DeviceLoader: ...


@overload
def to_device(
    source: Iterable[Any],
    device: Any = None,
    *,
    depth: int = 2,
    framework: Literal["torch", "jax"] | None = None,
) -> DeviceView: ...


@legacy_arguments()
def to_device(
    source: Any,
    device: Any = None,
    *,
    depth: int = 2,
    framework: Literal["torch", "jax"] | None = None,
) -> DeviceLoader | DeviceView:
    """Batches of ``source`` delivered on ``device``, ``depth`` copies ahead of the consumer.

    ``source`` is a `chute.DataLoader` (you get a `DeviceLoader`: endless, seekable,
    resumable) or an iterable of batches such as ``chute.insitu`` ``ds.train`` (a
    `DeviceView`: one pass per ``iter()``). ``device`` is a torch device (``"cuda:0"``,
    ``"cpu"``, a ``torch.device``) or a JAX device or ``Sharding`` (``jax.device_put``
    semantics; ``None`` with ``framework="jax"`` is JAX's default device at this call, the
    batches committed to it; a sharding over several processes takes each process's batch
    as its slice of the global arrays). ``framework`` is inferred from ``device``: a JAX
    object means JAX, anything else torch.

    Every batch you receive is fresh device memory, yours to keep. The host buffers the
    source gathers into are recycled: one is reused only after its copy completed and
    nothing references it. With a CUDA device they are page-locked (``torch.empty(...,
    pin_memory=True)``); a loader or an insitu view copies every numpy leaf into them on its
    own threads, while an arbitrary iterable's leaves are copied from pageable memory. A
    tensor a transform already put on the target device is handed over as it is, once the
    work that made it is done.

    >>> import numpy as np, chute
    >>> from chute.frameworks import to_device
    >>> loader = chute.DataLoader({"x": np.arange(10.0).reshape(5, 2)}, batch_size=2)
    >>> with to_device(loader, "cpu", depth=2) as dev:
    ...     batch = next(dev)
    ...     print(type(batch["x"]).__name__, dev.step)
    Tensor 1
    """
    framework = framework or _framework(device)
    mover: Mover
    if framework == "torch":
        from chute.frameworks._torch import TorchMover

        mover = TorchMover("cpu" if device is None else device)
    elif framework == "jax":
        from chute.frameworks._jax import JaxMover

        mover = JaxMover(device)
    else:
        raise ValueError(f"framework must be 'torch' or 'jax', got {framework!r}")
    if hasattr(source, "use_buffers") and hasattr(source, "seek"):
        return DeviceLoader(source, mover, depth)
    if not isinstance(source, Iterable):
        raise TypeError(
            f"to_device needs a chute.DataLoader or an iterable of batches (an insitu view "
            f"such as ds.train), got {type(source).__name__}"
        )
    return DeviceView(source, mover, depth)
