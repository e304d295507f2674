"""Checks the default read skips: archive CRC-32s, hot-log lines, column file consistency."""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from chute.errors import CorruptRunError

from . import _format as F
from ._source import Source, ZipSource


def archive_problems(src: Source) -> list[str]:
    """Members of a `metrics.plattli` whose bytes differ from the CRC-32 the zip stores."""
    if not isinstance(src, ZipSource):
        return []
    out = []
    for info in src.members():
        where = src.where(info.filename)
        try:
            data = src.read(info.filename) or b""  # a compressed member is CRC-checked by zipfile
        except (zipfile.BadZipFile, zlib.error, OSError) as e:
            out.append(f"{where}: {e}")
            continue
        crc = zlib.crc32(data)
        if len(data) != info.file_size:
            out.append(f"{where}: holds {len(data)} bytes, the archive says {info.file_size}")
        elif crc != info.CRC:
            out.append(f"{where}: CRC-32 {crc:08x} differs from the archive's {info.CRC:08x}")
    return out


def column_problems(name: str, steps: np.ndarray[Any, Any]) -> list[str]:
    """A column's steps must strictly increase."""
    if len(steps) > 1 and not bool(np.all(steps[1:] > steps[:-1])):
        return [f"metric {name!r}: steps do not strictly increase"]
    return []


class RunRowsCutError(CorruptRunError):
    """`run_rows` promises more rows than any column holds: damage of the run, not of the
    metric being read (`verify` lists it once)."""


def cut_problem(where: str, nvals: int, nsteps: int, torn: bool, run_rows: object) -> str | None:
    """What is wrong with a finished run's column of `nvals` values and `nsteps` steps."""
    if torn or nvals != nsteps:
        return (
            f"{where}: {nvals} rows{' and a torn tail' if torn else ''}, but its steps say "
            f"{nsteps}; the run is damaged (a file was cut or grew)"
        )
    if isinstance(run_rows, int) and nvals > run_rows:
        return f"{where}: {nvals} rows, more than run_rows={run_rows}; the run is damaged"
    return None


def run_rows_problem(src: Source, entries: Mapping[str, F.Entry], run_rows: object) -> str | None:
    """`run_rows` is the row count of a finished run's longest column: one must hold that many.

    Counted from the manifest and file sizes, stopping at the first column that does.
    """
    if not isinstance(run_rows, int) or isinstance(run_rows, bool):
        return None
    best = 0
    for entry in entries.values():
        best = max(best, _promised_rows(src, entry))
        if best >= run_rows:
            return None
    return (
        f"{src.where(F.MANIFEST)} says run_rows={run_rows}, but its longest column holds {best} "
        "rows; the run is damaged (a column was cut)"
    )


def _promised_rows(src: Source, entry: F.Entry) -> int:
    """Rows a finished column's steps say it has (file sizes for an open last segment)."""
    name, code = entry.name, entry.code
    if entry.segments is None:
        return (src.size(F.index_file(name)) or 0) // F.INDEX_DTYPE.itemsize
    if entry.closed:
        return entry.rows(0)
    if code == F.JSONL:
        nvals = (src.read(F.value_file(name, code)) or b"").count(b"\n")
    else:
        nvals = (src.size(F.value_file(name, code)) or 0) // F.NUMERIC_DTYPES[code].itemsize
    return entry.rows(nvals)


def raise_if(problems: list[str], path: str) -> None:
    """One `CorruptRunError` listing every problem found in the run at `path`."""
    if problems:
        raise CorruptRunError(f"run {path} is damaged:\n  " + "\n  ".join(problems), path=path)
