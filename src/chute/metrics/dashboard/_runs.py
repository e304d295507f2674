"""The runs a dashboard serves: found under its roots, opened lazily, summarised cheaply.

Runs are addressed by opaque ids handed out here, never by a path from the request, so a
URL cannot name anything outside the roots. Discovery follows no link that leaves them,
and a metric whose files resolve outside their run is refused.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from chute.errors import RunNotFoundError

from .. import _format as F
from .._reader import Reader
from .._source import is_run

T = TypeVar("T")
_RESCAN_S = 3.0
_PROBES = 16
_REPROBE = 10
IDLE_AFTER_S = 300.0


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
class Run:
    """One run: where it lives, its reader (opened on first use) and what it last looked like."""

    id: str
    name: str
    path: str
    root: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    reader: Reader | None = None
    state: tuple[Any, ...] = ()
    lead: str | None = None
    _polls: int = 0
    _sealed: tuple[tuple[Any, ...], bool] | None = None

    # -- files -------------------------------------------------------------------------------
    def _zip(self) -> str | None:
        for cand in (self.path, os.path.join(self.path, F.ZIP_NAME)):
            if os.path.isfile(cand):
                return cand
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
            return ("zip", z, _mtime(z))
        d = self._dir()
        return ("dir", d, *(_mtime(os.path.join(d, f)) for f in (F.MANIFEST, F.HOT, F.CONFIG)))

    # -- reading -----------------------------------------------------------------------------
    def use(self, fn: Callable[[Reader], T]) -> T:
        """Run `fn` on this run's reader, refreshed if the run changed since its last use."""
        with self.lock:
            state = self._state()
            if self.reader is not None and state[:2] != self.state[:2]:
                self.reader.close()  # finished and zipped, or the archive was replaced
                self.reader = None
            if self.reader is None:
                self.reader = Reader(state[1], kind=state[0])
                self.lead, self._polls = None, 0
            elif state != self.state:
                self.reader.refresh()
            self.state = state
            try:
                return fn(self.reader)
            except FileNotFoundError:
                self.reader.close()  # the run moved under us (e.g. zipped): open afresh next time
                self.reader = None
                raise

    def check_metric(self, r: Reader, name: str) -> None:
        """Refuse metric names that are not the run's, or whose files lead out of the run."""
        if name not in r.metrics():
            raise NotServed(f"no metric {name!r} in run {self.name!r}")
        check_name(name)
        if self.state and self.state[0] == "dir":
            base = os.path.realpath(self.state[1])
            code = r.manifest().get(name, {}).get("dtype")
            rels = [F.index_file(name)] + ([F.value_file(name, code)] if code else [])
            for rel in rels:
                full = os.path.join(self.state[1], rel)
                if os.path.lexists(full) and not _inside(os.path.realpath(full), base):
                    raise NotServed(f"metric {name!r} of run {self.name!r} leaves the run")

    def _finished_dir(self) -> bool:
        """Whether finish() sealed this folder run (only it writes `run_rows`); cached per state."""
        if self._sealed is None or self._sealed[0] != self.state:
            try:
                with open(os.path.join(self.state[1], F.MANIFEST), "rb") as f:
                    sealed = "run_rows" in F.load_manifest(f.read())
            except (OSError, ValueError):
                sealed = False
            self._sealed = (self.state, sealed)
        return self._sealed[1]

    def summary(self) -> dict[str, Any]:
        """Name, status, last step and last write of the run, or the error reading it."""
        out: dict[str, Any] = {"id": self.id, "name": self.name}
        try:
            out.update(self.use(self._summary))
        except Exception as e:  # a malformed run is reported in its row, never fatal
            out.update(status="error", error=f"{type(e).__name__}: {e}")
        return out

    def _summary(self, r: Reader) -> dict[str, Any]:
        kind = self.state[0]
        manifest = r.manifest()
        names = r.metrics()
        finished = kind == "zip" or self._finished_dir()
        # The lead is the busiest of a few sampled columns: its last row is the run's last
        # step. Between full probes (every _REPROBE polls) only the lead is read.
        full = self.lead not in names or self._polls % _REPROBE == 0
        self._polls += 1
        last, lead, most = -1, None, 0
        for name in _spread(names, _PROBES) if full else [str(self.lead)]:
            rows = r.rows(name)
            if rows:
                last = max(last, int(r.metric(name, idx=-1, dtype="storage")[0]))
                if rows > most:
                    lead, most = name, rows
        self.lead = lead
        files: list[tuple[float, int] | None] = list(self.state[2:])
        if kind == "dir" and lead is not None:
            code = manifest.get(lead, {}).get("dtype")
            if code:
                files.append(_mtime(os.path.join(self.state[1], F.value_file(lead, code))))
        wrote = max((f[0] for f in files if f), default=None)
        status = "finished" if finished else "live"
        if not finished and wrote is not None and time.time() - wrote > IDLE_AFTER_S:
            status = "idle"
        return {
            "kind": kind,
            "status": status,
            "last_step": last if last >= 0 else None,
            "last_write": wrote,
            "metrics": len(names),
            "version": [self.state[2:], last],
        }

    def close(self) -> None:
        """Close the reader, if one is open."""
        with self.lock:
            if self.reader is not None:
                self.reader.close()
                self.reader = None


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

    def _scan(self) -> None:
        multi = len(self.roots) > 1
        for root in self.roots:
            label = os.path.basename(root) or root
            for path in _find_runs(root):
                if path in self._by_path:
                    continue
                rel = os.path.relpath(path, root)
                name = label if rel == "." else (os.path.join(label, rel) if multi else rel)
                run = Run(id=f"r{len(self._runs)}", name=name, path=path, root=root)
                self._runs[run.id] = run
                self._by_path[path] = run
        self._scanned = time.monotonic()


def _find_runs(root: str) -> Iterator[str]:
    """Real paths of the runs at or under `root`, never leaving it through a link."""
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
            if d != F.DIR_NAME and is_run(full):
                yield full
            elif d != F.DIR_NAME:
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            full = os.path.realpath(os.path.join(dirpath, f))
            if f.endswith(".plattli") and _inside(full, root) and f != F.ZIP_NAME and is_run(full):
                yield full
