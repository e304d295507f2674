"""Object storage, for the parts of chute that read or write datasets by URL (an internal room).

`_url` turns a URL and its options into an obstore store (one resolver, shared by the
record layer's remote datasets and by `chute.insitu`); `_reader` reads objects whole or by
byte ranges, bounded in time and checked against the version first seen (`ObjectReader`);
`_cache` keeps fetched byte ranges in a bounded local disk cache of blocks shared by the
processes of a host (`BlockCache`); `_writes` lists, uploads, puts conditionally and
deletes, for the writers of datasets by URL; `_lock` is their one-writer lock object. The
room sits above `_util` and `_native` (the CRC-32C of cached blocks) and below `store`, and
it is the only room besides `insitu` that imports obstore.
"""

from chute._objects._cache import MOST_MAPPED, BlockCache
from chute._objects._errors import ConditionalWritesUnsupported, in_batch, remote_error
from chute._objects._lock import LEASE_S, RemoteLock
from chute._objects._reader import (
    ObjectInfo,
    ObjectReader,
    RangeCache,
    bounded_options,
    open_bounded,
    open_reader,
)
from chute._objects._spans import Buffer, Span, cut
from chute._objects._url import (
    SCHEMES,
    Location,
    check_options,
    is_option,
    is_remote_url,
    is_store_instance,
    local_path,
    open_location,
    options_for,
    reads_remotely,
    scheme_of,
)
from chute._objects._writes import (
    Stored,
    Uploads,
    Version,
    delete_keys,
    keys_in,
    list_dir,
    put_always,
    put_object,
    read_object,
    sub_location,
    upload_folder,
    url_of,
)

__all__ = [
    "LEASE_S",
    "MOST_MAPPED",
    "SCHEMES",
    "BlockCache",
    "Buffer",
    "ConditionalWritesUnsupported",
    "Location",
    "ObjectInfo",
    "ObjectReader",
    "RangeCache",
    "RemoteLock",
    "Span",
    "Stored",
    "Uploads",
    "Version",
    "bounded_options",
    "check_options",
    "cut",
    "delete_keys",
    "in_batch",
    "is_option",
    "is_remote_url",
    "is_store_instance",
    "keys_in",
    "list_dir",
    "local_path",
    "open_bounded",
    "open_location",
    "open_reader",
    "options_for",
    "put_always",
    "put_object",
    "read_object",
    "reads_remotely",
    "remote_error",
    "scheme_of",
    "sub_location",
    "upload_folder",
    "url_of",
]
