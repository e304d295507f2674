"""What the parts above the typed layer (`chute.ray`, `chute.cli`) use of its internals,
published in one place, so the modules behind it can change without reaching through them:

* `RecordSchema`: a dataset's schema.json as a value (``RecordSchema.read(path)``, checked,
  every failure naming the file).
* `open_source`: the `RecordSource` of a store or sharded dataset at a path, read-only.
* `Manifest`, `write_manifest`, `shard_name`, `is_shard_name`, `checksum_of`,
  `MANIFEST_FILE`: a sharded dataset's manifest.
* `writer_lock`, `clear`, `DATASET_LOCK`: the one-writer lock of a dataset folder (and its
  file name), and clearing one under it.
* `check_sharding`: the ``shard_records`` / ``workers`` arguments checked.
* `survey`, `Found`, `check_writable`, `commit_manifest`, `remove_unnamed`,
  `next_shard_number`: writing a sharded dataset to object storage, step by step (for a
  writer, as a Ray conversion, whose shards are uploaded by others).
"""

from chute.datasets._remote_write import (
    Found,
    check_writable,
    commit_manifest,
    remove_unnamed,
    survey,
)
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import (
    LOCK_FILE as DATASET_LOCK,
)
from chute.datasets._sharded_manifest import (
    MANIFEST_FILE,
    Manifest,
    checksum_of,
    is_shard_name,
    next_shard_number,
    shard_name,
    write_manifest,
)
from chute.datasets._sharded_store import open_source
from chute.datasets._sharded_write import check_sharding, clear, writer_lock
from chute.datasets._source import RecordSource

__all__ = [
    "DATASET_LOCK",
    "MANIFEST_FILE",
    "Found",
    "Manifest",
    "RecordSchema",
    "RecordSource",
    "check_sharding",
    "check_writable",
    "checksum_of",
    "clear",
    "commit_manifest",
    "is_shard_name",
    "next_shard_number",
    "open_source",
    "remove_unnamed",
    "shard_name",
    "survey",
    "write_manifest",
    "writer_lock",
]
