"""The typed face of chute's compiled core. Only `chute.store` and `chute.sampler` import it."""

from chute._native._sampler import fill
from chute._native._zrecord import (
    compress,
    crc32c,
    gather,
    make_cdict,
    make_ddict,
    map_chunks,
    train_dict,
)

__all__ = [
    "compress",
    "crc32c",
    "fill",
    "gather",
    "make_cdict",
    "make_ddict",
    "map_chunks",
    "train_dict",
]
