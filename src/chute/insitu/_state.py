"""The resume state of an InSituDataset: what fixes its batch order, and the check on load."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

STATE_VERSION = 2
ORDER_REVISION = 3  # of the epoch order: states saved under another one do not resume


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
    text = json.dumps(manifest, sort_keys=True)
    return {
        "manifest": hashlib.sha256(text.encode()).hexdigest()[:16],
        "seed": seed,
        "batch_size": batch_size,
        "block_chunks": block_chunks,
        "shuffle": shuffle,
        "shard": None if shard is None else list(shard),
        "order_revision": ORDER_REVISION,
        "snapshot_id": snapshot_id,
        "offsets": dict(sorted(offsets.items())),
    }


def check_state(state: Any, ours: Mapping[str, Any]) -> None:
    """Refuse a state of another version or batch order, naming every differing field
    with its saved and current value (and, for an Icechunk snapshot, how to reopen it)."""
    if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
        version = state.get("version") if isinstance(state, Mapping) else None
        raise ValueError(
            f"not an InSituDataset state of version {STATE_VERSION} (got version "
            f"{version!r}; states of other versions order batches differently)"
        )
    saved = state.get("config")
    saved = saved if isinstance(saved, Mapping) else {}
    clashes = [
        f"{k}: saved {saved.get(k)!r}, current {v!r}" for k, v in ours.items() if saved.get(k) != v
    ]
    if not clashes:
        return
    hint = ""
    if saved.get("snapshot_id") and saved.get("snapshot_id") != ours["snapshot_id"]:
        hint = (
            "; to resume on the same data open "
            f"repo.readonly_session(snapshot_id={saved['snapshot_id']!r})"
        )
    raise ValueError("the state belongs to another batch order (" + "; ".join(clashes) + ")" + hint)
