"""torch hand-off: numpy batches as tensors over the same memory (DLPack), and the
device stage's copies (page-locked ring, a copy stream, one event per batch)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.buffers import Allocate, plain
from chute._util.tree import leaves, native_copy, tree_map

__all__ = ["TorchMover", "to_torch"]


def to_torch(batch: Any, device: Any = None) -> Any:
    """The batch with every numpy array as a ``torch.Tensor`` sharing its memory.

    An array torch cannot share safely (read-only, byte-swapped, unaligned, negative or
    uneven strides: see `shareable`) is copied once into a native contiguous one; a dtype
    torch has no tensor for (``S<n>``, ``U<n>``, datetime64, structured, object) raises
    ``TypeError`` naming the batch key.

    With ``device`` (e.g. ``"cuda"``) each tensor is then copied there with
    ``tensor.to(device)``. From a loader's ordinary (pageable) memory that copy is
    synchronous and runs at pageable bandwidth (measured end to end on an H200 machine:
    4.65 GB/s), and the loader's threads wait while it runs: for a training
    loop use ``chute.frameworks.to_device``, which gathers into page-locked buffers and
    overlaps the copies with the next gathers.

    >>> import numpy as np
    >>> to_torch({"x": np.arange(3)})["x"]
    tensor([0, 1, 2])
    """
    from torch.utils.dlpack import from_dlpack

    def convert(array: npt.NDArray[Any], key: Any) -> Any:
        _check_dtype(array.dtype, key)
        tensor = from_dlpack(array if shareable(array) else native_copy(array))
        return tensor if device is None else tensor.to(device, non_blocking=True)

    if isinstance(batch, Mapping):
        return {key: tree_map(value, partial(convert, key=key)) for key, value in batch.items()}
    return tree_map(batch, partial(convert, key=None))


# bool, ints, floats, complex (the largest item size torch holds: no long double)
_TENSOR_SIZES = {"b": 1, "i": 8, "u": 8, "f": 8, "c": 16}


def shareable(array: npt.NDArray[Any]) -> bool:
    """Whether torch can take ``array``'s memory as it is: writable (a tensor over read-only
    memory would let a write reach it), native byte order, aligned, every stride
    non-negative and a multiple of the item size (``from_dlpack`` aborts the interpreter on
    a negative stride, e.g. an image flipped with ``[:, ::-1]``)."""
    itemsize = array.dtype.itemsize
    return (
        array.flags.writeable
        and array.flags.aligned
        and array.dtype.isnative
        and all(stride >= 0 and stride % itemsize == 0 for stride in array.strides)
    )


def _check_dtype(dtype: np.dtype[Any], key: Any) -> None:
    """A ``TypeError`` naming ``key`` where torch has no tensor for ``dtype``."""
    if dtype.fields is None and _TENSOR_SIZES.get(dtype.kind, 0) >= dtype.itemsize:
        return
    where = "the batch" if key is None else f"batch key {key!r}"
    if dtype.fields is not None:
        hint = "split its fields into arrays of their own (array['field'])"
    elif dtype.kind == "S":
        hint = (
            "decode it to bytes or str first (array.tolist()) or view it as uint8 "
            f"(array.view(np.uint8).reshape(*array.shape, {dtype.itemsize}))"
        )
    elif dtype.kind == "U":
        hint = "decode it to str first (array.tolist()) or encode it as integers"
    elif dtype.kind in "mM":
        hint = "view it as int64 (array.view(np.int64)) or convert it to numbers"
    else:
        hint = "convert it to a numeric array or keep it out of the batch handed to torch"
    raise TypeError(
        f"{where} holds a numpy array of dtype {dtype}, which torch has no tensor for "
        f"(DLPack describes bool, integer, float and complex arrays): {hint}"
    )


def _pinned(nbytes: int) -> npt.NDArray[np.uint8]:
    """Page-locked host memory from torch's pinned allocator, as a numpy root."""
    import torch

    array: npt.NDArray[np.uint8] = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()
    return array


def _cpu_copy(leaf: Any) -> Any:
    """A copy into fresh host memory; numpy's, since torch's threads contend with the gathers."""
    if isinstance(leaf, np.ndarray):
        return native_copy(leaf)  # made a tensor by to_torch, which names a key it refuses
    return leaf.clone()


