"""Object storage, for the parts of chute that read or write datasets by URL (an internal room).

`_url` turns a URL and its options into an obstore store (one resolver, shared by the
record layer's remote datasets and by `chute.insitu`); `_reader` reads objects whole or by
byte ranges, bounded in time and checked against the version first seen (`ObjectReader`).
It sits above `_util` and below `store`, and it is the only room besides `insitu` that
imports obstore.
"""

from chute._objects._reader import (
    Buffer,
    ObjectInfo,
    ObjectReader,
    RangeCache,
    bounded_options,
    open_bounded,
)
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

__all__ = [
    "SCHEMES",
    "Buffer",
    "Location",
    "ObjectInfo",
    "ObjectReader",
    "RangeCache",
    "bounded_options",
    "check_options",
    "is_option",
    "is_remote_url",
    "is_store_instance",
    "local_path",
    "open_bounded",
    "open_location",
    "options_for",
    "reads_remotely",
    "scheme_of",
]
