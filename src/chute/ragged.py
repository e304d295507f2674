"""Deprecated path: `RaggedDataset`, `write_ragged` and `pad` live in `chute` (and
`chute.datasets`).

Kept for one release so ``from chute.ragged import RaggedDataset`` still runs, with a
DeprecationWarning; import from ``chute`` instead.
"""

import warnings

from chute.datasets import RaggedDataset, pad, write_ragged

__all__ = ["RaggedDataset", "pad", "write_ragged"]

warnings.warn(
    "chute.ragged is deprecated; import RaggedDataset, write_ragged and pad from chute",
    DeprecationWarning,
    stacklevel=2,
)
