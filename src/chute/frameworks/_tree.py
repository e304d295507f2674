"""Walking a batch: every numpy array leaf converted, other leaves passed through."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt


def native_copy(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A native-byte-order, C-contiguous copy: what DLPack consumers accept."""
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)


def tree_map(tree: Any, leaf: Callable[[npt.NDArray[Any]], Any]) -> Any:
    """``tree`` with ``leaf`` applied to each numpy array in dicts, tuples and lists."""
    if isinstance(tree, np.ndarray):
        return leaf(tree)
    if isinstance(tree, Mapping):
        return {key: tree_map(value, leaf) for key, value in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(tree_map(value, leaf) for value in tree)
    return tree
