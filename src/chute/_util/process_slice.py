"""Which share of the data this process reads in a multi-host run.

One resolver for every loader: the step loader takes slice ``index`` of ``count`` of each
global batch, the in-place Zarr loader every ``count``-th chunk of each epoch.
"""

from __future__ import annotations

import sys
from typing import Literal

SliceSpec = tuple[int, int] | Literal["auto"] | None
"""``(index, count)``, ``"auto"`` to ask the framework, or None for a single process."""


def _framework_slice() -> tuple[int, int]:
    """This process's (rank, world size) from JAX or torch.distributed, if either is in use.

    Only frameworks the program has already imported are asked: chute never imports one.
    """
    jax = sys.modules.get("jax")
    if jax is not None:
        return int(jax.process_index()), int(jax.process_count())
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def resolve_slice(shard: SliceSpec, batch_size: int | None = None) -> tuple[int, int]:
    """Validate ``shard`` and return ``(index, count)``; ``"auto"`` asks the framework.

    With ``batch_size`` (the step loader's global batch) it must split evenly over the
    shards; without it (the in-place loader, which shards by chunk) any count is taken.
    """
    if shard is None:
        index, count = 0, 1
    elif shard == "auto":
        index, count = _framework_slice()
    elif (
        isinstance(shard, (tuple, list))
        and len(shard) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in shard)
    ):
        index, count = shard
    else:
        raise TypeError(f"shard must be (index, count), 'auto' or None, got {shard!r}")
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index must be in [0, count) with count >= 1, got {shard!r}")
    if batch_size is not None and batch_size % count:
        raise ValueError(
            f"the global batch_size {batch_size} does not split evenly over {count} shards"
        )
    return index, count
