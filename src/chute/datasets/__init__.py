"""Sharded datasets: many stores and a manifest (``dataset.json``) read and written as one.

`chute.Dataset` and `chute.RaggedDataset` open a sharded dataset exactly as they open one
store; `chute.write_dataset` and `chute.write_ragged` write one with ``shard_records=``.
"""

from chute.datasets._append import append_dataset, append_ragged
from chute.datasets._manifest import Manifest, is_sharded, read_manifest
from chute.datasets._store import ShardedStore

__all__ = [
    "Manifest",
    "ShardedStore",
    "append_dataset",
    "append_ragged",
    "is_sharded",
    "read_manifest",
]
