"""Deprecated path: `Dataset` and `write_dataset` live in `chute` (and `chute.datasets`).

Kept for one release so ``from chute.dataset import Dataset`` still runs, with a
DeprecationWarning; import from ``chute`` instead.
"""

import warnings

from chute.datasets import Dataset, write_dataset

__all__ = ["Dataset", "write_dataset"]

warnings.warn(
    "chute.dataset is deprecated; import Dataset and write_dataset from chute",
    DeprecationWarning,
    stacklevel=2,
)
