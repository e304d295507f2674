"""The manifest's `monotonic` flag of a numeric column, kept up to date as rows arrive.

Plättli's reader binary-searches `vstart`/`vstop` in folders whose columns carry the
flag, so the flag must never claim more than the column's values hold: it is
published before the row that changes it lands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

INC, DEC = "inc", "dec"


@dataclass(slots=True)
class Monotonic:
    """Direction of the values so far: `inc` (also flat-only), `dec`, or None (none seen,
    NaN seen, or both directions seen)."""

    seen: bool = False
    last: Any = None
    direction: str | None = None
    broken: bool = False

    def flag(self) -> str | None:
        """The manifest's value for the column (None: no `monotonic` key)."""
        if self.broken or not self.seen:
            return None
        return self.direction or INC

    def changes(self, v: Any) -> bool:
        """Whether adding `v` would change `flag()`."""
        if self.broken:
            return False
        if v != v or not self.seen:
            return True
        if v == self.last:
            return False
        d = INC if v > self.last else DEC
        return d == DEC if self.direction is None else d != self.direction

    def add(self, v: Any) -> None:
        """Account for one more value."""
        if self.broken:
            return
        if v != v:
            self.broken, self.direction = True, None
        elif not self.seen:
            self.seen, self.last = True, v
        elif v != self.last:
            d = INC if v > self.last else DEC
            if self.direction is None:
                self.direction = d
            elif d != self.direction:
                self.broken, self.direction = True, None
            self.last = v

    def add_array(self, values: np.ndarray[Any, Any]) -> None:
        """Account for many values at once (recovery, batches)."""
        if self.broken or not len(values):
            return
        if values.dtype.kind == "f" and bool(np.isnan(values).any()):
            self.broken, self.direction = True, None
            return
        self.add(values[0].item())
        a, b = values[:-1], values[1:]
        up, down = bool((b > a).any()), bool((b < a).any())
        for moved, d in ((up, INC), (down, DEC)):
            if moved and not self.broken:
                if self.direction is None:
                    self.direction = d
                elif self.direction != d:
                    self.broken, self.direction = True, None
        if not self.broken:
            self.last = values[-1].item()


def set_flag(entry: dict[str, Any], flag: str | None) -> bool:
    """Write `flag` into a manifest entry; True when that changed it."""
    if entry.get("monotonic") == flag:
        return False
    if flag is None:
        entry.pop("monotonic", None)
    else:
        entry["monotonic"] = flag
    return True
