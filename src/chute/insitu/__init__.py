"""In-place Zarr and Icechunk loader: shuffled, split-aware numpy batches, data unconverted.

Read each stored chunk once, shuffle within a window of chunks, feed batches from one
event loop under one read budget, and share one decoded-chunk pool between splits.
"""

from chute.errors import BadChunkError

from ._dataset import InSituDataset
from ._geometry import ArrayGeometry, open_geometries, valid_anchor_range
from ._options import InSituOptions
from ._pool import ChunkPool, PoolStats
from ._split import SplitManifest, split_by_chunk
from ._transforms import Batch, BatchTransform, ChunkTransform, StandardScaler
from ._view import InSituConfig, SplitView

__all__ = [
    "ArrayGeometry",
    "BadChunkError",
    "Batch",
    "BatchTransform",
    "ChunkPool",
    "ChunkTransform",
    "InSituConfig",
    "InSituDataset",
    "InSituOptions",
    "PoolStats",
    "SplitManifest",
    "SplitView",
    "StandardScaler",
    "open_geometries",
    "split_by_chunk",
    "valid_anchor_range",
]
