"""Checking InSituDataset's keyword arguments, and what identifies its decoded data."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ._geometry import ArrayGeometry
from ._store import StoreLike, check_store_options, is_store_option
from ._transforms import ChunkTransform

# insitubatch options chute does not take, and why (an error says so instead of "unknown")
NOT_TAKEN = {
    "persist": "chute's cache_dir pool lives while processes use it and is then removed",
    "readonly_cache": "every process sharing a cache_dir may decode a missing chunk",
    "reset_stale_cache": "a cache_dir pool is cleared when its last process leaves",
}


def check_keywords(
    url: StoreLike, store_kwargs: Mapping[str, Any], keywords: Sequence[str]
) -> None:
    """Every extra keyword must be a store option of ``url``: else a ``TypeError`` naming
    it and the nearest valid keyword, before anything is opened or read."""
    for key in store_kwargs:
        if key in NOT_TAKEN and not is_store_option(url, key):
            raise TypeError(f"InSituDataset does not take insitubatch's {key}=: {NOT_TAKEN[key]}")
    check_store_options(url, store_kwargs, "InSituDataset", keywords)


def identity_of(
    url: StoreLike,
    snapshot: str | None,
    geometries: Mapping[str, ArrayGeometry],
    transforms: Sequence[ChunkTransform],
) -> str:
    """What decides a slab's decoded bytes: processes agreeing on it share the on-disk pool.

    A chunk transform is told apart by its ``repr``, so a dataclass transform (such as
    :class:`StandardScaler`) is shared and a lambda (whose repr holds an address) is not.
    """
    if isinstance(url, (str, os.PathLike)):
        text = os.fspath(url)
        where = (
            text
            if "://" in text and not text.startswith("file://")
            else os.path.abspath(text.removeprefix("file://"))
        )
    elif snapshot is not None:
        where = f"icechunk:{snapshot}"
    else:
        where = str(url)
    return json.dumps(
        {
            "store": where,
            "geometries": {n: asdict(g) for n, g in sorted(geometries.items())},
            "transforms": [repr(t) for t in transforms],
        },
        sort_keys=True,
        default=str,
    )


def check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
