"""The resume state of an InSituDataset: its layout, what fixes its batch order, and advice
for a state of another Icechunk snapshot (checked by `chute._util.state.check_state`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chute._util.state import StateLayout, fingerprint

ORDER_REVISION = 3  # of the epoch order: states saved under another one do not resume
SHARDED_ORDER_REVISION = 4  # sharded: evaluation splits spread by sample since 4
LAYOUT = StateLayout(
    "InSituDataset",
    (2,),  # version 1 (before the Feistel order) ordered batches differently: refused
    ("epoch",),
    nested=True,
    note="; states of other versions order batches differently",
)


def order_fields(
    manifest: Mapping[str, Any],
    *,
    seed: int,
    batch_size: int,
    block_chunks: int,
    shuffle: bool,
    shard: tuple[int, int] | None,
    snapshot_id: str | None,
    offsets: Mapping[str, int],
) -> dict[str, Any]:
    """Everything that fixes the batch order of every pass (JSON types only)."""
    return {
        "manifest": fingerprint(manifest),
        "seed": seed,
        "batch_size": batch_size,
        "block_chunks": block_chunks,
        "shuffle": shuffle,
        "shard": None if shard is None else list(shard),
        "order_revision": ORDER_REVISION if shard is None else SHARDED_ORDER_REVISION,
        "snapshot_id": snapshot_id,
        "offsets": dict(sorted(offsets.items())),
    }


def snapshot_hint(field: str, saved: Any, current: Any) -> str:
    """For a state saved on another Icechunk snapshot: how to reopen the data it read."""
    if field != "snapshot_id" or not saved:
        return ""
    return f"to resume on the same data open repo.readonly_session(snapshot_id={saved!r})"
