"""What the parts above the typed layer (`chute.ray`, `chute.cli`) use of its internals,
published in one place, so the modules behind it can change without reaching through them:

* `read_schema`: a dataset's schema.json, checked, every failure naming the file.
* `Manifest`, `write_manifest`, `shard_name`, `checksum_of`: a sharded dataset's manifest.
* `writer_lock`, `clear`: the one-writer lock of a dataset folder, and clearing one under it.
* `check_sharding`: the ``shard_records`` / ``workers`` arguments checked.
"""

from chute.datasets._schema import read_schema
from chute.datasets._sharded_manifest import Manifest, checksum_of, shard_name, write_manifest
from chute.datasets._sharded_write import check_sharding, clear, writer_lock

__all__ = [
    "Manifest",
    "check_sharding",
    "checksum_of",
    "clear",
    "read_schema",
    "shard_name",
    "write_manifest",
    "writer_lock",
]
