"""Range selectors (step, value, position), checked dtype conversion of read values, and
the step arrays of columns read together (equal, or their common steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_FAMILIES = {
    "start": ("step", "lo"),
    "stop": ("step", "hi"),
    "vstart": ("value", "lo"),
    "vstop": ("value", "hi"),
    "istart": ("index", "lo"),
    "istop": ("index", "hi"),
}
_I64 = np.iinfo(np.int64)
_MAX_STEP = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Selection:
    """One range selector family: `step` (inclusive), `value` (inclusive) or `index` (slice)."""

    kind: str | None = None
    lo: Any = None
    hi: Any = None

    @classmethod
    def of(cls, selectors: dict[str, Any]) -> Selection:
        """Parse `start/stop`, `vstart/vstop` or `istart/istop` keywords (one family only)."""
        given = {k: v for k, v in selectors.items() if v is not None}
        unknown = set(selectors) - set(_FAMILIES)
        if unknown:
            raise TypeError(f"unknown selector(s) {sorted(unknown)}; use {sorted(_FAMILIES)}")
        kinds = {_FAMILIES[k][0] for k in given}
        if len(kinds) > 1:
            raise ValueError("use one selector family: start/stop, istart/istop or vstart/vstop")
        if not kinds:
            return cls()
        bounds = {_FAMILIES[k][1]: v for k, v in given.items()}
        kind = kinds.pop()
        for v in bounds.values():
            if kind != "value" and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise TypeError(f"{kind} selectors take integers, got {v!r}")
        return cls(kind, bounds.get("lo"), bounds.get("hi"))

    @classmethod
    def around(cls, steps: np.ndarray[Any, Any]) -> Selection:
        """The steps from the first to the last of sorted `steps` (none if there are none)."""
        if len(steps):
            return cls("step", int(steps[0]), int(steps[-1]))
        return cls("index", 0, 0)

    def bounds(self, steps: np.ndarray[Any, Any]) -> tuple[int, int]:
        """Row range [i0, i1) this selection picks from sorted `steps`."""
        n = len(steps)
        if self.kind == "step":
            i0 = 0
            if self.lo is not None and self.lo > 0:
                i0 = n if self.lo > _MAX_STEP else int(np.searchsorted(steps, _key(steps, self.lo)))
            if self.hi is None or self.hi > _MAX_STEP:
                return i0, n
            if self.hi < 0:
                return i0, i0
            return i0, max(i0, int(np.searchsorted(steps, _key(steps, self.hi), "right")))
        if self.kind == "index":
            return self.positions(n)
        return 0, n

    def positions(self, n: int) -> tuple[int, int]:
        """Row range [i0, i1) an `istart/istop` selection picks from `n` rows."""
        i0, i1, _ = slice(self.lo, self.hi).indices(n)
        return i0, max(i0, i1)


def _key(steps: np.ndarray[Any, Any], bound: int) -> Any:
    """`bound` in the steps' own dtype: a Python int would make NumPy copy them to int64."""
    return steps.dtype.type(bound)


def select(values: np.ndarray[Any, Any], sel: Selection, name: str) -> np.ndarray[Any, Any]:
    """Boolean mask of rows whose value lies in [vstart, vstop]."""
    if values.dtype == object:
        raise ValueError(f"vstart/vstop need a numeric metric; {name!r} holds JSON values")
    mask = np.ones(len(values), dtype=bool)
    if sel.lo is not None:
        mask &= values >= sel.lo
    if sel.hi is not None:
        mask &= values <= sel.hi
    return mask


def cast(values: np.ndarray[Any, Any], code: str, dtype: Any, name: str) -> np.ndarray[Any, Any]:
    """Apply a read's `dtype`: "standard", "storage" or a NumPy dtype (checked for ints)."""
    if isinstance(dtype, str) and dtype == "storage":
        return values
    if isinstance(dtype, str) and dtype == "standard":
        wide = values.dtype.kind == "u" and values.dtype.itemsize == 8 and len(values)
        if wide and int(values.max()) > _I64.max:
            raise OverflowError(
                f"values of {name!r} exceed int64; read with dtype=np.uint64, object or 'storage'"
            )
        if values.dtype.kind in "iu":
            return values.astype(np.int64)
        return values
    target = np.dtype(dtype)
    if target.kind in "iu" and values.dtype != target and len(values):
        _check_int_target(values, target, name)
    if values.dtype.kind == "O" and target.kind != "O":
        return np.asarray(values.tolist(), dtype=target)
    return values.astype(target)


def _check_int_target(values: np.ndarray[Any, Any], target: np.dtype[Any], name: str) -> None:
    info = np.iinfo(target)
    if values.dtype.kind == "f":
        if not np.all(np.isfinite(values)) or not np.all(values == np.trunc(values)):
            raise ValueError(f"values of {name!r} are not all integral; cannot convert to {target}")
        lo, hi = float(values.min()), float(values.max())
    elif values.dtype.kind in "iu":
        lo, hi = int(values.min()), int(values.max())
    else:
        return
    if lo < info.min or hi > info.max:
        raise OverflowError(f"values of {name!r} do not fit {target}")


def same_steps(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Whether two step arrays are equal (views of the same memory are, without a compare)."""
    if a is b:
        return True
    if len(a) != len(b):
        return False
    place = (a.dtype, a.strides, a.__array_interface__["data"][0])
    return place == (b.dtype, b.strides, b.__array_interface__["data"][0]) or bool(
        np.array_equal(a, b)
    )


def common_steps(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Steps in both sorted, duplicate-free step arrays."""
    if not len(a):
        return a
    if not len(b):
        return b
    pos = np.minimum(np.searchsorted(b, a), len(b) - 1)
    out: np.ndarray[Any, Any] = a[b[pos] == a]
    return out


Read = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]


def join(
    read: dict[str, Read], cols: list[str], positions: Selection | None
) -> tuple[np.ndarray[Any, Any], dict[str, tuple[np.ndarray[Any, Any], str]]]:
    """The steps every column of `read` (steps, values, code) holds, and each column's values
    at them; `positions`: an `istart/istop` selection of the joined rows."""
    common = read[cols[0]][0]
    aligned = all(same_steps(common, read[n][0]) for n in cols[1:])  # same cadence: no join
    if not aligned:
        for n in cols[1:]:
            common = common_steps(common, read[n][0])
    if positions is not None:
        common, aligned = common[slice(positions.lo, positions.hi)], False
    out = {}
    for n in cols:
        s, v, code = read[n]
        out[n] = (v if aligned else v[np.searchsorted(s, common)], code)
    return common.astype(np.uint32, copy=False), out
