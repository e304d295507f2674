"""Every fact of the Plättli on-disk format: file names, dtype codes, name rules, manifest I/O."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from chute._util.fs import write_file_atomic
from chute.errors import CorruptRunError

DIR_NAME = "plattli"
ZIP_NAME = "metrics.plattli"
MANIFEST = "plattli.json"
CONFIG = "config.json"
HOT = "hot.jsonl"
HOT_COMPACTING = "hot.compacting.jsonl"
INDICES_SUFFIX = ".indices"
JSONL = "jsonl"
INDEX_DTYPE = np.dtype("<u4")
MAX_STEP = 2**32 - 1

#: Manifest keys that are run metadata rather than metrics.
META_KEYS = frozenset({"run_rows", "when_exported"})
RESERVED_NAMES = frozenset({"step", "run_rows", "when_exported", "hot", "hot.compacting"})

#: Storage dtype code -> little-endian NumPy dtype.
NUMERIC_DTYPES: dict[str, np.dtype[Any]] = {
    code: np.dtype(spec)
    for code, spec in {
        "f32": "<f4",
        "f64": "<f8",
        "i8": "i1",
        "i16": "<i2",
        "i32": "<i4",
        "i64": "<i8",
        "u8": "u1",
        "u16": "<u2",
        "u32": "<u4",
        "u64": "<u8",
    }.items()
}
DTYPE_CODES = frozenset(NUMERIC_DTYPES) | {JSONL}
#: Writers' temporary files carry this suffix; recovery deletes them.
TMP_SUFFIX = ".chute-tmp"
_LONGEST_SUFFIX = max(len(INDICES_SUFFIX), len("." + JSONL)) + len(TMP_SUFFIX)


def code_of(dtype: np.dtype[Any]) -> str | None:
    """The storage code of a NumPy dtype, or None if the format cannot store it."""
    for code, dt in NUMERIC_DTYPES.items():
        if dt == dtype.newbyteorder("<") or dt == dtype:
            return code
    return None


def check_name(name: object, root: str | os.PathLike[str] | None = None) -> str:
    """Validate a metric name against the format's rules and the filesystem's limits."""
    if not isinstance(name, str):
        raise TypeError(f"metric name must be a str, got {type(name).__name__}: {name!r}")
    if not name:
        raise ValueError("metric name must not be empty")
    if name in RESERVED_NAMES:
        raise ValueError(f"metric name {name!r} is reserved")
    if name.startswith("/"):
        raise ValueError(f"metric name {name!r} is an absolute path")
    if "\\" in name or "\0" in name:
        raise ValueError(f"metric name {name!r} contains a backslash or NUL")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"metric name {name!r} has an empty, '.' or '..' path component")
    name_max, path_max = _fs_limits(root)
    for i, part in enumerate(parts):
        room = name_max - (_LONGEST_SUFFIX if i == len(parts) - 1 else 0)
        if len(part.encode("utf-8", "surrogatepass")) > room:
            raise ValueError(
                f"metric name {name!r}: component {part[:20]!r}... is longer than the "
                f"filesystem allows ({room} bytes with the file suffix)"
            )
    base = len(os.fsencode(os.path.abspath(root))) if root is not None else 0
    if base + len(name.encode("utf-8", "surrogatepass")) + _LONGEST_SUFFIX + 1 > path_max:
        raise ValueError(f"metric name {name[:40]!r}... makes a path longer than {path_max}")
    return name


_LIMITS: dict[str, tuple[int, int]] = {}


def _fs_limits(root: str | os.PathLike[str] | None) -> tuple[int, int]:
    key = os.fspath(root) if root is not None else ""
    if key not in _LIMITS:
        probe = key
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            probe = probe or "."
            lim = (os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX"))
        except (OSError, ValueError):
            lim = (255, 4096)
        _LIMITS[key] = lim
    return _LIMITS[key]


def value_file(name: str, code: str) -> str:
    """Relative path of a metric's value file."""
    return f"{name}.{code}"


def index_file(name: str) -> str:
    """Relative path of a metric's explicit step-index file."""
    return name + INDICES_SUFFIX


