"""Exceptions raised by chute's record store and datasets."""

from __future__ import annotations

__all__ = [
    "ChecksumError",
    "ChuteError",
    "CorruptStoreError",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
    "StoreNotFoundError",
]


class ChuteError(Exception):
    """Base class of every error chute raises on purpose."""


class StoreError(ChuteError):
    """A store cannot be opened or used as asked."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """The path holds no store (and the mode does not create one)."""


class StoreLockedError(StoreError):
    """Another writer (handle or process) holds the store."""


class StoreClosedError(StoreError, ValueError):
    """The store was closed."""


class CorruptStoreError(StoreError):
    """Bytes on disk contradict the format: a damaged table, chunk, frame or dictionary.

    ``index`` is the record index that exposed the damage, when one did.
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class ChecksumError(CorruptStoreError):
    """A record decoded cleanly but its bytes differ from the CRC-32C written with it."""
