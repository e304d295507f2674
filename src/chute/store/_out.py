"""The ``out=`` arrays that gathers write into: what makes one unfit, said by name.

The compiled core refuses any destination it cannot write plainly (read-only, strided,
holding Python objects) before it touches a byte; this module says *which* of those it is,
and checks the size, so the caller sees an `OutBufferError` naming the problem.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chute.errors import OutBufferError

__all__ = ["check_out", "out_problem", "out_stride"]


def out_problem(out: Any) -> OutBufferError | None:
    """Why a gather cannot write into ``out`` (read-only, not C-contiguous, holding Python
    objects, or no buffer at all), or None where it can."""
    if isinstance(out, np.ndarray):
        flags = out.flags
        if flags.writeable and flags.c_contiguous and not out.dtype.hasobject:
            return None  # the common case, without building the messages below
        readonly, contiguous = not flags.writeable, flags.c_contiguous
        objects, what = out.dtype.hasobject, f"dtype {out.dtype}"
    else:
        try:
            view = memoryview(out)
        except TypeError:
            kind = type(out).__name__
            return OutBufferError(f"out must be a numpy array (a writable buffer), got {kind}")
        readonly, contiguous = view.readonly, view.c_contiguous
        objects, what = any(c in view.format for c in "O&"), f"buffer format {view.format!r}"
    if readonly:
        return OutBufferError("out is read-only (not writeable): gather into a writeable array")
    if not contiguous:
        return OutBufferError(
            "out is not C-contiguous (a strided view, a transpose or Fortran order): "
            "gather into a C-contiguous array"
        )
    if objects:
        return OutBufferError(
            f"out has {what}, which holds Python objects: records are gathered only into "
            "arrays of plain data"
        )
    return None


def check_out(out: Any) -> None:
    """Raise the `OutBufferError` for an ``out`` a gather cannot write into."""
    problem = out_problem(out)
    if problem is not None:
        raise problem


def out_stride(out: Any, n: int) -> int:
    """The bytes per record when ``out`` holds ``n`` (> 0) equal records; an ``out`` whose
    size is not a multiple of ``n`` is an `OutBufferError`."""
    nbytes = out.nbytes if isinstance(out, np.ndarray) else _nbytes(out)
    if nbytes % n:
        raise OutBufferError(f"out has {nbytes} bytes, not a multiple of {n} records")
    return int(nbytes // n)


def _nbytes(out: Any) -> int:
    check_out(out)
    return memoryview(out).nbytes
