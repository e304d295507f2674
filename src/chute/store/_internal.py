"""What the layers above the store (`chute.datasets`, `chute.ray`, `chute.cli`) use of its
internals, published in one place.

Those modules import from here and nowhere else inside `chute.store`, so the store's private
modules (`_format`, `_codec`, `_io` ...) can change without reaching through them:

* `MAX_RECORD`: the format's cap on one record's bytes (1 MiB), logical or stored, and
  `check_record_bytes`, its one check (a ValueError naming the record).
* `IndexLike`, `as_indices`, `check_indices`, `index_bounds`: the one index normaliser
  (a wrong index is a `RecordIndexError` from every entry point).
* `VerifyReport`, `PartReport`: what every record source's ``verify()`` returns.
* `InPlace`: a local store's snapshot as the compiled core reads it (`RecordStore.in_place`),
  for the token reader, which reads records where they lie instead of gathering them, and the
  sharded reader's one call over many shards; `check_in_place`, the after-read checks of many
  of them at once.
* `CODEC_NAMES`, `parse_codec`, `codec_name`: codec names as users and schema.json spell them.
* `SCHEMA_FILE`: the name of the dataset layer's schema.json inside a store directory.
* `sample_rows`: which rows to train a zstd dictionary on.
* `write_file_atomic`: replace a small file so a crash leaves the old or the new, never half.
* `check_out`, `out_stride`: an ``out=`` array checked, the problem named (`OutBufferError`).
* `StoreFiles`: a store's open files (the sharded reader's folder-identity check uses it).
* `META_FILE`, `GEN_FILE`, `SHARDED_MANIFEST`, `MAX_RECORDS`, `is_store_file`: the names of
  a store's files (and the sharded manifest, which a store refuses to open beside), and the
  format's cap on records.
* `bump_generation`: raise a folder's generation, so every open reader of it fails its next
  read instead of reading what is being replaced.
* `RemoteStore`: a store in object storage, opened inside a dataset's `ObjectReader`
  (`RemoteStore.inside`, which reads the dataset's objects ``along`` its own first round
  trip: `Found` is one of them), and `gather_shards`, one batch of several such stores read in one
  round of requests; `generation_of`: the generation gen.chute's bytes hold.
"""

from chute._util.fs import write_file_atomic
from chute.store._codec import sample_rows
from chute.store._files import StoreFiles, generation_of
from chute.store._format import (
    CODEC_NAMES,
    GEN_FILE,
    MAX_RECORD,
    MAX_RECORDS,
    META_FILE,
    SCHEMA_FILE,
    SHARDED_MANIFEST,
    check_record_bytes,
    codec_name,
    is_store_file,
    parse_codec,
)
from chute.store._index import IndexLike, as_indices, check_indices, index_bounds
from chute.store._opening import bump_generation
from chute.store._out import check_out, out_stride
from chute.store._read import InPlace, PartReport, VerifyReport, check_in_place
from chute.store._remote import Found, RemoteStore, gather_shards

__all__ = [
    "CODEC_NAMES",
    "GEN_FILE",
    "MAX_RECORD",
    "MAX_RECORDS",
    "META_FILE",
    "SCHEMA_FILE",
    "SHARDED_MANIFEST",
    "Found",
    "InPlace",
    "IndexLike",
    "PartReport",
    "RemoteStore",
    "StoreFiles",
    "VerifyReport",
    "as_indices",
    "bump_generation",
    "check_in_place",
    "check_indices",
    "check_out",
    "check_record_bytes",
    "codec_name",
    "gather_shards",
    "generation_of",
    "index_bounds",
    "is_store_file",
    "out_stride",
    "parse_codec",
    "sample_rows",
    "write_file_atomic",
]
