"""Columnar storage of one run directory: value/index files and the manifest."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chute._util.safe_open import create_regular, inside, open_unlinked
from chute.errors import RunFileMissingError

from . import _format as F
from ._dtypes import PACK, Value, capture, fits, resolve, text, tightest_int
from ._hot import read_rows
from ._monotonic import Monotonic, set_flag

#: Column files a writer keeps open: a quarter of the descriptor limit, so a run of a few
#: hundred metrics appends without reopening its files every step.
_MAX_OPEN_FILES = max(128, min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4))
Steps = Sequence[int] | np.ndarray[Any, Any]


@dataclass(slots=True)
class Column:
    """What the store knows about one metric on disk.

    Steps are kept *regular* (an open `{start, step}` segment in the manifest, no
    `.indices` file: one append per row) until a row breaks the cadence; the column
    then becomes *explicit* (a `.indices` file beside the values).
    """

    code: str
    rows: int = 0
    last_step: int = -1
    lo: int = 0  # integer extremes, for sign mixing with u64
    hi: int = 0
    start: int = 0  # regular layout: step of row i is start + stride * i
    stride: int = 1
    explicit: bool = False
    created: bool = True  # False: declared with no rows, its value file made at the first
    mono: Monotonic = field(default_factory=Monotonic)

    def __post_init__(self) -> None:
        self.mono.broken = self.code == F.JSONL

    def layout_after(self, steps: Steps) -> tuple[int, int, bool]:
        """(start, stride, explicit) once `steps` are appended."""
        if self.explicit or not len(steps):
            return self.start, self.stride, self.explicit
        arr = np.asarray(steps, dtype=np.int64)
        start, stride, n = self.start, self.stride, self.rows
        if n == 0:
            start, stride = int(arr[0]), int(arr[1] - arr[0]) if len(arr) > 1 else 1
        elif n == 1:
            stride = int(arr[0]) - start
        regular = stride > 0 and np.array_equal(arr, start + stride * np.arange(n, n + len(arr)))
        return (start, stride, False) if regular else (self.start, self.stride, True)

    def spec(self) -> Any:
        """The manifest's `indices` value for this layout."""
        if self.explicit:
            return "indices"
        return [{"start": self.start, "step": self.stride}] if self.rows else []

    def steps(self, index: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Step of every row (`index`: the `.indices` file, used when explicit)."""
        if self.explicit:
            return index[: self.rows]
        return (self.start + self.stride * np.arange(self.rows, dtype=np.int64)).astype(
            F.INDEX_DTYPE
        )


def encode_values(code: str, values: Sequence[Value]) -> bytes:
    """On-disk bytes of `values` stored as `code`."""
    if code == F.JSONL:
        return "".join([text(v) + "\n" for v in values]).encode()
    if len(values) == 1:
        num = values[0].num
        return PACK[code].pack(float(num) if code[0] == "f" else num)  # type: ignore[arg-type]
    return np.array([v.num for v in values], dtype=F.NUMERIC_DTYPES[code]).tobytes()


class ColumnStore:
    """The `plattli/` directory of a run, written by one thread at a time.

    Only `manifest` is shared between a writer's threads; it is guarded by `mlock`.
    """

    def __init__(self, pdir: str) -> None:
        self.pdir = pdir
        self.manifest: dict[str, Any] = {}
        self.cols: dict[str, Column] = {}
        self.mlock = threading.Lock()
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._dir_fd = -1

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, pdir: str, resume_step: int) -> ColumnStore:
        """Open (creating if needed) and recover: merge hot rows, cut at `resume_step`."""
        store = cls(pdir)
        os.makedirs(pdir, exist_ok=True)
        store._remove_temps()
        mpath = os.path.join(pdir, F.MANIFEST)
        dropped: list[tuple[str, str]] = []
        cuts: list[tuple[str, int]] = []
        if os.path.exists(mpath):
            with open(mpath, "rb") as f:
                manifest = F.load_manifest(f.read(), mpath)
            # Every entry is checked before a file is touched: a name leading out of the run
            # ('..', an absolute path) or a damaged entry refuses the resume, changing nothing.
            entries = F.entries_of(manifest, mpath)
            hot = any(os.path.exists(store._path(h)) for h in (F.HOT, F.HOT_COMPACTING))
            for name, entry in entries.items():
                if not hot:
                    store._check_files(entry)
                col_cuts = store._recover_column(entry, resume_step)
                if col_cuts is None:
                    dropped.append((name, entry.code))
                    continue
                cuts += [(r, n) for r, n in col_cuts if os.path.getsize(store._path(r)) != n]
            if cuts:
                # The one place a resume cuts committed rows. A kill can stop it anywhere, so
                # first the manifest of the cut run (live: no run_rows, no closed segments; the
                # rows it implies are a prefix of every file, cut or not) replaces the old
                # one durably; only then are files cut. Every state a crash leaves is then the
                # untouched run or a live run with each column read whole or already cut; the
                # other order leaves a finished manifest promising rows a cut file lost.
                store.flush_manifest(durable=True)
                for rel, n in cuts:
                    os.truncate(store._path(rel), n)
            for name, col in store.cols.items():
                set_flag(store.manifest[name], col.mono.flag())
        store._merge_hot(resume_step)
        store.flush_manifest()
        for name, code in dropped:  # only once no manifest names them
            if name not in store.cols:
                store._delete_files(name, code)
        return store

    def _check_files(self, entry: F.Entry) -> None:
        """Files a manifest entry commits to must exist (absent only while a hot log holds
        rows a compaction has not written yet)."""
        if not entry.promises_rows:
            return
        name = entry.name
        rels = [F.value_file(name, entry.code)]
        if entry.explicit:
            rels.append(F.index_file(name))
        for rel in rels:
            if not os.path.exists(self._path(rel)):
                raise RunFileMissingError(
                    f"{self._path(rel)} is missing but the manifest lists metric {name!r}; "
                    "the run is damaged (restore the file, or resume from a copy)",
                    path=self._path(rel),
                )

    def _remove_temps(self) -> None:
        for root, _dirs, files in os.walk(self.pdir):
            for fn in files:
                if fn.endswith(F.TMP_SUFFIX):
                    os.unlink(os.path.join(root, fn))

    def _path(self, rel: str) -> str:
        return os.path.join(self.pdir, rel)

    def _recover_column(self, entry: F.Entry, resume_step: int) -> list[tuple[str, int]] | None:
        """Plan the cut of a column at `resume_step` (and of its torn tails): its entry in the
        new manifest, and the (file, length) cuts `open` makes once that is published.

        None when no rows remain. A monotonic flag that the rows to be cut do not share is
        left out until they are cut.
        """
        name, code = entry.name, entry.code
        for other in F.DTYPE_CODES - {code}:
            alt = self._path(F.value_file(name, other))
            if os.path.isfile(alt):
                os.unlink(alt)
        values = self._read_values(name, code)
        if entry.segments is None:
            steps = _read_u4(self._path(F.index_file(name)))
        else:  # no more steps than values: a damaged range may declare billions
            steps = entry.steps(len(values), 0, len(values))
        n = min(len(values), len(steps))
        n = int(np.searchsorted(steps[:n], resume_step, side="left"))
        if n == 0:
            return None
        steps, values = steps[:n], values[:n]
        segs = entry.segments
        col = Column(code, n, int(steps[-1]), explicit=segs is None or len(segs) > 1)
        if segs is not None and not col.explicit:
            col.start, col.stride = segs[0].start, segs[0].step
        if code[0] in "iu":
            col.lo, col.hi = int(values.min()), int(values.max())
        if code != F.JSONL:
            col.mono.add_array(values)
        self.cols[name] = col
        nbytes = sum(len(v) + 1 for v in values) if code == F.JSONL else values.nbytes
        cuts = [(F.value_file(name, code), int(nbytes))]
        index = steps.astype(F.INDEX_DTYPE).tobytes()
        if segs is None:
            cuts.append((F.index_file(name), len(index)))
        elif col.explicit:  # ranges become a file, written whole before a manifest names it
            F.atomic_write(self._path(F.index_file(name)), index, durable=True)
        elif os.path.exists(self._path(F.index_file(name))):
            os.unlink(self._path(F.index_file(name)))  # a switch to explicit cut by a crash
        self.manifest[name] = {"indices": col.spec(), "dtype": code}
        flag = col.mono.flag()
        set_flag(self.manifest[name], flag if flag == entry.monotonic else None)
        return cuts

    def _read_values(self, name: str, code: str) -> np.ndarray[Any, Any]:
        path = self._path(F.value_file(name, code))
        if code == F.JSONL:
            try:
                with open(path, "rb") as f:
                    lines = f.read().split(b"\n")[:-1]
            except FileNotFoundError:
                lines = []
            out = np.empty(len(lines), dtype=object)
            for i, line in enumerate(lines):
                out[i] = line
            return out
        try:
            return np.fromfile(path, dtype=F.NUMERIC_DTYPES[code])
        except FileNotFoundError:
            return np.zeros(0, F.NUMERIC_DTYPES[code])

    def _merge_hot(self, resume_step: int) -> None:
        rows = read_rows(self._path(F.HOT_COMPACTING)) + read_rows(self._path(F.HOT))
        pending: dict[str, tuple[list[int], list[Value]]] = {}
        for step, row in rows:
            if step >= resume_step:
                continue
            for name, raw in row.items():
                try:
                    F.check_name(name)
                    val = capture(raw)
                except (TypeError, ValueError, OverflowError):
                    continue
                col = self.cols.get(name)
                steps, vals = pending.setdefault(name, ([], []))
                last = steps[-1] if steps else (col.last_step if col else -1)
                if step > last:
                    steps.append(step)
                    vals.append(val)
        self.append_many([(n, s, v, self._fold_code(n, v)) for n, (s, v) in pending.items() if s])
        for hot in (F.HOT_COMPACTING, F.HOT):
            if os.path.exists(self._path(hot)):
                os.unlink(self._path(hot))

    def _fold_code(self, name: str, vals: Sequence[Value]) -> str:
        """Storage code for recovered values: keep the column's if they fit, else widen."""
        col = self.cols.get(name)
        code = col.code if col else None
        lo, hi = (col.lo, col.hi) if col else (0, 0)
        for v in vals:
            if code and code[0] in "iu" and isinstance(v.num, int) and fits(code, v.num):
                continue
            try:
                code = resolve(code, v, lo, hi)
            except (TypeError, OverflowError):
                code = F.JSONL
        assert code is not None
        return code

    # -- writing ---------------------------------------------------------------------------
    def add(self, name: str, code: str, *, create: bool = True) -> None:
        """Register a new, empty metric (its file first, then the manifest entry).

        `create=False` publishes the entry alone and makes the file with the first rows
        (`append_raw`): a reader takes an entry that promises no rows and has no file for
        an empty column, and a writer that first logs a thousand metrics in its hot log
        does not wait on a thousand file creations.
        """
        rel = F.value_file(name, code)
        if create:
            self._create(rel)
        elif "/" not in rel:  # a link or FIFO planted there is refused now, not at compaction
            with contextlib.suppress(FileNotFoundError):
                os.close(open_unlinked(rel, os.O_RDONLY, dir_fd=self._folder()))
        col = self.cols[name] = Column(code, created=create)
        with self.mlock:
            self.manifest[name] = {"indices": col.spec(), "dtype": code}

    def _create(self, rel: str) -> None:
        """Make `rel` an empty regular file in the run (truncating what was there)."""
        if "/" in rel:
            path = self._path(rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.close(create_regular(path, self.pdir, os.O_WRONLY | os.O_TRUNC))  # no link out
        else:
            self._close_fd(rel)
            flags = os.O_WRONLY | os.O_TRUNC | os.O_CREAT
            os.close(open_unlinked(rel, flags, dir_fd=self._folder()))

    def changes_layout(self, name: str, step: int) -> bool:
        """Whether appending `step` needs a manifest update first (see `prepare`)."""
        col = self.cols[name]
        if col.explicit:
            return False
        if col.rows == 1:
            return step - col.start != col.stride
        return col.rows == 0 or step != col.start + col.stride * col.rows

    def prepare(self, batch: Mapping[str, Steps], changed: bool = False) -> None:
        """Publish the step layouts these appends need, in one manifest write, before them.

        A reader thus never pairs a new row with an outdated layout; a column turning
        explicit gets its `.indices` file (for the rows it has) before the manifest says so.
        `changed`: the caller already changed entries (monotonic flags); publish them too.
        """
        for name, steps in batch.items():
            col = self.cols[name]
            start, stride, explicit = col.layout_after(steps)
            if (start, stride, explicit) == (col.start, col.stride, col.explicit) and col.rows:
                continue
            if explicit and not col.explicit:
                index = col.steps(np.zeros(0, F.INDEX_DTYPE)).tobytes()
                F.atomic_write(self._path(F.index_file(name)), index)
            col.start, col.stride, col.explicit = start, stride, explicit
            spec = "indices" if explicit else [{"start": start, "step": stride}]
            with self.mlock:
                self.manifest[name] = {**self.manifest[name], "indices": spec}
            changed = True
        if changed:
            self.flush_manifest()

    def append_many(self, items: Sequence[tuple[str, Steps, Sequence[Value], str]]) -> None:
        """Append (name, steps, values, code) batches: create/widen, one `prepare`, append."""
        for name, _steps, _vals, code in items:
            col = self.cols.get(name)
            if col is None:
                self.add(name, code)
            elif col.code != code:
                self.convert(name, code)
        flags = False
        for name, _steps, vals, code in items:
            if code != F.JSONL:
                mono = self.cols[name].mono
                for v in vals:
                    mono.add(v.num)
                with self.mlock:
                    flags = set_flag(self.manifest[name], mono.flag()) or flags
        self.prepare({name: steps for name, steps, _v, _c in items}, flags)
        for name, steps, vals, code in items:
            self.append_raw(name, encode_values(code, vals), _pack_steps(steps), steps)
            if code[0] in "iu":
                col = self.cols[name]
                nums = [int(v.num) for v in vals]  # type: ignore[arg-type]
                lo, hi = min(nums), max(nums)
                if col.rows > len(steps):
                    lo, hi = min(col.lo, lo), max(col.hi, hi)
                col.lo, col.hi = lo, hi

    def append_raw(self, name: str, values: bytes, index: bytes, steps: Steps) -> None:
        """Append pre-encoded rows whose layout is already published (`prepare`).

        Values go first, so a torn index never points past data.
        """
        col = self.cols[name]
        if not col.created:
            self._create(F.value_file(name, col.code))
            col.created = True
        os.write(self._fd(F.value_file(name, col.code)), values)
        if col.explicit:
            os.write(self._fd(F.index_file(name)), index)
        col.rows += len(steps)
        col.last_step = int(steps[-1])

    def convert(self, name: str, code: str) -> None:
        """Rewrite a column in a wider storage dtype; the manifest switches atomically."""
        col = self.cols[name]
        old = col.code
        if not col.created:  # no rows, no file: only the entry changes
            col.code = code
            with self.mlock:
                self.manifest[name] = {**self.manifest[name], "dtype": code}
            self.flush_manifest()
            return
        values = self._read_values(name, old)[: col.rows]
        self._close_fd(F.value_file(name, old))
        new_path = self._path(F.value_file(name, code))
        F.atomic_write(new_path, _raw(code, values.astype(F.NUMERIC_DTYPES[code])))
        col.code = code
        with self.mlock:
            self.manifest[name] = {**self.manifest[name], "dtype": code}
        self.flush_manifest()
        os.unlink(self._path(F.value_file(name, old)))

    def flush_manifest(self, durable: bool = False, **meta: Any) -> None:
        """Atomically publish the manifest (stamped with `when_exported`); `durable`: on
        stable storage when this returns, not only in the page cache."""
        with self.mlock:
            self.manifest.update(meta)
            self.manifest["when_exported"] = F.timestamp()
            data = F.dump_json(self.manifest)
            F.atomic_write(self._path(F.MANIFEST), data, durable)

    # -- finishing -------------------------------------------------------------------------
    def seal(self) -> None:
        """Finish without optimizing: close every open step segment and publish `run_rows`.

        What Plättli's `finish(optimize=False)` writes too; the files already hold every
        row, so the closed segments and `run_rows` only state what is there.
        """
        self.close_files()
        with self.mlock:
            for name, col in self.cols.items():
                if not col.explicit and col.rows:
                    stop = col.start + col.stride * col.rows
                    seg = {"start": col.start, "stop": stop, "step": col.stride}
                    self.manifest[name] = {**self.manifest[name], "indices": [seg]}
        self.flush_manifest(run_rows=max((c.rows for c in self.cols.values()), default=0))

    def optimize(self) -> None:
        """Tighten integer dtypes, compress step ranges, flag monotonic columns, set run_rows.

        New files are written before the manifest switches to them, and replaced files
        are deleted after, so a concurrent reader always finds what the manifest names.
        """
        self.close_files()
        run_rows, obsolete = 0, []
        entries: dict[str, dict[str, Any]] = {}
        for name, col in self.cols.items():
            values = self._read_values(name, col.code)[: col.rows]
            index = _read_u4(self._path(F.index_file(name))) if col.explicit else _NO_STEPS
            steps = col.steps(index)
            entry: dict[str, Any] = {"indices": "indices", "dtype": col.code}
            if col.code[0] in "iu" and col.rows:
                tight = tightest_int(int(values.min()), int(values.max()))
                if tight != col.code:
                    F.atomic_write(self._path(F.value_file(name, tight)), _raw(tight, values))
                    obsolete.append(F.value_file(name, col.code))
                    col.code = entry["dtype"] = tight
            set_flag(entry, col.mono.flag())
            segs = F.steps_to_segments(steps)
            if segs is not None:
                entry["indices"] = segs
                if col.explicit:
                    obsolete.append(F.index_file(name))
            elif not col.explicit:  # a single regular row: a closed segment, no file
                entry["indices"] = [{"start": col.start, "stop": col.start + 1, "step": 1}]
            entries[name] = entry
            run_rows = max(run_rows, col.rows)
        with self.mlock:
            self.manifest.update(entries)
        self.flush_manifest(run_rows=run_rows)
        for rel in obsolete:
            os.unlink(self._path(rel))

    def remove_orphans(self) -> None:
        """Delete value/index files of metrics the manifest does not list (a crash's leftovers).

        Only files named like metric columns are touched; unrelated files stay.
        """
        suffixes = (*(f".{code}" for code in F.DTYPE_CODES), F.INDICES_SUFFIX)
        for root, _dirs, files in os.walk(self.pdir):
            for fn in files:
                rel = os.path.relpath(os.path.join(root, fn), self.pdir).replace(os.sep, "/")
                if rel in (F.HOT, F.HOT_COMPACTING):
                    continue
                for suffix in suffixes:
                    if rel.endswith(suffix) and rel[: -len(suffix)] not in self.cols:
                        os.unlink(os.path.join(root, fn))
                        break

    def close_files(self) -> None:
        """Close every cached descriptor."""
        while self._fds:
            _rel, fd = self._fds.popitem()
            os.close(fd)
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    # -- descriptors -----------------------------------------------------------------------
    def _fd(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is not None:
            self._fds.move_to_end(rel)
            return fd
        if len(self._fds) >= _MAX_OPEN_FILES:
            os.close(self._fds.popitem(last=False)[1])
        flags = os.O_WRONLY | os.O_APPEND
        if "/" in rel:  # a metric in a subfolder: the folder checked on every open
            fd = create_regular(self._path(rel), self.pdir, flags)
        else:  # relative to the run's folder, held open: no path to resolve again
            fd = open_unlinked(rel, flags | os.O_CREAT, dir_fd=self._folder())
        self._fds[rel] = fd
        return fd

    def _folder(self) -> int:
        """The run's plattli/ folder, opened once (checked inside the run) and kept."""
        if self._dir_fd < 0:
            inside(self.pdir, os.path.dirname(self.pdir))
            self._dir_fd = os.open(self.pdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        return self._dir_fd

    def _close_fd(self, rel: str) -> None:
        fd = self._fds.pop(rel, None)
        if fd is not None:
            os.close(fd)

    def _delete_files(self, name: str, code: str) -> None:
        for rel in (F.value_file(name, code), F.index_file(name)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(rel))


def _raw(code: str, values: np.ndarray[Any, Any]) -> bytes:
    if code == F.JSONL:
        return b"".join(bytes(v) + b"\n" for v in values)
    return np.ascontiguousarray(values, dtype=F.NUMERIC_DTYPES[code]).tobytes()


_NO_STEPS = np.zeros(0, F.INDEX_DTYPE)


def _read_u4(path: str) -> np.ndarray[Any, Any]:
    try:
        return np.fromfile(path, dtype=F.INDEX_DTYPE)
    except FileNotFoundError:
        return np.zeros(0, F.INDEX_DTYPE)


def _pack_steps(steps: Steps) -> bytes:
    return np.asarray(steps, dtype=F.INDEX_DTYPE).tobytes()
