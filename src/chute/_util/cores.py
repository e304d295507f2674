"""How many cores this process may run on: its CPU affinity where the OS has one (a job
pinned to 8 of 64 cores gets 8), else the machine's count."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may use (at least 1).

    >>> usable_cores() >= 1
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
