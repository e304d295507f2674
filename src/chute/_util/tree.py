"""Walking a batch: every numpy array leaf converted, other leaves passed through."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt


def native_copy(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A native-byte-order, C-contiguous copy: what DLPack consumers accept."""
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)


def tree_map(
    tree: Any, leaf: Callable[[Any], Any], kind: type | tuple[type, ...] = np.ndarray
) -> Any:
    """``tree`` with ``leaf`` applied to each ``kind`` (numpy array) in dicts, tuples, lists."""
    if isinstance(tree, kind):
        return leaf(tree)
    if isinstance(tree, Mapping):
        return {key: tree_map(value, leaf, kind) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(tree_map(value, leaf, kind) for value in tree)
    return tree


def leaves(tree: Any, kind: type | tuple[type, ...] = np.ndarray) -> list[Any]:
    """Every ``kind`` in ``tree``, depth first."""
    found: list[Any] = []
    tree_map(tree, found.append, kind)
    return found
