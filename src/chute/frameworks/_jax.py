"""JAX hand-off: numpy batches as ``jax.Array`` values, zero-copy where XLA accepts them,
and the device stage's copies (``jax.device_put`` into a device or sharding).

With 64-bit types off (JAX's default, ``jax_enable_x64`` false) JAX turns int64, uint64,
float64 and complex128 arrays into their 32-bit kinds, and integers that do not fit wrap
around without a word. chute does that narrowing itself, visibly: a warning the first time
each dtype is narrowed, and `chute.errors.NarrowingError` when an integer does not fit.
Enable x64 (``jax.config.update("jax_enable_x64", True)``) to keep 64-bit values.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.buffers import Allocate, plain
from chute._util.tree import leaves, native_copy, tree_map
from chute.errors import NarrowingError

__all__ = ["JaxMover", "to_jax"]

_NARROW = {
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}
_warned: set[np.dtype[Any]] = set()


def fit_x64(array: npt.NDArray[Any], narrowed: set[np.dtype[Any]]) -> npt.NDArray[Any]:
    """``array`` as JAX will hold it: narrowed to 32 bits (integers checked to fit) when
    x64 is off, its dtype added to ``narrowed``; unchanged otherwise."""
    import jax

    native = array.dtype.newbyteorder("=")
    narrow = _NARROW.get(native)
    config: Any = jax.config
    if narrow is None or config.read("jax_enable_x64"):
        return array
    if narrow.kind in "iu" and array.size:
        info = np.iinfo(narrow.type)  # type: ignore[type-var]
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise NarrowingError(
                f"{array.dtype} values in [{low}, {high}] do not fit {narrow}, which JAX "
                "uses with 64-bit types off: enable them with "
                "jax.config.update('jax_enable_x64', True)"
            )
    narrowed.add(native)
    return array.astype(narrow)


def warn_narrowed(narrowed: set[np.dtype[Any]], stacklevel: int) -> None:
    """The warning, once per dtype and process, that JAX's 32-bit mode narrowed arrays."""
    for dtype in sorted(narrowed - _warned, key=str):
        _warned.add(dtype)
        narrow = _NARROW[dtype]
        how = "values checked to fit" if narrow.kind in "iu" else "precision is lost"
        warnings.warn(
            f"JAX has 64-bit types off (jax_enable_x64): {dtype} arrays become {narrow} "
            f"({how}); jax.config.update('jax_enable_x64', True) keeps them",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def to_jax(batch: Any, device: Any = None) -> Any:
    """The batch with every numpy array as a ``jax.Array``, zero-copy where XLA accepts the
    buffer (CPU, aligned, compact), else copied once; ``device`` places it (default: JAX's).

    With 64-bit types off (JAX's default) JAX holds int64/uint64/float64/complex128 as their
    32-bit kinds and would silently wrap integers that do not fit; here they are narrowed
    (a copy) with a warning the first time per dtype, and an integer that does not fit
    raises `chute.errors.NarrowingError`. With ``jax_enable_x64`` on they are kept.

    >>> import numpy as np
    >>> to_jax({"x": np.arange(3, dtype=np.int32)})["x"].dtype
    dtype('int32')
    """
    import jax.numpy as jnp

    narrowed: set[np.dtype[Any]] = set()

    def convert(array: npt.NDArray[Any]) -> Any:
        array = fit_x64(array, narrowed)
        try:
            return jnp.from_dlpack(array, device=device)
        except (BufferError, RuntimeError):
            return jnp.from_dlpack(native_copy(array), device=device)

    out = tree_map(batch, convert)
    warn_narrowed(narrowed, stacklevel=2)
    return out


class _ArraysReady:
    """The ticket of one batch's transfer: ready when each of its arrays is."""

    def __init__(self, arrays: list[Any]) -> None:
        self.arrays = arrays

    def done(self) -> bool:
        return all(a.is_ready() for a in self.arrays)

    def wait(self) -> None:
        import jax

        ready: Any = jax.block_until_ready
        ready(self.arrays)


class JaxMover:
    """Puts batches into ``target`` (a device, a ``Sharding``, or None: JAX's default device
    when the mover is made), never aliasing the host buffer.

    On the source's worker threads (`prepare`) each numpy leaf is narrowed to JAX's 32-bit
    kinds where x64 is off, and, where the target's devices are accelerators that offer
    page-locked host memory (``memory_kind="pinned_host"``), staged there with one transfer
    for the whole batch (``stage=None`` decides so; True or False forces it). `start` then
    makes one transfer of the whole batch to the target (pinned memory to device, a DMA
    copy), JAX arrays already there passed as they are. A sharding over several processes
    (not fully addressable: multi-host training, each process loading its own ``shard=``)
    takes each leaf as this process's slice of the global array
    (``jax.make_array_from_process_local_data``)."""

    def __init__(self, target: Any, stage: bool | None = None) -> None:
        import jax
        from jax.sharding import Sharding, SingleDeviceSharding

        if target is None:  # the default device as device_put places there, committed
            target = jax.device_put(np.zeros((), np.uint8)).sharding
        elif isinstance(target, jax.Device):
            target = SingleDeviceSharding(target)
        self.target = target
        self.allocate: Allocate = plain
        sharded = isinstance(target, Sharding)
        self._local = sharded and not target.is_fully_addressable
        if stage is None:
            stage = sharded and _offers_pinned_host(target)
        self._staging = target.with_memory_kind("pinned_host") if stage and sharded else None
        self._narrowed: set[np.dtype[Any]] = set()  # added to by the workers, warned by start

    def prepare(self, batch: Any) -> Any:
        def fit(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
            array = fit_x64(array, self._narrowed)
            return array if array.dtype.isnative else native_copy(array)

        batch = tree_map(batch, fit)
        if self._staging is None:
            return batch
        staged = iter(_transfer(leaves(batch), self._staging, self._local))
        return tree_map(batch, lambda _: next(staged))

    def start(self, batch: Any) -> tuple[Any, _ArraysReady]:
        import jax

        warn_narrowed(self._narrowed, stacklevel=4)  # the caller of next() on the device loader
        kinds = (np.ndarray, jax.Array)
        moved = iter(_transfer(leaves(batch, kinds), self.target, self._local))
        out = tree_map(batch, lambda _: next(moved), kinds)
        return out, _ArraysReady(leaves(out, jax.Array))

    def hand_over(self, batch: Any, ticket: Any) -> Any:
        return batch  # JAX orders work on an array after the transfer that makes it


def _transfer(arrays: list[Any], sharding: Any, local: bool) -> list[Any]:
    """``arrays`` (numpy or JAX) put into ``sharding``, in one ``device_put`` where it can:
    numpy arrays copied (their memory is recycled), JAX arrays moved only if elsewhere.
    With ``local`` (a sharding over several processes) a numpy array is this process's
    slice of the global array."""
    import jax

    if not arrays:
        return []
    if not local:
        alias = [not isinstance(a, np.ndarray) for a in arrays]
        return list(jax.device_put(arrays, sharding, may_alias=alias))
    host = [a for a in arrays if isinstance(a, np.ndarray)]
    held = [a for a in arrays if not isinstance(a, np.ndarray)]  # global arrays already
    make: Any = jax.make_array_from_process_local_data
    made = iter(make(sharding, host) if host else ())
    moved = iter(jax.device_put(held, sharding) if held else ())
    return [next(made) if isinstance(a, np.ndarray) else next(moved) for a in arrays]


def _offers_pinned_host(sharding: Any) -> bool:
    """Whether staging a batch in page-locked host memory helps a transfer into
    ``sharding``: its devices are accelerators (not CPUs) with a ``pinned_host`` memory, and
    it targets device memory. Any question the backend cannot answer means no."""
    try:
        if sharding.memory_kind not in (None, "device"):
            return False
        return all(
            d.platform != "cpu" and any(m.kind == "pinned_host" for m in d.addressable_memories())
            for d in sharding.addressable_devices
        )
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        return False
