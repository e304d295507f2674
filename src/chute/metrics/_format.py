"""Every fact of the Plättli on-disk format: file names, dtype codes, name rules, manifest I/O."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PureWindowsPath
from typing import Any, TypeGuard

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


def name_problem(name: object) -> str | None:
    """What breaks the format's rules for a metric name (None: none)."""
    if not isinstance(name, str):
        return f"metric name must be a str, got {type(name).__name__}: {name!r}"
    if not name:
        return "metric name must not be empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return f"metric name {name!r} is not UTF-8 text (it holds a lone surrogate)"
    if name in RESERVED_NAMES:
        return f"metric name {name!r} is reserved"
    if name.startswith("/") or PureWindowsPath(name).drive:
        return f"metric name {name!r} is an absolute path"
    if "\\" in name or "\0" in name:
        return f"metric name {name!r} contains a backslash or NUL"
    if any(p in ("", ".", "..") for p in name.split("/")):
        return f"metric name {name!r} has an empty, '.' or '..' path component"
    return None


def check_name(name: object, root: str | os.PathLike[str] | None = None) -> str:
    """Validate a metric name against the format's rules and the filesystem's limits."""
    problem = name_problem(name)
    if problem is not None:
        raise (ValueError if isinstance(name, str) else TypeError)(problem)
    assert isinstance(name, str)
    parts = name.split("/")
    name_max, path_max = _fs_limits(root)
    for i, part in enumerate(parts):
        room = name_max - (_LONGEST_SUFFIX if i == len(parts) - 1 else 0)
        if len(part.encode()) > room:
            raise ValueError(
                f"metric name {name!r}: component {part[:20]!r}... is longer than the "
                f"filesystem allows ({room} bytes with the file suffix)"
            )
    base = len(os.fsencode(os.path.abspath(root))) if root is not None else 0
    if base + len(name.encode()) + _LONGEST_SUFFIX + 1 > path_max:
        raise ValueError(f"metric name {name[:40]!r}... makes a path longer than {path_max}")
    return name


#: What follows a metric name in the name of one of its files.
_FILE_SUFFIXES = (*(f".{code}" for code in sorted(DTYPE_CODES)), INDICES_SUFFIX)
_RUN_FILES = frozenset({MANIFEST, CONFIG, HOT, HOT_COMPACTING})