def timestamp(when: float | None = None) -> str:
    """The manifest's `when_exported` format (UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def dump_json(obj: object) -> bytes:
    """Serialise a manifest or config the way Plättli files are written."""
    return json.dumps(obj).encode()


def atomic_write(path: str, data: bytes, durable: bool = False) -> None:
    """Replace `path` with `data` so readers see the old or the new file, never a torn one
    (the new bytes wait under a `TMP_SUFFIX` name, which a writer's reopen removes).

    `durable`: the new file and its name are synced to stable storage before this returns.
    """
    write_file_atomic(path, data, durable=durable, suffix=TMP_SUFFIX)


def _segment_list(segs: object) -> list[Any]:
    return [segs] if isinstance(segs, Mapping) else list(segs)  # type: ignore[call-overload]


def _bounds(seg: Any, open_rows: int | None) -> tuple[int, int, int]:
    """(start, stop, step) of one segment; an open one (no `stop`) takes `open_rows` rows."""
    start, step = int(seg["start"]), int(seg.get("step", 1))
    if seg.get("stop") is not None:
        stop = int(seg["stop"])
    elif open_rows is not None:
        stop = start + step * max(open_rows, 0)
    else:
        raise ValueError(f"open index segment {seg!r} needs a row count")
    if step <= 0 or start < 0 or stop > MAX_STEP + 1:
        raise ValueError(f"invalid index segment {seg!r}")
    return start, max(stop, start), step


def segments_to_steps(segs: object, rows_hint: int | None = None) -> np.ndarray[Any, Any]:
    """Expand `{start, stop, step}` segments (list or legacy single dict) into step values.

    An open final segment (no `stop`) takes as many rows as `rows_hint` leaves for it.
    """
    seg_list = _segment_list(segs)
    parts: list[np.ndarray[Any, Any]] = []
    total = 0
    for i, seg in enumerate(seg_list):
        open_rows = rows_hint - total if rows_hint is not None and i == len(seg_list) - 1 else None
        parts.append(np.arange(*_bounds(seg, open_rows), dtype=INDEX_DTYPE))
        total += len(parts[-1])
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, INDEX_DTYPE)


def segment_rows(segs: object) -> int:
    """How many steps closed segments hold, without expanding them."""
    total = 0
    for seg in _segment_list(segs):
        start, stop, step = _bounds(seg, None)
        total += -(-(stop - start) // step)
    return total


def closed(spec: object) -> bool:
    """Whether an index spec fixes every step (no open final segment)."""
    if spec == "indices":
        return True
    return all(isinstance(s, Mapping) and s.get("stop") is not None for s in _segment_list(spec))


def promises_rows(spec: object) -> bool:
    """Whether a manifest entry's index spec says the column has files on disk.

    Only an empty segment list (a metric declared before its first row) does not.
    """
    return spec != []


def steps_to_segments(steps: np.ndarray[Any, Any]) -> list[dict[str, int]] | None:
    """Greedy arithmetic runs, or None when segments would not be smaller than the steps."""
    n = len(steps)
    if n < 2:
        return None
    s = steps.astype(np.int64)
    segs: list[dict[str, int]] = []
    i = 0
    while i < n:
        if i == n - 1:
            segs.append({"start": int(s[i]), "stop": int(s[i]) + 1, "step": 1})
            break
        d = int(s[i + 1] - s[i])
        if d <= 0:
            return None
        diffs = np.diff(s[i:])
        bad = np.flatnonzero(diffs != d)
        j = i + 1 + (int(bad[0]) if len(bad) else len(diffs))
        segs.append({"start": int(s[i]), "stop": int(s[j - 1]) + d, "step": d})
        i = j
        if len(segs) >= n:
            return None
    return segs if len(segs) < n else None


def load_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """Parse the manifest read from ``where``: anything but a JSON object is a
    `CorruptRunError` naming it."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CorruptRunError(f"{where} is corrupt ({e}); nothing was changed", where) from None
    if not isinstance(data, dict):
        raise CorruptRunError(f"{where} is not a JSON object", where)
    return data


def metric_names(manifest: Mapping[str, Any]) -> list[str]:
    """Metric entries of a manifest, without its metadata keys."""
    return [k for k, v in manifest.items() if k not in META_KEYS and isinstance(v, dict)]
