"""Object storage, for the parts of chute that read or write datasets by URL (an internal room).

`_url` turns a URL and its options into an obstore store (one resolver, shared by the
record layer's remote datasets and by `chute.insitu`); `_cache` keeps fetched byte ranges in
a bounded local disk cache of blocks shared by the processes of a host (`BlockCache`). The
room sits above `_util` and `_native` (the CRC-32C of cached blocks) and below `store`, and
it is the only room besides `insitu` that imports obstore.
"""

from chute._objects._cache import BlockCache
from chute._objects._url import (
    SCHEMES,
    Location,
    check_options,
    is_option,
    is_remote_url,
    open_location,
    options_for,
    scheme_of,
)

__all__ = [
    "SCHEMES",
    "BlockCache",
    "Location",
    "check_options",
    "is_option",
    "is_remote_url",
    "open_location",
    "options_for",
    "scheme_of",
]