class _Done:
    """The ticket of a copy that finished before ``start`` returned (no CUDA)."""

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None


class _CudaTicket:
    """One batch's copies, done when its event is; the event then goes back to ``free`` to
    be recorded for a later batch (once: a completed ticket answers without it)."""

    __slots__ = ("_free", "event")

    def __init__(self, event: Any, free: list[Any]) -> None:
        self.event = event
        self._free: list[Any] | None = free

    def done(self) -> bool:
        if self._free is not None:
            if not self.event.query():
                return False
            self._release()
        return True

    def wait(self) -> None:
        if self._free is not None:
            self.event.synchronize()  # a blocking-sync event: the thread sleeps, not spins
            self._release()

    def _release(self) -> None:
        assert self._free is not None
        self._free.append(self.event)
        self._free = None


class TorchMover:
    """Copies batches to a torch device.

    On CUDA: host leaves (page-locked ring memory) are copied with ``non_blocking`` on a
    stream of its own, then one event is recorded per batch. Events are reused once their
    copies completed, and made with ``blocking=True``, so waiting for one puts the thread
    to sleep instead of spinning a core. A leaf already on a GPU (a transform put it there)
    was made on another stream: the copy stream first waits for the streams it can come
    from (that device's default stream, where chute's worker threads queue work, and the
    consumer thread's current stream), so the batch's event covers it; a leaf already on
    the target device is then handed over as it is (no copy), one on another GPU is copied.
    On any other device (``"cpu"`` included) a plain copy into fresh memory.

    ``cuda`` is the CUDA namespace (``torch.cuda`` for a CUDA device; the tests pass a
    double to run that path on another device).
    """

    def __init__(self, device: Any, cuda: Any = None) -> None:
        import torch

        self.device = torch.device(device)
        self.allocate: Allocate = plain
        if self.device.type == "cuda":
            cuda = torch.cuda  # its stubs leave Stream and Event untyped
            self.allocate = _pinned
            if self.device.index is None:
                self.device = torch.device("cuda", cuda.current_device())
        self._cuda: Any = cuda
        self._stream: Any = None if cuda is None else cuda.Stream(self.device)
        self._free: list[Any] = []  # events whose copies completed, to record again

    def prepare(self, batch: Any) -> Any:
        return batch  # nothing to do ahead: the tensors over the ring are made in start()

    def start(self, batch: Any) -> tuple[Any, Any]:
        import torch

        if self.device.type == "cpu":
            return to_torch(tree_map(batch, _cpu_copy, (np.ndarray, torch.Tensor))), _Done()
        host = to_torch(batch)
        if self._cuda is None:
            return tree_map(host, self._copy, torch.Tensor), _Done()
        cuda, side = self._cuda, self._stream
        devices = {t.device for t in leaves(host, torch.Tensor) if t.device.type != "cpu"}
        producers = [s for d in devices for s in _producers(cuda, d)]  # before stream(side)
        with cuda.stream(side):
            moved = tree_map(host, self._from_host, torch.Tensor)
            if producers:  # after the host copies: only the batch's event waits for them
                for stream in producers:
                    side.wait_stream(stream)
                moved = tree_map(moved, self._copy, torch.Tensor)
            event = self._free.pop() if self._free else cuda.Event(blocking=True)
            event.record(side)
        return moved, _CudaTicket(event, self._free)

    def _from_host(self, tensor: Any) -> Any:
        return self._copy(tensor) if tensor.device.type == "cpu" else tensor

    def _copy(self, tensor: Any) -> Any:
        if tensor.device == self.device:
            return tensor
        return tensor.to(self.device, non_blocking=self._cuda is not None, copy=True)

    def hand_over(self, batch: Any, ticket: Any) -> Any:
        if self._cuda is None:
            return batch
        import torch

        consumer = self._cuda.current_stream(self.device)
        consumer.wait_event(ticket.event)
        for tensor in leaves(batch, torch.Tensor):
            if tensor.is_cuda:  # its memory is not recycled under the consumer's kernels
                tensor.record_stream(consumer)
        return batch


def _producers(cuda: Any, device: Any) -> list[Any]:
    """The streams a leaf on ``device`` may have been made on: the device's default stream
    (where a worker thread queues work) and the calling thread's current stream."""
    default, current = cuda.default_stream(device), cuda.current_stream(device)
    return [default] if current == default else [default, current]
