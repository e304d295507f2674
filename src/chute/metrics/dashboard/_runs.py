"""The runs a dashboard serves: found under its roots, opened lazily, summarised cheaply.

Runs are addressed by opaque ids handed out here, never by a path from the request, so a
URL cannot name anything outside the roots. Discovery follows no link that leaves them,
a metric whose files resolve outside their run is refused (404), and the reader beneath
opens no file of a run that resolves outside the run or is not a regular file.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from chute._util.safe_open import inside
from chute.errors import RunNotFoundError, UnsafeFileError

from .. import _format as F
from .._query import flatten_config, last_values
from .._reader import Reader
from .._source import is_run, is_run_dir, run_folder

T = TypeVar("T")
_RESCAN_S = 3.0
_PROBES = 16
_REPROBE = 10
IDLE_AFTER_S = 300.0
#: Chart readers kept open at once (an archive's holds a file descriptor).
MAX_OPEN = 64


class NotServed(LookupError):
    """A run or metric the dashboard does not serve (the app answers 404)."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _mtime(path: str) -> tuple[float, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime, st.st_size


def check_name(name: str) -> None:
    """Refuse a name breaking the format's rules (absolute, `..`, NUL...) as not served."""
    try:
        F.check_name(name)
    except ValueError as e:
        raise NotServed(str(e)) from None


@dataclass
class _Slot:
    """One reader of a run behind its own lock, and the run's state when it last read."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: Reader | None = None
    state: tuple[Any, ...] = ()

    def drop(self) -> None:
        """Close the reader (the lock is held), so the next use opens the run afresh."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None


