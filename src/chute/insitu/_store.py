"""Turn a URL into a read-only zarr store, and count what is read through it."""

from __future__ import annotations

import difflib
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import ObjectStore, WrapperStore

StoreLike = str | os.PathLike[str] | Store | Any
"""A URL or path, a zarr ``Store``, or an Icechunk ``Session`` (its store is read)."""

# what obstore's S3Store takes besides the bucket and prefix (S3Config, as of obstore 0.8);
# each key may also be spelt with an ``aws_`` prefix or in upper case, as obstore allows
_S3_KEYS = frozenset(
    """access_key_id bucket checksum_algorithm conditional_put container_credentials_relative_uri
    container_credentials_full_uri container_authorization_token_file copy_if_not_exists
    default_region disable_tagging disable_bulk_delete endpoint metadata_endpoint region
    request_payer role_arn role_session_name secret_access_key server_side_encryption
    session_token skip_signature sse_bucket_key_enabled sse_kms_key_id sts_endpoint
    unsigned_payload virtual_hosted_style_request web_identity_token_file token
    config client_options retry_config credential_provider""".split()  # noqa: SIM905
)


def store_options_for(url: StoreLike) -> frozenset[str]:
    """The store keyword arguments ``url`` accepts (S3 options for ``s3://``, else none)."""
    if isinstance(url, (str, os.PathLike)) and urlparse(os.fspath(url)).scheme == "s3":
        return _S3_KEYS
    return frozenset()


def is_store_option(url: StoreLike, key: str) -> bool:
    known = store_options_for(url)
    low = key.lower()
    return low in known or (low.startswith("aws_") and low[4:] in known)


def check_store_options(
    url: StoreLike, options: Mapping[str, Any], owner: str, keywords: Sequence[str] = ()
) -> None:
    """A ``TypeError`` for the first of ``options`` that is no store option of ``url``,
    naming the nearest of ``keywords`` and the store options (checked before any I/O)."""
    for key in options:
        if is_store_option(url, key):
            continue
        valid = [*keywords, *sorted(store_options_for(url))]
        near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        where = "" if store_options_for(url) else " (store options apply to s3:// URLs only)"
        raise TypeError(f"{owner} got an unexpected keyword argument {key!r}{hint}{where}")


def session_of(url: StoreLike) -> Any | None:
    """The Icechunk session ``url`` is or reads through, else ``None``."""
    if hasattr(url, "snapshot_id") and hasattr(url, "store"):
        return url
    session = getattr(url, "session", None)
    return session if hasattr(session, "snapshot_id") else None


def store_name(url: StoreLike) -> str:
    """The last part of a URL or path, less ``.zarr`` (the name of an array stored at the root)."""
    if not isinstance(url, (str, os.PathLike)):
        return ""
    tail = os.path.basename(urlparse(os.fspath(url)).path.rstrip("/"))
    return tail.removesuffix(".zarr")


def open_store(url: StoreLike, **store_kwargs: Any) -> Store:
    """A read-only store for ``url``.

    ``s3://bucket/prefix``, ``file:///path`` and plain paths read through obstore (the
    keyword arguments go to its store, e.g. ``endpoint=``, ``region=``,
    ``client_options={"allow_http": True}``). A zarr ``Store`` instance is used as is, so
    any backend zarr supports works through zarr's own store API. An Icechunk session
    (read-only, at a branch, tag or snapshot) is read through its store.
    """
    session = session_of(url)
    if session is not None and not isinstance(url, Store):
        url = session.store
    if isinstance(url, Store):
        if store_kwargs:
            raise TypeError(f"store options {sorted(store_kwargs)} given with a Store instance")
        return url
    if not isinstance(url, (str, os.PathLike)):
        raise TypeError(
            f"expected a URL, a path, a zarr Store or an Icechunk session, got {type(url).__name__}"
        )
    from obstore.store import LocalStore, S3Store

    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"s3 URL without a bucket: {text!r}")
        prefix = parsed.path.strip("/") or None
        return ObjectStore(S3Store(parsed.netloc, prefix=prefix, **store_kwargs), read_only=True)
    if parsed.scheme in ("file", ""):
        path = os.path.abspath(parsed.path if parsed.scheme == "file" else text)
        if store_kwargs:
            raise TypeError(f"store options {sorted(store_kwargs)} only apply to s3:// URLs")
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no Zarr directory at {path!r}")
        return ObjectStore(LocalStore(path), read_only=True)
    raise ValueError(
        f"unsupported URL scheme {parsed.scheme!r} in {text!r}: use s3://, file://, a local "
        "path, or pass a zarr Store instance"
    )


class CountingStore(WrapperStore[Store]):
    """Wraps a store and counts the reads (per key), bytes and seconds spent in ``get``."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._lock = threading.Lock()
        self.gets: Counter[str] = Counter()
        self.bytes_read = 0
        self.seconds = 0.0

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        start = time.perf_counter()
        out = await self._store.get(key, prototype, byte_range)
        self.record(key, 0 if out is None else len(out), time.perf_counter() - start)
        return out

    @property
    def wrapped(self) -> Store:
        return self._store

    def record(self, key: str, nbytes: int, seconds: float) -> None:
        """Count a read of ``key`` made around the store (a direct local read)."""
        with self._lock:
            self.gets[key] += 1
            self.bytes_read += nbytes
            self.seconds += seconds
