"""The typed face of chute's compiled core. Only `chute.store`, the samplers
(`chute.loader._sampler`, `chute.loader._mix`), the token reader and packer
(`chute.datasets._tokens`, `chute.loader._packing`), the in-place loader's slab pool
(`chute.insitu._shared`, for CRC-32C) and the metric curves (`chute.metrics._smooth`)
import it."""

from chute._native import _sampler as sampler_codes  # MODE_* sampler mode codes
from chute._native import _zrecord as codes  # GE_* gather error codes, MAX_RECORD
from chute._native._curves import ema, extremes
from chute._native._sampler import fill, fill_window
from chute._native._zrecord import (
    chunks_from_buffers,
    compress,
    crc32c,
    first_moved,
    gather,
    gather_many,
    load_generation,
    load_state,
    make_cdict,
    make_ddict,
    map_chunks,
    pack_groups,
    put_entry,
    read_packed,
    read_tokens,
    read_windows,
    shard_split,
    store_generation,
    store_state,
    train_dict,
)

__all__ = [
    "chunks_from_buffers",
    "codes",
    "compress",
    "crc32c",
    "ema",
    "extremes",
    "fill",
    "fill_window",
    "first_moved",
    "gather",
    "gather_many",
    "load_generation",
    "load_state",
    "make_cdict",
    "make_ddict",
    "map_chunks",
    "pack_groups",
    "put_entry",
    "read_packed",
    "read_tokens",
    "read_windows",
    "sampler_codes",
    "shard_split",
    "store_generation",
    "store_state",
    "train_dict",
]