@dataclass
class Run:
    """One run: where it lives, the charts' reader of it, and its cached summary.

    Charts read through `reads` (kept open while the run is charted); the run list reads
    through a reader of its own, opened only when a file the summary depends on changed
    and closed right after, so listing a thousand runs holds no file open and a long
    series read never holds up the list.
    """

    id: str
    name: str
    path: str
    root: str
    reads: _Slot = field(default_factory=_Slot)
    #: Told after each chart read, so the index can close the readers used longest ago.
    opened: Callable[[Run], None] | None = None
    listing: threading.Lock = field(default_factory=threading.Lock)
    lead: str | None = None
    _lead_files: tuple[str, ...] = ()
    _polls: int = 0
    _last: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    # -- files -------------------------------------------------------------------------------
    def _zip(self) -> tuple[str, os.stat_result] | None:
        """The run's archive and its stat, if it has one (one lstat when it is no link)."""
        for cand in (self.path, os.path.join(self.path, F.ZIP_NAME)):
            try:
                st = os.lstat(cand)
                if stat.S_ISLNK(st.st_mode):
                    inside(cand, self.path)  # a run folder's archive linked from elsewhere
                    st = os.stat(cand)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(st.st_mode):
                return cand, st
        return None

    def _dir(self) -> str:
        for cand in (self.path, os.path.join(self.path, F.DIR_NAME)):
            if os.path.isfile(os.path.join(cand, F.MANIFEST)):
                return cand
        raise RunNotFoundError(f"run {self.name!r} is gone: no {F.MANIFEST} or {F.ZIP_NAME}")

    def _state(self) -> tuple[Any, ...]:
        """What changes when a writer adds metrics or hot rows, or the run is finished."""
        z = self._zip()
        if z is not None:
            return ("zip", z[0], (z[1].st_mtime, z[1].st_size))
        d = self._dir()
        return ("dir", d, *(_mtime(os.path.join(d, f)) for f in (F.MANIFEST, F.HOT, F.CONFIG)))

    # -- reading -----------------------------------------------------------------------------
    def _open(self, slot: _Slot, state: tuple[Any, ...]) -> Reader:
        """The slot's reader (its lock held), refreshed if the run changed since its last use."""
        if slot.reader is not None and state[:2] != slot.state[:2]:
            slot.drop()  # finished and zipped, or the archive was replaced
        if slot.reader is None:
            slot.reader = Reader(state[1], kind=state[0])
        elif state != slot.state:
            slot.reader.refresh()
        slot.state = state
        return slot.reader

    def use(self, fn: Callable[[Reader], T]) -> T:
        """Run `fn` on the charts' reader, refreshed if the run changed since its last use."""
        try:
            with self.reads.lock:
                try:
                    return fn(self._open(self.reads, self._state()))
                except FileNotFoundError:
                    self.reads.drop()  # the run moved (e.g. zipped): open afresh next time
                    raise
        finally:
            if self.opened is not None:
                self.opened(self)

    def check_metric(self, r: Reader, name: str) -> None:
        """Refuse metric names that are not the run's, or whose files lead out of the run."""
        if name not in r.metrics():
            raise NotServed(f"no metric {name!r} in run {self.name!r}")
        check_name(name)
        state = self.reads.state
        if state and state[0] == "dir":
            code = r.manifest().get(name, {}).get("dtype")
            rels = [F.index_file(name)] + ([F.value_file(name, code)] if code else [])
            for rel in rels:
                try:
                    inside(os.path.join(state[1], rel), run_folder(state[1]))
                except UnsafeFileError:
                    msg = f"metric {name!r} of run {self.name!r} leaves the run"
                    raise NotServed(msg) from None

    def summary(self, last: Collection[str] = ()) -> dict[str, Any]:
        """Name, status, last step and last write of the run, its flattened config under
        "config" and the last values of the metrics named in `last` under "last" (those
        the run has), or the error reading it."""
        out: dict[str, Any] = {"id": self.id, "name": self.name}
        try:
            with self.listing:
                out.update(self._cached_summary(last))
                out["last"] = dict(out["last"])  # the cached one may grow while this is sent
        except Exception as e:  # a malformed run is reported in its row, never fatal
            out.update(status="error", error=f"{type(e).__name__}: {e}", config={}, last={})
            return out
        wrote = out["last_write"]
        if out["status"] == "live" and wrote is not None and time.time() - wrote > IDLE_AFTER_S:
            out["status"] = "idle"
        return out

    def _cached_summary(self, last: Collection[str]) -> dict[str, Any]:
        """The last summary while the files it was read from are unchanged. A live run is
        read again every `_REPROBE`th poll (another column may have overtaken the lead);
        each run starts at a count drawn from its path, so that those polls do not fall
        together, however the live runs lie among the others. Last values
        asked for the first time are read then, and kept with the summary."""
        state = self._state()
        key, lead_files = self._key(state), self._lead_files
        full = self._polls % _REPROBE == 0
        self._polls += 1
        cached = self._last
        if (
            cached is not None
            and cached[0] == key
            and (not full or cached[1]["status"] == "finished")
        ):
            summary = cached[1]
            missing = [n for n in last if n not in summary["last"] and n in summary["names"]]
            if missing:
                with Reader(state[1], kind=state[0]) as r:
                    summary["last"].update(last_values(r, missing))
            return summary
        with Reader(state[1], kind=state[0]) as r:
            summary = self._summary(r, state, full)
            kept = [n for n in (cached[1]["last"] if cached else ()) if n in summary["names"]]
            summary["last"] = last_values(r, [*dict.fromkeys([*kept, *last])])
        if self._lead_files != lead_files:  # a new lead: key on its files from now on
            key = self._key(state)
        self._last = (key, summary)
        return summary

    def _key(self, state: tuple[Any, ...]) -> tuple[Any, ...]:
        """The run's state and, in a folder, its lead column's files (appended to in place)."""
        if state[0] != "dir":
            return state
        return (*state, *(_mtime(os.path.join(state[1], f)) for f in self._lead_files))

    def _summary(self, r: Reader, state: tuple[Any, ...], full: bool) -> dict[str, Any]:
        kind = state[0]
        manifest = r.manifest()
        names = r.metrics()
        # The lead is the busiest of a few sampled columns: its last row is the run's last
        # step. Between full probes (every _REPROBE polls) only the lead is read.
        last, lead, most = -1, None, 0
        for name in _spread(names, _PROBES) if full or self.lead not in names else [str(self.lead)]:
            rows = r.rows(name)
            if rows:
                last = max(last, int(r.metric(name, idx=-1, dtype="storage")[0]))
                if rows > most:
                    lead, most = name, rows
        self.lead = lead
        files: list[tuple[float, int] | None] = list(state[2:])
        code = manifest.get(lead, {}).get("dtype") if lead is not None else None
        self._lead_files = (F.value_file(str(lead), code), F.index_file(str(lead))) if code else ()
        if kind == "dir" and self._lead_files:
            files.append(_mtime(os.path.join(state[1], self._lead_files[0])))
        wrote = max((f[0] for f in files if f), default=None)
        try:
            config, config_error = flatten_config(r.config()), None
        except Exception as e:  # the run's rows still list; its config shows the error
            config, config_error = {}, f"{type(e).__name__}: {e}"
        return {
            "kind": kind,
            "status": "finished" if r.finished else "live",
            "last_step": last if last >= 0 else None,
            "last_write": wrote,
            "metrics": len(names),
            "version": [state[2:], last],
            "config": config,
            "config_error": config_error,
            "names": frozenset(names),
        }

    def close(self) -> None:
        """Close the charts' reader, if open."""
        with self.reads.lock:
            self.reads.drop()


