"""chute: the disk side of a training run, keyed by the training step.

>>> import tempfile, numpy as np, chute
>>> path = tempfile.mkdtemp() + "/images.zr"
>>> ds = chute.write_dataset(path, np.zeros((10, 3, 8, 8), np.uint8))
>>> ds[[1, 2]].shape
(2, 3, 8, 8)
"""

from chute.datasets import (
    BytesDataset,
    Dataset,
    ImageDataset,
    RaggedDataset,
    TokenDataset,
    append_dataset,
    append_ragged,
    pad,
    write_dataset,
    write_ragged,
    write_tokens,
)
from chute.errors import (
    ChecksumError,
    ChuteError,
    CorruptStoreError,
    IncompleteDatasetError,
    OutBufferError,
    RecordIndexError,
    SchemaMismatchError,
    StoreChangedError,
    StoreClosedError,
    StoreError,
    StoreKindError,
    StoreLockedError,
    StoreNotFoundError,
    UnsafeFileError,
)
from chute.loader import (
    DataLoader,
    EvalPass,
    Mixture,
    PackedTokens,
    Sampler,
    SamplerLike,
    ShardWindowSampler,
    StepSampler,
    TokenWindows,
    WeightedSampler,
    iterate,
    mix,
    split,
    varlen,
)
from chute.store import Codec, RecordStore

__all__ = [
    "BytesDataset",
    "ChecksumError",
    "ChuteError",
    "Codec",
    "CorruptStoreError",
    "DataLoader",
    "Dataset",
    "EvalPass",
    "ImageDataset",
    "IncompleteDatasetError",
    "Mixture",
    "OutBufferError",
    "PackedTokens",
    "RaggedDataset",
    "RecordIndexError",
    "RecordStore",
    "Sampler",
    "SamplerLike",
    "SchemaMismatchError",
    "ShardWindowSampler",
    "StepSampler",
    "StoreChangedError",
    "StoreClosedError",
    "StoreError",
    "StoreKindError",
    "StoreLockedError",
    "StoreNotFoundError",
    "TokenDataset",
    "TokenWindows",
    "UnsafeFileError",
    "WeightedSampler",
    "append_dataset",
    "append_ragged",
    "iterate",
    "mix",
    "pad",
    "split",
    "varlen",
    "write_dataset",
    "write_ragged",
    "write_tokens",
]
