"""Object storage, for the parts of chute that read or write datasets by URL (an internal room).

`_url` turns a URL and its options into an obstore store (one resolver, shared by the
record layer's remote datasets and by `chute.insitu`). It sits above `_util` and below
`store`, and it is the only room besides `insitu` that imports obstore.
"""

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
    "Location",
    "check_options",
    "is_option",
    "is_remote_url",
    "open_location",
    "options_for",
    "scheme_of",
]
