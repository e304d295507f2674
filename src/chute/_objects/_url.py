"""One resolver from a URL (and its options) to an obstore store: used by the record layer's
remote datasets and by `chute.insitu`, so both take the same URLs, options and credentials.

A URL names a *location*: the store of its scheme rooted at the URL's bucket and prefix.
Credentials come as obstore takes them: from the environment (``AWS_*``, ``GOOGLE_*``,
``AZURE_*``), or as keyword options (``region=``, ``endpoint=``, ``access_key_id=`` ...);
``skip_signature=True`` reads a public bucket anonymously. Every option is checked against
the scheme's list before the store is built, so a misspelt one is a ``TypeError`` naming the
nearest valid option, never a request that fails later.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

# Options every scheme's store takes (obstore's ClientConfig, RetryConfig, credentials).
_COMMON = frozenset({"config", "client_options", "retry_config", "credential_provider"})

# What obstore 0.12's stores take as keyword configuration, per scheme. Each key may also be
# spelt with the scheme's prefix (``aws_``, ``google_``, ``azure_``) or in upper case.
_S3 = frozenset(
    """access_key_id bucket checksum_algorithm conditional_put container_authorization_token_file
    container_credentials_full_uri container_credentials_relative_uri copy_if_not_exists
    default_region disable_bulk_delete disable_tagging endpoint endpoint_url_s3 imdsv1_fallback
    metadata_endpoint region request_payer role_arn role_session_name s3_express
    secret_access_key server_side_encryption session_token skip_signature
    sse_bucket_key_enabled sse_customer_key_base64 sse_kms_key_id sts_endpoint token
    unsigned_payload virtual_hosted_style_request web_identity_token_file""".split()  # noqa: SIM905
)
_GCS = frozenset(
    """application_credentials base_url bearer_token bucket service_account
    service_account_key skip_signature token""".split()  # noqa: SIM905
)
_AZURE = frozenset(
    """access_key account_key account_name authority_host client_id client_secret
    container_name credential_type disable_tagging encryption_key endpoint
    federated_token_file msi_endpoint msi_resource_id object_id sas_key sas_token
    skip_signature tenant_id token use_azure_cli use_emulator use_fabric_endpoint""".split()  # noqa: SIM905
)
_PREFIXES = {"s3": "aws_", "gs": "google_", "az": "azure_"}
_OPTIONS: dict[str, frozenset[str]] = {
    "s3": _S3 | _COMMON,
    "gs": _GCS | _COMMON,
    "az": _AZURE | _COMMON,
    "http": frozenset({"client_options", "retry_config"}),
    "https": frozenset({"client_options", "retry_config"}),
    "file": frozenset(),
    "": frozenset(),
}
# Options whose value is a URL the store's client sends requests to: checked as one before
# the store is built (obstore panics on a malformed one at the first request).
_URL_OPTIONS = {
    "s3": frozenset({"endpoint", "metadata_endpoint", "sts_endpoint", "endpoint_url_s3"}),
    "gs": frozenset({"base_url"}),
    "az": frozenset({"endpoint", "authority_host", "msi_endpoint"}),
}
# What RFC 3986 lets a URL hold (percent escapes included); no space, no control character.
_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")
_ALIASES = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "azure": "az"}
SCHEMES = ("s3", "gs", "az", "http", "https", "file")
"""The URL schemes chute reads (``s3a``, ``gcs``, ``abfs(s)``, ``azure`` are read as aliases)."""


@dataclass(frozen=True)
class Location:
    """Where a dataset lives: an obstore ``store`` rooted at the URL's bucket and prefix.

    ``url`` is the URL as given (for messages); ``scheme`` the canonical scheme (``""`` for a
    local path or ``file://``, ``"memory"`` for an obstore store passed in); ``local`` the
    folder a local location names (``None`` for object storage), which chute reads as files,
    with no ``store``; ``writable`` False for http(s).

    >>> loc = open_location("s3://bucket/data/images", region="us-east-1", skip_signature=True)
    >>> loc.scheme, loc.local, loc.writable
    ('s3', None, True)
    """

    url: str
    scheme: str
    store: Any
    local: str | None
    writable: bool

    @property
    def remote(self) -> bool:
        """Whether reads go over the network (not a local folder)."""
        return self.local is None


def scheme_of(url: object) -> str | None:
    """The canonical scheme of ``url`` if it is a URL chute reads through obstore (``s3``,
    ``gs``, ``az``, ``http``, ``https``, ``file``), else ``None`` (a plain path, or not a
    string).

    >>> scheme_of("s3://b/p"), scheme_of("gcs://b"), scheme_of("/data/x"), scheme_of(3)
    ('s3', 'gs', None, None)
    """
    if not isinstance(url, str) or "://" not in url:
        return None
    scheme = url.split("://", 1)[0].lower()
    scheme = _ALIASES.get(scheme, scheme)
    return scheme if scheme in SCHEMES else None


def is_remote_url(url: object) -> bool:
    """Whether ``url`` names object storage or a web server (not ``file://``, not a path).

    >>> is_remote_url("s3://b/p"), is_remote_url("file:///tmp/x"), is_remote_url("/tmp/x")
    (True, False, False)
    """
    scheme = scheme_of(url)
    return scheme is not None and scheme != "file"


def is_store_instance(url: object) -> bool:
    """Whether ``url`` is an obstore store instance (a ``MemoryStore``, an ``S3Store`` ...).

    >>> from obstore.store import MemoryStore
    >>> is_store_instance(MemoryStore()), is_store_instance("s3://b/p")
    (True, False)
    """
    return not isinstance(url, (str, os.PathLike)) and "obstore" in type(url).__module__


def reads_remotely(url: object) -> bool:
    """Whether a dataset at ``url`` is read through obstore: a URL of object storage or a web
    server, or an obstore store instance (not a local path, not ``file://``).

    >>> reads_remotely("gs://b/p"), reads_remotely("file:///tmp/x"), reads_remotely("/tmp")
    (True, False, False)
    """
    return is_remote_url(url) or is_store_instance(url)


def local_path(path: str | os.PathLike[str]) -> str:
    """The local path ``path`` names: a ``file://`` URL's path, any other path as given.

    >>> local_path("file:///tmp/data"), local_path("relative/dir")
    ('/tmp/data', 'relative/dir')
    """
    text = os.fspath(path)
    return urlparse(text).path if scheme_of(text) == "file" else text


def options_for(url: object) -> frozenset[str]:
    """The keyword options the store of ``url`` takes (none for a local path)."""
    return _OPTIONS.get(scheme_of(url) or "", frozenset())


def is_option(url: object, key: str) -> bool:
    """Whether ``key`` is an option of ``url``'s store, in any spelling obstore accepts."""
    scheme = scheme_of(url) or ""
    known = _OPTIONS.get(scheme, frozenset())
    low = key.lower()
    prefix = _PREFIXES.get(scheme)
    return low in known or (
        prefix is not None and low.startswith(prefix) and low[len(prefix) :] in known
    )


def check_options(
    url: object, options: Mapping[str, Any], owner: str, keywords: Sequence[str] = ()
) -> None:
    """A ``TypeError`` for the first of ``options`` that is no option of ``url``'s store,
    naming the nearest of ``keywords`` and the store's options, and a ``ValueError`` for a
    URL-valued one (``endpoint=`` ...) that is no http(s) URL; checked before any request.

    >>> check_options("s3://b/p", {"regoin": "eu-west-1"}, "Dataset")
    Traceback (most recent call last):
    ...
    TypeError: Dataset got an unexpected keyword argument 'regoin'; did you mean 'region'?
    """
    for key, value in options.items():
        if is_option(url, key):
            _check_url_option(url, key, value, owner)
            continue
        valid = [*keywords, *sorted(options_for(url))]
        near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        where = "" if options_for(url) else " (store options apply to object-storage URLs only)"
        raise TypeError(f"{owner} got an unexpected keyword argument {key!r}{hint}{where}")


def _check_url_option(url: object, key: str, value: Any, owner: str) -> None:
    """A ``ValueError`` where ``key`` is a URL-valued option (``endpoint=`` ...) and
    ``value`` is no ``http(s)://host[:port][/path]`` URL.

    >>> _check_url_option("s3://b", "endpoint", "http//127.0.0.1:9000", "Dataset")
    Traceback (most recent call last):
    ...
    ValueError: Dataset: endpoint='http//127.0.0.1:9000' is not a URL (expected http(s)://host[:port][/path])
    """
    scheme = scheme_of(url) or ""
    low, prefix = key.lower(), _PREFIXES.get(scheme, "")
    name = low[len(prefix) :] if prefix and low.startswith(prefix) else low
    if name not in _URL_OPTIONS.get(scheme, ()):
        return
    ok = isinstance(value, str) and _URL_CHARS.fullmatch(value) is not None
    if ok:
        try:
            parsed = urlparse(value)
            ok = parsed.scheme.lower() in ("http", "https") and bool(parsed.hostname)
            _ = parsed.port  # a port out of range, or not a number, raises
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(
            f"{owner}: {key}={value!r} is not a URL (expected http(s)://host[:port][/path])"
        )


def open_location(url: str | os.PathLike[str] | Any, **options: Any) -> Location:
    """The `Location` ``url`` names: ``s3://bucket/prefix``, ``gs://``, ``az://container/``,
    ``http(s)://`` (read-only), ``file:///path`` or a plain path; or an obstore store
    instance (a ``MemoryStore`` in tests), used as is. ``options`` go to the store after
    `check_options`.

    >>> open_location("/tmp/data").local
    '/tmp/data'
    """
    if not isinstance(url, (str, os.PathLike)):
        if options:
            raise TypeError(f"store options {sorted(options)} given with a store instance")
        if not is_store_instance(url):
            raise TypeError(f"expected a URL, a path or an obstore store, got {type(url).__name__}")
        return Location(repr(url), "memory", url, None, True)
    text = os.fspath(url)
    check_options(text, options, "open_location")
    scheme = scheme_of(text)
    if scheme is None or scheme == "file":
        if "://" in text and scheme is None:
            raise ValueError(
                f"unsupported URL scheme in {text!r}: use one of "
                f"{', '.join(s + '://' for s in SCHEMES)} or a local path"
            )
        path = os.path.abspath(urlparse(text).path if scheme == "file" else text)
        return Location(text, "", None, path, True)
    _require_obstore(text)
    parsed = urlparse(text)
    bucket, prefix = parsed.netloc, parsed.path.strip("/") or None
    if scheme in ("http", "https"):
        from obstore.store import HTTPStore

        return Location(text, scheme, HTTPStore.from_url(text.rstrip("/"), **options), None, False)
    if not bucket:
        raise ValueError(f"{text!r} names no bucket (or container)")
    if scheme == "s3":
        from obstore.store import S3Store

        return Location(text, scheme, S3Store(bucket, prefix=prefix, **options), None, True)
    if scheme == "gs":
        from obstore.store import GCSStore

        return Location(text, scheme, GCSStore(bucket, prefix=prefix, **options), None, True)
    from obstore.store import AzureStore

    return Location(text, scheme, AzureStore(bucket, prefix=prefix, **options), None, True)


def _require_obstore(url: str) -> None:
    """An ``ImportError`` saying which extra to install, before the first obstore import."""
    try:
        import obstore  # noqa: F401
    except ImportError:
        raise ImportError(
            f"reading or writing {url} needs obstore: pip install 'chute[remote]'"
        ) from None
