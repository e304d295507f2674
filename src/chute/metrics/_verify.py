"""Checks the default read skips: archive CRC-32s, hot-log lines, column file consistency."""

from __future__ import annotations

import zipfile
import zlib
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


def column_problems(
    src: Source, name: str, entry: dict[str, Any], steps: np.ndarray[Any, Any], finished: bool
) -> list[str]:
    """A column's steps must strictly increase; a finished run's files must agree exactly."""
    out = []
    if len(steps) > 1 and not bool(np.all(steps[1:] > steps[:-1])):
        out.append(f"metric {name!r}: steps do not strictly increase")
    code = str(entry.get("dtype"))
    if not finished or code == F.JSONL:
        return out
    itemsize = F.NUMERIC_DTYPES[code].itemsize
    vsize = src.size(F.value_file(name, code)) or 0
    spec = entry.get("indices", "indices")
    if spec == "indices":
        expect = (src.size(F.index_file(name)) or 0) // F.INDEX_DTYPE.itemsize
    else:
        try:
            expect = len(F.segments_to_steps(spec, rows_hint=vsize // itemsize))
        except (ValueError, TypeError, KeyError) as e:
            return [*out, f"metric {name!r}: bad step ranges in the manifest ({e})"]
    if vsize != expect * itemsize:
        out.append(
            f"{src.where(F.value_file(name, code))}: {vsize} bytes, the steps need "
            f"{expect} rows of {itemsize} bytes"
        )
    return out


def raise_if(problems: list[str], path: str) -> None:
    """One `CorruptRunError` listing every problem found in the run at `path`."""
    if problems:
        raise CorruptRunError(f"run {path} is damaged:\n  " + "\n  ".join(problems), path=path)