def _folders(name: str) -> list[str]:
    """The folders a metric's files go in, relative to the run: `a`, `a/b` for `a/b/c`."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class NameSpace:
    """Metric names of one run as paths: a folder of one metric must not be a file of
    another (`a.f64/b` beside `a`, stored as `a.f64`) or a file of the run (`hot.jsonl/x`);
    the filesystem could not hold both."""

    __slots__ = ("folders", "names")

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names: set[str] = set()
        self.folders: set[str] = set()
        for name in names:
            self.add(name)

    def add(self, name: str) -> None:
        self.names.add(name)
        self.folders.update(_folders(name))

    def clash(self, name: str, *others: NameSpace) -> str | None:
        """Why `name` cannot join these names (and those of `others`), or None."""
        spaces = (self, *others)
        for folder in _folders(name):
            base = folder.removesuffix(TMP_SUFFIX)
            if base in _RUN_FILES:
                return f"metric name {name!r} needs a folder {folder!r}, a file of the run"
            for suffix in _FILE_SUFFIXES:
                owner = base.removesuffix(suffix)
                if owner != base and any(owner in s.names for s in spaces):
                    return (
                        f"metric name {name!r} needs a folder {folder!r}, "
                        f"which is a file of metric {owner!r}"
                    )
        for suffix in _FILE_SUFFIXES:
            for path in (name + suffix, name + suffix + TMP_SUFFIX):
                if any(path in s.folders for s in spaces):
                    return (
                        f"metric name {name!r} has a file {path!r}, which is a folder "
                        "of other metrics"
                    )
        return None


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


@dataclass(frozen=True, slots=True)
class Segment:
    """Steps `start`, `start + step`, ...: `count` of them, or (None) as many as the value
    file holds beyond the closed segments before it (the open final segment of a live run)."""

    start: int
    step: int
    count: int | None

    def last(self, count: int) -> int:
        """The step of its row `count - 1`."""
        return self.start + (count - 1) * self.step


@dataclass(frozen=True, slots=True)
class Entry:
    """A manifest entry checked against the format (`entry_of`)."""

    name: str
    where: str  # the manifest, for errors
    code: str
    spec: Any  # the `indices` value as written
    segments: tuple[Segment, ...] | None  # None: the steps are the `.indices` file
    monotonic: str | None

    @property
    def explicit(self) -> bool:
        """Whether its steps are in a `.indices` file."""
        return self.segments is None

    @property
    def closed(self) -> bool:
        """Whether its steps are fixed (no open final segment)."""
        return self.segments is None or all(s.count is not None for s in self.segments)

    @property
    def promises_rows(self) -> bool:
        """Whether it says files exist: only an empty segment list (a metric declared before
        its first row) does not."""
        return self.segments != ()

    def damage(self, problem: str) -> CorruptRunError:
        """The error for `problem` of this entry, naming the manifest and the metric."""
        return CorruptRunError(
            f"{self.where}: metric {self.name!r} {problem}; the run is damaged", path=self.where
        )

    def rows(self, nvals: int) -> int:
        """Rows its segments hold when the value file holds `nvals` (which sizes an open one)."""
        assert self.segments is not None
        total = 0
        for seg in self.segments:
            if seg.count is not None:
                total += seg.count
                continue
            count = max(nvals - total, 0)
            if count and seg.last(count) > MAX_STEP:
                raise self.damage(
                    f"holds {nvals} values: its open step segment {seg.start}+{seg.step}k "
                    "passes the last uint32 step"
                )
            total += count
        return total

    def steps(self, nvals: int, i0: int = 0, i1: int | None = None) -> np.ndarray[Any, Any]:
        """Steps of rows [i0, i1) (clipped to `rows(nvals)`), computing only those."""
        assert self.segments is not None
        total = self.rows(nvals)
        i1 = total if i1 is None else min(i1, total)
        parts: list[np.ndarray[Any, Any]] = []
        pos = 0
        for seg in self.segments:
            n = seg.count if seg.count is not None else total - pos
            lo, hi = max(i0, pos), min(i1, pos + n)
            if lo < hi:  # ends at the last step + 1 (<= 2**32): the arange never wraps
                first = seg.start + (lo - pos) * seg.step
                last = first + (hi - lo - 1) * seg.step
                parts.append(np.arange(first, last + 1, seg.step, dtype=INDEX_DTYPE))
            pos += n
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, INDEX_DTYPE)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def entry_of(name: str, raw: object, where: str) -> Entry:
    """Check a manifest entry: `{"indices": "indices" | segment | [segments], "dtype": code,
    optional "monotonic": "inc" | "dec"}` under a valid name; else a `CorruptRunError`
    naming the manifest `where` and the metric."""
    entry = Entry(name, where, "", None, None, None)
    problem = name_problem(name)
    if problem is not None:
        raise entry.damage(f"has an unsafe name ({problem})")
    if not isinstance(raw, dict):
        raise entry.damage(f"has the entry {raw!r}, not an object")
    code = raw.get("dtype")
    if not isinstance(code, str) or code not in DTYPE_CODES:
        raise entry.damage(f"has the unknown dtype {code!r}")
    mono = raw.get("monotonic")
    if mono is not None and mono not in ("inc", "dec"):
        raise entry.damage(f"has the monotonic flag {mono!r}, not 'inc' or 'dec'")
    if "indices" not in raw:
        raise entry.damage("has no indices")
    spec = raw["indices"]
    segments = None if spec == "indices" else _segments(entry, spec)
    return Entry(name, where, code, spec, segments, mono)


def _segments(entry: Entry, spec: object) -> tuple[Segment, ...]:
    if isinstance(spec, dict):
        spec = [spec]  # the legacy single segment
    if not isinstance(spec, list):
        raise entry.damage(f"has the indices {spec!r}: not 'indices' or step segments")
    out: list[Segment] = []
    prev_last = -1
    for i, seg in enumerate(spec):
        if not isinstance(seg, dict):
            raise entry.damage(f"has the step segment {seg!r}, not an object")
        start, step, stop = seg.get("start"), seg.get("step"), seg.get("stop", -1)
        if not (_is_int(start) and _is_int(step) and _is_int(stop)):
            raise entry.damage(f"has the step segment {seg!r}: start, step, stop must be integers")
        if start < 0 or step <= 0 or start > MAX_STEP or start <= prev_last:
            raise entry.damage(f"has the step segment {seg!r} out of range or out of order")
        if "stop" not in seg:
            if i != len(spec) - 1:
                raise entry.damage(f"has the step segment {seg!r} without stop before the last")
            out.append(Segment(start, step, None))
            continue
        if stop <= start:
            raise entry.damage(f"has the step segment {seg!r}, which is empty")
        count = -(-(stop - start) // step)
        if start + (count - 1) * step > MAX_STEP:
            raise entry.damage(f"has the step segment {seg!r} past the last uint32 step")
        out.append(Segment(start, step, count))
        prev_last = out[-1].last(count)
    return tuple(out)


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
    """The metrics a manifest lists: every key but the metadata's (damaged entries too)."""
    return [k for k in manifest if k not in META_KEYS]


def entries_of(manifest: Mapping[str, Any], where: str) -> dict[str, Entry]:
    """Every metric entry of a manifest checked (`entry_of`), and their names together
    (`NameSpace`): the first damage found is raised."""
    entries = {name: entry_of(name, manifest[name], where) for name in metric_names(manifest)}
    space = NameSpace(entries)
    for name, entry in entries.items():
        problem = space.clash(name)
        if problem is not None:
            raise entry.damage(f"clashes with another ({problem})")
    return entries
