"""Hand a batch to torch or JAX without copying, through DLPack.

Install the framework yourself (``pip install chute[torch]`` or ``chute[jax]``); chute's core
never imports one. Every numpy array found in the batch (dict values, tuples such as ragged
``(values, row_splits)``, nested dicts) becomes a framework array over the same memory; other
leaves pass through unchanged. An array DLPack cannot describe (read-only for JAX, byte-swapped,
strided for JAX) is first copied into a native, contiguous one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["to_jax", "to_torch"]


def _native_copy(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)


def _tree_map(tree: Any, leaf: Callable[[npt.NDArray[Any]], Any]) -> Any:
    if isinstance(tree, np.ndarray):
        return leaf(tree)
    if isinstance(tree, Mapping):
        return {key: _tree_map(value, leaf) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_tree_map(value, leaf) for value in tree)
    return tree


def to_torch(batch: Any, device: Any = None) -> Any:
    """The batch with every numpy array as a ``torch.Tensor`` sharing its memory.

    With ``device`` (e.g. ``"cuda"``) the tensors are then moved there (a copy, as any
    host-to-device transfer is).
    """
    from torch.utils.dlpack import from_dlpack

    def convert(array: npt.NDArray[Any]) -> Any:
        try:
            tensor = from_dlpack(array)
        except BufferError:
            tensor = from_dlpack(_native_copy(array))
        return tensor if device is None else tensor.to(device, non_blocking=True)

    return _tree_map(batch, convert)


def to_jax(batch: Any, device: Any = None) -> Any:
    """The batch with every numpy array as a ``jax.Array``, zero-copy where XLA accepts the
    buffer (CPU, aligned, compact), else copied once; ``device`` places it (default: JAX's)."""
    import jax.numpy as jnp

    def convert(array: npt.NDArray[Any]) -> Any:
        try:
            return jnp.from_dlpack(array, device=device)
        except (BufferError, RuntimeError):
            return jnp.from_dlpack(_native_copy(array), device=device)

    return _tree_map(batch, convert)
