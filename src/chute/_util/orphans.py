"""Worker processes that end with their parent: a parent killed outright (``kill -9``) must
not leave workers behind holding what they inherited from it (its dataset lock, its pipes)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` (the pid that started it) dies, on
    Linux (elsewhere nothing is asked); a parent already gone ends it now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the request was made
        os._exit(1)
