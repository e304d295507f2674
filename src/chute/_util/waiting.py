"""Waiting for every piece of work started, then surfacing the first failure.

An internal module shared by the parts that run work side by side (the sharded store's
gathers, the device pipeline's copies). When one piece fails, the others still hold buffers
or threads that the caller is about to reuse or release: raising at once would leave them
running behind its back. So every wait is made, and only then is the first error raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["first_failure", "wait_all"]


def first_failure(waits: Iterable[Callable[[], object]]) -> BaseException | None:
    """Call every wait in turn, whatever the earlier ones raised; the first error, or None.

    >>> first_failure([lambda: None, lambda: 1 / 0, lambda: int("x")])
    ZeroDivisionError('division by zero')
    """
    failure: BaseException | None = None
    for wait in waits:
        try:
            wait()
        except BaseException as error:  # held until every wait has returned
            if failure is None:
                failure = error
    return failure


def wait_all(waits: Iterable[Callable[[], object]]) -> None:
    """Call every wait in turn, then raise the first error any of them raised.

    >>> done = []
    >>> try:
    ...     wait_all([lambda: 1 / 0, lambda: done.append("still waited")])
    ... except ZeroDivisionError:
    ...     print(done)
    ['still waited']
    """
    failure = first_failure(waits)
    if failure is not None:
        raise failure