def _spread(names: list[str], k: int) -> list[str]:
    if len(names) <= k:
        return list(names)
    pick = np.unique(np.linspace(0, len(names) - 1, k).astype(int))
    return [names[int(i)] for i in pick]


class RunIndex:
    """The runs under a set of root paths, rescanned at most every few seconds."""

    def __init__(self, paths: list[str]) -> None:
        if not paths:
            raise RunNotFoundError("the dashboard needs at least one run or folder of runs")
        self.roots = []
        for p in paths:
            if not os.path.exists(p):
                raise RunNotFoundError(f"no such run or folder: {p!r}")
            self.roots.append(os.path.realpath(p))
        self._lock = threading.Lock()
        self._open: OrderedDict[str, Run] = OrderedDict()  # runs with a chart reader open
        self._runs: dict[str, Run] = {}
        self._by_path: dict[str, Run] = {}
        self._scanned = -1e9

    def runs(self) -> list[Run]:
        """Every run found so far, in discovery order (rescanning if it is time)."""
        with self._lock:
            if time.monotonic() - self._scanned > _RESCAN_S:
                self._scan()
            return list(self._runs.values())

    def get(self, run_id: str) -> Run:
        """The run with this id; NotServed for any id this index did not hand out."""
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise NotServed(f"no run {run_id!r}")
        return run

    def close(self) -> None:
        """Close every open reader."""
        for run in list(self._runs.values()):
            run.close()

    def _opened(self, run: Run) -> None:
        """Keep at most `MAX_OPEN` chart readers open, closing those used longest ago."""
        with self._lock:
            self._open[run.id] = run
            self._open.move_to_end(run.id)
            stale = [self._open.popitem(last=False)[1] for _ in range(len(self._open) - MAX_OPEN)]
        for old in stale:
            old.close()

    def _scan(self) -> None:
        multi = len(self.roots) > 1
        for root in self.roots:
            label = os.path.basename(root) or root
            for path in _find_runs(root, self._by_path.keys()):
                if path in self._by_path:
                    continue
                rel = os.path.relpath(path, root)
                name = label if rel == "." else (os.path.join(label, rel) if multi else rel)
                n = len(self._runs)
                offset = zlib.crc32(path.encode()) % _REPROBE
                run = Run(f"r{n}", name, path, root, opened=self._opened, _polls=offset)
                self._runs[run.id] = run
                self._by_path[path] = run
        self._scanned = time.monotonic()


def _looks_like_run(path: str) -> bool:
    """A folder of columns, or a folder holding a regular `metrics.plattli` that does not
    lead out of it. An archive is not opened here: a damaged one lists as a run in error."""
    if is_run_dir(path):
        return True
    archive = os.path.join(path, F.ZIP_NAME)
    return os.path.isfile(archive) and _inside(os.path.realpath(archive), path)


def _find_runs(root: str, known: Collection[str] = ()) -> Iterator[str]:
    """Real paths of the runs at or under `root`, never leaving it through a link. Paths in
    `known` are taken for runs without a look inside (a rescan reads nothing of them)."""
    if is_run(root):
        yield root
        return
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen or not _inside(real, root):
            dirnames[:] = []
            continue
        seen.add(real)
        keep = []
        for d in sorted(dirnames):
            full = os.path.realpath(os.path.join(dirpath, d))
            if not _inside(full, root):
                continue
            if d != F.DIR_NAME and (full in known or _looks_like_run(full)):
                yield full
            elif d != F.DIR_NAME:
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            full = os.path.realpath(os.path.join(dirpath, f))
            if not (f.endswith(".plattli") and _inside(full, root) and f != F.ZIP_NAME):
                continue
            if full in known or os.path.isfile(full):
                yield full
