"""Integer options checked one way everywhere: an int (a numpy integer too, never a bool) in
a range, else a ``TypeError`` / ``ValueError`` naming the option and its range.

>>> import numpy as np
>>> check_int("batch_size", np.int64(8), minimum=1)
8
>>> check_int("prefetch", True, minimum=1)
Traceback (most recent call last):
TypeError: prefetch must be an int, got True
>>> check_int("prefetch", 0, minimum=1, maximum=256, unit=" batches")
Traceback (most recent call last):
ValueError: prefetch must be in [1, 256] batches, got 0
"""

from __future__ import annotations

import numbers

#: Bounds at or past this are written relative to 2**64 ("2**64 - 1)").
_U64 = 1 << 64


def _range_text(minimum: int, maximum: int | None) -> str:
    if maximum is None:
        named = {0: "a non-negative int", 1: "a positive int"}
        return named.get(minimum, f"at least {minimum}")
    if maximum >= _U64 >> 1:  # a u64 bound reads better as 2**64 minus a little, half open
        gap = _U64 - (maximum + 1)
        return f"in [{minimum}, 2**64{f' - {gap}' if gap else ''})"
    return f"in [{minimum}, {maximum}]"


def check_int(
    name: str,
    value: object,
    *,
    minimum: int = 0,
    maximum: int | None = None,
    unit: str = "",
    why: str = "",
) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (no upper bound when ``maximum`` is
    None). A bool is refused (``True`` is not a count), numpy integers are taken. ``unit``
    follows the range in the message (" batches"), ``why`` follows the value (": ...").

    >>> check_int("seed", -1)
    Traceback (most recent call last):
    ValueError: seed must be a non-negative int, got -1
    """
    if type(value) is int and minimum <= value and (maximum is None or value <= maximum):
        return value  # the common case, without the slower ABC check (a per-batch cost)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        shown = repr(value) if isinstance(value, (bool, float, str)) else type(value).__name__
        raise TypeError(f"{name} must be an int, got {shown}")
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        raise ValueError(f"{name} must be {_range_text(minimum, maximum)}{unit}, got {number}{why}")
    return number


def check_optional_int(
    name: str,
    value: object,
    *,
    minimum: int = 0,
    maximum: int | None = None,
    unit: str = "",
    why: str = "",
) -> int | None:
    """`check_int`, with ``None`` (the option left to its default) passed through.

    >>> check_optional_int("num_threads", None, minimum=1) is None
    True
    """
    if value is None:
        return None
    return check_int(name, value, minimum=minimum, maximum=maximum, unit=unit, why=why)
