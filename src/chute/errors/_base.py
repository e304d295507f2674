"""The base of the family."""

from __future__ import annotations


class ChuteError(Exception):
    """Base class of every error chute raises on purpose.

    >>> import chute
    >>> try:
    ...     chute.Dataset("/no/such/store.zr")
    ... except chute.ChuteError as e:
    ...     print(type(e).__name__, isinstance(e, FileNotFoundError))
    StoreNotFoundError True
    """
