"""Setting a dataset up: its manifest, the variables it reads, its shuffle window."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from ._geometry import ArrayGeometry
from ._split import SplitManifest


def check_geometries(
    m: SplitManifest, geometries: dict[str, ArrayGeometry], explicit: bool
) -> dict[str, ArrayGeometry]:
    """The variables to read: every one given must fit the manifest; of those found
    in the group, the ones that do not (coordinates, other lengths) are left out."""
    unfit = {
        n: f"{g.n_samples} samples on axis {g.sample_axis}"
        for n, g in geometries.items()
        if g.n_samples != m.n_samples
    }
    if explicit and unfit:
        raise ValueError(
            f"variables {unfit} do not have the manifest's {m.n_samples} samples on their "
            "sample axis; open their geometries with the right sample_axis= or leave them out"
        )
    chosen = {n: g for n, g in geometries.items() if n not in unfit}
    if not chosen:
        raise ValueError(
            f"no variable has the manifest's {m.n_samples} samples on its sample axis "
            f"(have { ({n: g.n_samples for n, g in geometries.items()}) })"
        )
    return chosen


def default_block_chunks(cores: int, max_inflight: int, batch_size: int, chunk: int) -> int:
    """The shuffle window, in chunks: four per core, so the pool (about two windows) grows
    with the machine that decodes it; at least half the read budget, so the reads of the
    next window keep ``max_inflight`` busy; and at least two batches, so a batch draws from
    a window's worth of chunks. The first batch waits only for its own chunks (see
    ``sample_order``), whatever the window."""
    return max(4 * cores, math.ceil(max_inflight / 2), 2 * math.ceil(batch_size / chunk))


def as_manifest(
    manifest: SplitManifest | Mapping[str, Any] | str | os.PathLike[str],
) -> SplitManifest:
    if isinstance(manifest, SplitManifest):
        return manifest
    if isinstance(manifest, Mapping):
        return SplitManifest.from_dict(dict(manifest))
    return SplitManifest.from_json(manifest)
