"""One translation of obstore's failures into chute's errors, for the reader and the writers:
each names the URL, a missing object and a failed condition are their own kinds."""

from __future__ import annotations

from chute.errors import ChuteError, RemoteChangedError, RemoteError, RemoteNotFoundError


class ConditionalWritesUnsupported(RemoteError):
    """The store takes no conditional put (an S3 store with ``conditional_put="disabled"``,
    or a server that rejects ``If-None-Match``): a second writer cannot be refused there."""


def remote_error(url: str, error: BaseException) -> ChuteError:
    """The chute error for an obstore failure on the object at ``url``.

    >>> str(remote_error("s3://b/d/meta.zr", FileNotFoundError("gone")))
    's3://b/d/meta.zr: no such object (gone)'
    """
    from obstore.exceptions import (  # here: chute imports without the 'remote' extra
        AlreadyExistsError,
        NotSupportedError,
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    cause = first_line(error)
    if is_panic(error):
        return RemoteError(
            f"{url}: the store's client failed before its request went out ({cause}); "
            "check the store options (endpoint= ...)"
        )
    if isinstance(error, FileNotFoundError):
        return RemoteNotFoundError(f"{url}: no such object ({cause})")
    if isinstance(error, (AlreadyExistsError, PreconditionError)):
        return RemoteChangedError(
            f"{url} changed since it was opened (its version no longer matches: another "
            f"writer, or an overwrite); reopen it ({cause})"
        )
    if isinstance(error, (NotImplementedError, NotSupportedError)):
        return ConditionalWritesUnsupported(f"{url}: the store takes no conditional put ({cause})")
    if isinstance(error, (PermissionDeniedError, UnauthenticatedError)):
        return RemoteError(f"{url}: access denied: {cause}")
    return RemoteError(f"{url}: the request failed (after its retries): {cause}")


def is_panic(error: BaseException) -> bool:
    """Whether ``error`` is a Rust panic surfacing from obstore (pyo3's ``PanicException``,
    a ``BaseException``): the boundary turns it into a `RemoteError` like any failure.

    >>> is_panic(KeyboardInterrupt()), is_panic(ValueError())
    (False, False)
    """
    kind = type(error)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"


def in_batch(error: RemoteError, doing: str) -> RemoteError:
    """``error`` (its own kind) saying which read of a batch met it: ``doing`` is e.g.
    ``"reading record 7"``.

    >>> str(in_batch(RemoteError("s3://b/d/0.zr: denied"), "reading record 7"))
    's3://b/d/0.zr: denied (reading record 7 and others of the batch)'
    """
    return type(error)(f"{error} ({doing} and others of the batch)")


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (obstore's run to many), or its type's name."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
