"""`Closing`: the ``with`` block of everything chute opens that ends with ``close()``.

An internal module shared by the stores, views, loaders, metric writers and readers: each
defines ``close()`` and inherits ``__enter__`` (the object itself) and ``__exit__`` (closes
it, whether or not the block raised; an exception in the block is never swallowed).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing(ABC):
    """A context manager that closes the object on leaving the block.

    >>> class Handle(Closing):
    ...     def close(self) -> None:
    ...         print("closed")
    >>> with Handle() as h:
    ...     print(type(h).__name__)
    Handle
    closed
    """

    __slots__ = ()

    @abstractmethod
    def close(self) -> None:
        """Release what the object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
