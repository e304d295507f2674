"""The typed record layer: datasets of fixed-shape or variable-length records over the store.

One store (`chute.store.RecordStore`) or a sharded dataset (many stores and a manifest,
``dataset.json``, read and written as one) holds the bytes; `Dataset` and `RaggedDataset`
read either the same way; `write_dataset` / `write_ragged` write one store, or shards with
``shard_records=``; `append_dataset` / `append_ragged` grow a sharded dataset.

Every dataset reads a `RecordSource` (``_source``: one store, or the shards of a sharded
dataset; a remote source next) and knows its records by a `RecordSchema` (``_schema``, the
one reader and writer of schema.json).

Inside, the modules import downwards only: ``_schema`` (schema.json) and ``_source`` (the
record-source protocol); ``_one_store`` (writing one store); ``_sharded_manifest``,
``_sharded_store``, ``_sharded_write``; ``_remote_write`` (a sharded dataset written to
object storage); ``_view`` (what both dataset kinds share);
``_fixed`` and ``_ragged`` (the two views); ``_writers`` (the public writers) on top.

>>> import tempfile, numpy as np
>>> from chute.datasets import Dataset, write_dataset
>>> ds = write_dataset(tempfile.mkdtemp() + "/d", np.arange(10).reshape(5, 2), shard_records=2)
>>> len(ds), len(ds.store.manifest.shards)
(5, 3)
"""

from chute.datasets._bytes import BytesDataset, ImageDataset
from chute.datasets._fixed import Dataset
from chute.datasets._ragged import Packed, RaggedDataset, pad
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import Manifest, is_sharded, read_manifest
from chute.datasets._sharded_store import ShardedStore
from chute.datasets._source import RecordSource
from chute.datasets._tokens import TokenDataset
from chute.datasets._tokens_write import write_tokens
from chute.datasets._writers import append_dataset, append_ragged, write_dataset, write_ragged

__all__ = [
    "BytesDataset",
    "Dataset",
    "ImageDataset",
    "Manifest",
    "Packed",
    "RaggedDataset",
    "RecordSchema",
    "RecordSource",
    "ShardedStore",
    "TokenDataset",
    "append_dataset",
    "append_ragged",
    "is_sharded",
    "pad",
    "read_manifest",
    "write_dataset",
    "write_ragged",
    "write_tokens",
]
