"""JAX hand-off: numpy batches as ``jax.Array`` values, zero-copy where XLA accepts them."""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

from chute.frameworks._tree import native_copy, tree_map

__all__ = ["to_jax"]


def to_jax(batch: Any, device: Any = None) -> Any:
    """The batch with every numpy array as a ``jax.Array``, zero-copy where XLA accepts the
    buffer (CPU, aligned, compact), else copied once; ``device`` places it (default: JAX's)."""
    import jax.numpy as jnp

    def convert(array: npt.NDArray[Any]) -> Any:
        try:
            return jnp.from_dlpack(array, device=device)
        except (BufferError, RuntimeError):
            return jnp.from_dlpack(native_copy(array), device=device)

    return tree_map(batch, convert)
