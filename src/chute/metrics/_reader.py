"""Reader: columnar reads of a live or finished run, hot rows merged, torn tails tolerated."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn, TypeVar

import numpy as np

from chute._util.checks import check_int
from chute._util.closing import Closing
from chute.errors import CorruptRunError, RunFileMissingError

from . import _config
from . import _format as F
from ._dtypes import natural_code
from ._hot import by_column, hot_array, objects, parse_rows, parse_values, rows_after
from ._select import Selection, cast, join, select
from ._source import ZipSource, archive_beside, open_source
from ._verify import (
    RunRowsCutError,
    archive_problems,
    column_problems,
    cut_problem,
    raise_if,
    run_rows_problem,
)

T = TypeVar("T")
DTypeArg = str | np.dtype[Any] | type
_EMPTY_STEPS = np.zeros(0, F.INDEX_DTYPE)
_RETRIES = 5
_SEGMENT_CACHE = 64
_HOT_LOGS = (F.HOT, F.HOT_COMPACTING)


class Reader(Closing):
    """Read metrics of one run (folder or archive); one instance per thread.

    Manifest, config, hot rows and JSON columns are cached until `refresh()`;
    numeric column files are read afresh on every call, so a long-lived reader
    of a live run sees appended rows of known metrics without refreshing.

    >>> import tempfile
    >>> from chute.metrics import DirectWriter, Reader
    >>> run = tempfile.mkdtemp()
    >>> with DirectWriter(run) as w:
    ...     for step in range(4):
    ...         w.write(loss=4.0 - step)
    ...         if step % 2:
    ...             w.write(acc=step / 4)  # every other step
    ...         w.end_step()
    >>> with Reader(run) as r:
    ...     steps, loss = r.metric("loss")
    ...     print(r.metrics(), steps.tolist(), loss.tolist())
    ...     print(*r.metric("loss", idx=-1))  # one row: the last
    ...     steps, cols = r.table(["loss", "acc"])  # joined on the steps both have
    ...     print(steps.tolist(), cols["loss"].tolist(), cols["acc"].tolist())
    ['acc', 'loss'] [0, 1, 2, 3] [4.0, 3.0, 2.0, 1.0]
    3 1.0
    [1, 3] [3.0, 1.0] [0.25, 0.75]
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        kind: str | None = None,
        exclude_hot: bool = False,
        *,
        verify: bool = False,
    ) -> None:
        self._path = os.fspath(path)
        self._src = open_source(self._path, kind)
        self._follows = kind is None  # into the archive of a folder finalized meanwhile
        self._exclude_hot = exclude_hot or not self._src.live
        self._manifest: dict[str, Any] | None = None
        self._entries: dict[str, F.Entry | CorruptRunError] = {}
        self._manifest_raw = b""
        self._hot: dict[str, tuple[list[int], list[Any]]] | None = None
        self._jsonl: dict[str, tuple[int, list[Any], bool]] = {}
        self._run_rows_ok = False
        self._segments: dict[str, tuple[int, np.ndarray[Any, Any]]] = {}
        if verify:
            try:
                raise_if(self.verify(), self._path)
            except BaseException:
                self.close()
                raise

    def verify(self) -> list[str]:
        """Check what the default read does not; returns the problems found ([] if none).

        Archive members against their CRC-32, every hot-log line, every column's files
        (present, steps increasing; in a finished run, as every read checks too, rows
        agreeing with the steps and `run_rows`).
        `Reader(path, verify=True)` raises `CorruptRunError` listing them instead.

        >>> import tempfile, chute.metrics as cm
        >>> d = tempfile.mkdtemp(); w = cm.DirectWriter(d); w.write(loss=0.5); w.end_step()
        >>> w.finish()
        >>> with cm.Reader(d) as r:
        ...     r.verify()
        []
        """
        return self._retry(self._problems)

    def _problems(self) -> list[str]:
        problems = archive_problems(self._src)
        try:
            self.refresh()
            self._hot_cols()
            manifest = self._raw_manifest()
        except CorruptRunError as e:
            return [*problems, str(e)]
        for name in F.metric_names(manifest):
            try:
                code = self._entry(name)[0]
                steps = self._read(name, Selection())[0]
                if code == F.JSONL:
                    self._jsonl_values(name)
            except (CorruptRunError, ValueError) as e:
                named = isinstance(e, RunRowsCutError) or f"metric {name!r}" in str(e)
                msg = str(e) if named else f"metric {name!r}: {e}"
                problems += [msg] if msg not in problems else []  # the run's, once
                continue
            problems += column_problems(name, steps)
        return problems

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close the archive (if any)."""
        self._src.close()

    def refresh(self) -> None:
        """Drop cached metadata to pick up new metrics, hot rows and config of a live run."""
        self._manifest, self._hot, self._run_rows_ok = None, None, False
        self._entries.clear()
        self._jsonl.clear()
        self._segments.clear()

    # -- metadata ----------------------------------------------------------------------------
    def _raw_manifest(self) -> dict[str, Any]:
        if self._manifest is None:
            self._hot_cols()  # hot rows are snapshotted before the manifest that may absorb them
            data = self._src.read(F.MANIFEST)
            if data is None:
                if self._follow():
                    return self._raw_manifest()
                self._gone(self._finalized())
            self._manifest = F.load_manifest(data, self._src.where(F.MANIFEST))
            self._manifest_raw = data
        return self._manifest

    def manifest(self) -> dict[str, dict[str, Any]]:
        """Manifest entries of the columnar metrics (storage dtype and index layout)."""
        m = self._raw_manifest()
        return {k: dict(m[k]) for k in F.metric_names(m) if self._entry(k)}  # damage raises

    def metrics(self) -> list[str]:
        """Sorted names of every metric, including those only in the hot log."""
        return sorted(set(F.metric_names(self._raw_manifest())) | set(self._hot_cols()))

    def config(self) -> dict[str, Any]:
        """The run's config dict ({} when none was written)."""
        return _config.parse(self._src.read(F.CONFIG) or b"", self._src.where(F.CONFIG))

    @property
    def finished(self) -> bool:
        """Whether the run was finished: an archive, or a folder `finish()` wrote `run_rows` to."""
        return not self._src.live or "run_rows" in self._raw_manifest()

    def when_exported(self) -> str | None:
        """Timestamp of the last manifest write."""
        value = self._raw_manifest().get("when_exported")
        return value if isinstance(value, str) else None

    def rows(self, name: str) -> int:
        """Exact number of rows of a metric (not its last step)."""
        return self._retry(lambda: self._rows(name))

    def _rows(self, name: str) -> int:
        code, entry = self._entry(name)
        n, step_at = self._col_count(name, code, entry)
        rows = n + len(self._hot_tail(name, int(step_at(n - 1)) if n else -1))
        self._check_layout(name, entry)
        return rows

    def approx_max_rows(self, nprobes: int = 12) -> int:
        """Cheap estimate of the row count of the most frequent metric (hot rows excluded)."""
        nprobes = check_int("nprobes", nprobes)
        return self._retry(lambda: self._approx_max_rows(nprobes))

    def _approx_max_rows(self, nprobes: int) -> int:
        m = self._raw_manifest()
        if isinstance(m.get("run_rows"), int):
            return int(m["run_rows"])
        best, probes = 0, []
        for name in F.metric_names(m):
            entry = self._entry(name)[1]
            assert entry is not None
            if not entry.explicit and entry.closed:
                best = max(best, entry.rows(0))
            elif entry.code in F.NUMERIC_DTYPES:
                probes.append(entry)
        if probes and nprobes > 0:
            pick = np.unique(np.linspace(0, len(probes) - 1, min(nprobes, len(probes))).astype(int))
            for i in pick:
                entry = probes[int(i)]
                best = max(best, self._col_count(entry.name, entry.code, entry)[0])
        return best

    # -- reads ---------------------------------------------------------------------------------
    def metric(
        self,
        name: str,
        idx: int | None = None,
        *,
        dtype: DTypeArg = "standard",
        **selectors: Any,
    ) -> tuple[Any, Any]:
        """(steps, values) of a metric, or one (step, value) for an integer `idx`."""
        if idx is not None:
            if selectors:
                raise ValueError("idx cannot be combined with range selectors")
            return self._retry(lambda: self._one(name, idx, dtype))
        sel = Selection.of(selectors)
        steps, values, code = self._retry(lambda: self._read(name, sel))
        return steps, cast(values, code, dtype, name)

    def metric_indices(self, name: str, **selectors: Any) -> np.ndarray[Any, Any]:
        """Step values (uint32) of a metric's rows."""
        sel = Selection.of(selectors)
        return self._retry(lambda: self._read(name, sel))[0]

    def metric_values(
        self, name: str, *, dtype: DTypeArg = "standard", **selectors: Any
    ) -> np.ndarray[Any, Any]:
        """Values of a metric's rows."""
        return self.metric(name, dtype=dtype, **selectors)[1]  # type: ignore[no-any-return]

    def table(
        self,
        names: Iterable[str],
        on: str = "step",
        *,
        dtype: DTypeArg | Mapping[str, DTypeArg] = "standard",
        **selectors: Any,
    ) -> tuple[np.ndarray[Any, Any], dict[str, np.ndarray[Any, Any]]]:
        """Step-aligned columns: only steps present in every metric (inner join).

        `on` names the column the selectors apply to; a metric not among `names` takes
        part in the join without being returned. Repeated names are read once.
        """
        cols = list(dict.fromkeys(names))
        if not cols:
            raise ValueError("table() needs at least one metric name")
        joined = cols if on == "step" or on in cols else [on, *cols]
        sel = Selection.of(selectors)
        per = dtype if isinstance(dtype, Mapping) else {}
        dtypes = {n: per.get(n, "standard") if per else dtype for n in cols}
        unknown = set(dtype) - set(cols) if isinstance(dtype, Mapping) else set()
        if unknown:
            raise ValueError(f"dtype given for metrics not in the table: {sorted(unknown)}")
        steps, raw = self._retry(lambda: self._table(joined, on, sel))
        return steps, {n: cast(raw[n][0], raw[n][1], dtypes[n], n) for n in cols}

    def _table(
        self, cols: list[str], on: str, sel: Selection
    ) -> tuple[np.ndarray[Any, Any], dict[str, tuple[np.ndarray[Any, Any], str]]]:
        read: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]] = {}
        if on == "step":
            if sel.kind == "value":
                raise ValueError("vstart/vstop need on=<metric name>")
            window = sel if sel.kind == "step" else Selection()
            like = None  # columns of one cadence share one steps array, read once
            for n in cols:
                read[n] = self._read(n, window, like)
                like = read[n][0]
        else:
            read[on] = self._read(on, sel)
            window = Selection.around(read[on][0])
            for n in cols:
                if n != on:
                    read[n] = self._read(n, window)
        return join(read, cols, sel if on == "step" and sel.kind == "index" else None)

    # -- internals ---------------------------------------------------------------------------
    def _retry(self, fn: Callable[[], T]) -> T:
        """Run a read; if a live writer moved a file under it, refresh and run it again."""
        for _ in range(_RETRIES):
            try:
                return fn()
            except (FileNotFoundError, _Stale):
                if not self._src.live:
                    raise
                self._follow()
                self.refresh()
        return fn()

    def _follow(self) -> bool:
        """Whether this reader found a live folder by itself that was finalized since (its
        archive exists now), and reads the archive from here on."""
        archive = archive_beside(self._src)
        if not (self._follows and archive is not None and os.path.isfile(archive)):
            return False
        src = ZipSource(archive, root=os.path.dirname(archive))
        self._src.close()
        self._src, self._exclude_hot = src, True
        self.refresh()
        return True

    def _finalized(self) -> RunFileMissingError:
        where = self._src.where(F.MANIFEST)
        return RunFileMissingError(
            f"{where} is missing: not a run, or a live run that was finalized or removed "
            "since this Reader opened it",
            path=where,
        )

    def _gone(self, error: CorruptRunError) -> NoReturn:
        """A file of a live folder is missing. If the run was finalized meanwhile (its
        archive exists), a retry follows it or (`kind="dir"`) says so; else `error`."""
        archive = archive_beside(self._src)
        if archive is not None and os.path.isfile(archive):
            if self._follows:
                raise _Stale
            raise self._finalized()
        raise error

    def _entry(self, name: str) -> tuple[str, F.Entry | None]:
        m = self._raw_manifest()
        hot_cols = self._hot_cols()
        if name in m and name not in F.META_KEYS:
            entry = self._entries.get(name)
            if entry is None:
                try:
                    entry = F.entry_of(name, m[name], self._src.where(F.MANIFEST))
                except CorruptRunError as e:
                    entry = e
                self._entries[name] = entry
            if isinstance(entry, CorruptRunError):
                raise entry
            return entry.code, entry
        hot = hot_cols.get(name)
        if hot:
            return natural_code(hot[1][0]), None
        raise KeyError(f"unknown metric {name!r} in run {self._path}")

    def _sound_entries(self) -> dict[str, F.Entry]:
        """The manifest's entries that are not damaged (each damaged one is its own error)."""
        for name in F.metric_names(self._raw_manifest()):
            with contextlib.suppress(CorruptRunError):
                self._entry(name)
        return {n: e for n, e in self._entries.items() if isinstance(e, F.Entry)}

    def _hot_cols(self) -> dict[str, tuple[list[int], list[Any]]]:
        if self._exclude_hot:
            return {}
        if self._hot is None:
            # Newest first: a row leaves hot.jsonl only for hot.compacting.jsonl, and leaves
            # that only once it is in the columns, which are read after this.
            hot = parse_rows(self._src.read(F.HOT) or b"", self._src.where(F.HOT))
            compacting = self._src.read(F.HOT_COMPACTING) or b""
            self._hot = by_column(parse_rows(compacting, self._src.where(F.HOT_COMPACTING)) + hot)
        return self._hot

    def _hot_tail(self, name: str, last: int) -> list[tuple[int, Any]]:
        """Hot rows of a metric after step `last` (its columnar data), strictly increasing."""
        return rows_after(self._hot_cols().get(name), last)

    def _jsonl_values(self, name: str) -> list[Any]:
        return self._jsonl_column(name)[1]

    def _jsonl_column(self, name: str) -> tuple[int, list[Any], bool]:
        """(file size, values, whether a torn last line was left out) of a JSON column."""
        rel = F.value_file(name, F.JSONL)
        size = self._size(name, rel)
        cached = self._jsonl.get(name)
        if cached is None or cached[0] != size:
            data = self._src.read(rel, 0, size) or b""
            vals, torn = parse_values(data, self._src.where(rel))
            self._jsonl[name] = cached = (size, vals, torn)
        return cached

    def _size(self, name: str, rel: str) -> int:
        """Size of a file the manifest names; its absence is damage unless a writer moved it."""
        size = self._src.size(rel)
        if size is not None:
            return size
        if self._src.live and self._src.read(F.MANIFEST) != self._manifest_raw:
            raise _Stale  # widened, tightened or re-indexed under our cached manifest
        entry = self._entry(name)[1]
        if entry is not None and not entry.promises_rows:
            return 0  # no rows yet
        if self._src.live and any(self._src.size(h) is not None for h in _HOT_LOGS):
            # Plättli's CompactingWriter publishes a column's steps before creating its
            # file; while a hot log exists the rows may still be on their way.
            return 0
        where = self._src.where(rel)
        self._gone(
            RunFileMissingError(
                f"{where} is missing but the manifest lists metric {name!r}; the run is damaged",
                path=where,
            )
        )

    def _value_rows(self, name: str, code: str) -> tuple[int, bool]:
        """(whole values a column file holds, whether a torn partial value follows them)."""
        if code == F.JSONL:
            _size, vals, torn = self._jsonl_column(name)
            return len(vals), torn
        size, itemsize = self._size(name, F.value_file(name, code)), F.NUMERIC_DTYPES[code].itemsize
        return size // itemsize, size % itemsize > 0

    def _col_extent(
        self,
        name: str,
        code: str,
        entry: F.Entry | None,
        like: np.ndarray[Any, Any] | None = None,
    ) -> tuple[int, np.ndarray[Any, Any]]:
        """(columnar row count, their steps: `like` itself where the index file holds it)."""
        if entry is None:
            return 0, _EMPTY_STEPS
        nvals, torn = self._value_rows(name, code)
        if not entry.explicit:  # rows counted before any step is made: a range may be damage
            n = self._agree(name, code, nvals, entry.rows(nvals), torn)
            return n, self._expand(entry, nvals, n)
        torn = torn or self._size(name, F.index_file(name)) % F.INDEX_DTYPE.itemsize > 0
        steps = self._src.array(F.index_file(name), F.INDEX_DTYPE, 0, -1, like)
        n = self._agree(name, code, nvals, len(steps), torn)
        return n, steps[:n]

    def _agree(self, name: str, code: str, nvals: int, nsteps: int, torn: bool) -> int:
        """Rows of a column: its values that have steps.

        A live run may hold a torn or not yet indexed tail, which is left out. A finished
        run's files, steps and `run_rows` must agree exactly: a cut column is damage.
        """
        if self.finished:
            m, where = self._raw_manifest(), self._src.where(F.value_file(name, code))
            problem = cut_problem(where, nvals, nsteps, torn, m.get("run_rows"))
            if problem:
                self._damaged(CorruptRunError(problem, path=where))
            if not self._run_rows_ok:
                problem = run_rows_problem(self._src, self._sound_entries(), m.get("run_rows"))
                if problem:
                    self._damaged(RunRowsCutError(problem, path=self._src.where(F.MANIFEST)))
                self._run_rows_ok = True
        return min(nvals, nsteps)

    def _damaged(self, error: CorruptRunError) -> None:
        """Raise damage, unless a live writer changed the manifest since it was cached."""
        if self._src.live and self._src.read(F.MANIFEST) != self._manifest_raw:
            raise _Stale
        raise error

    def _expand(self, entry: F.Entry, nvals: int, n: int) -> np.ndarray[Any, Any]:
        """The first `n` steps of a segment layout, shared (read-only) by metrics with the same.

        One entry per layout: an open one growing with a live run replaces its expansion
        instead of keeping one per row count.
        """
        key = json.dumps(entry.spec, sort_keys=True)
        hit = self._segments.get(key)
        if hit is not None and hit[0] == n:
            return hit[1]
        if hit is None and len(self._segments) >= _SEGMENT_CACHE:
            self._segments.clear()
        steps = entry.steps(nvals, 0, n)
        steps.flags.writeable = False
        self._segments[key] = (n, steps)
        return steps

    def _column_values(self, name: str, code: str, i0: int, i1: int) -> np.ndarray[Any, Any]:
        if i1 <= i0:
            return np.zeros(0, object if code == F.JSONL else F.NUMERIC_DTYPES[code])
        if code == F.JSONL:
            return objects(self._jsonl_values(name)[i0:i1])
        out = self._src.array(F.value_file(name, code), F.NUMERIC_DTYPES[code], i0, i1 - i0)
        if len(out) < i1 - i0:
            raise _Stale  # the file shrank since it was sized: a writer is rewriting it
        return out

    def _check_layout(self, name: str, entry: F.Entry | None) -> None:
        """After reading an open-segment column of a live run, confirm its layout still holds.

        Steps of such a column are derived from the manifest; a writer that changed the
        cadence after our manifest snapshot has appended rows the snapshot would mislabel.
        """
        if entry is None or not self._src.live or entry.closed:
            return
        raw = self._src.read(F.MANIFEST) or b"{}"
        if raw == self._manifest_raw:
            return
        fresh = F.load_manifest(raw, self._src.where(F.MANIFEST)).get(name)
        if not isinstance(fresh, dict) or fresh.get("indices") != entry.spec:
            raise _Stale

    def _read(
        self, name: str, sel: Selection, like: np.ndarray[Any, Any] | None = None
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]:
        out = self._read_unchecked(name, sel, like)
        self._check_layout(name, self._entry(name)[1])
        return out

    def _read_unchecked(
        self, name: str, sel: Selection, like: np.ndarray[Any, Any] | None = None
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]:
        code, entry = self._entry(name)
        if sel.kind == "index":
            return self._read_positions(name, code, entry, sel)
        n, steps = self._col_extent(name, code, entry, like)
        tail = self._hot_tail(name, int(steps[-1]) if n else -1)
        if tail:
            steps = np.concatenate([steps, np.array([s for s, _ in tail], F.INDEX_DTYPE)])
        if sel.kind == "value":
            values = self._join(name, code, 0, len(steps), n, tail)
            keep = select(values, sel, name)
            return steps[keep], values[keep], code
        i0, i1 = sel.bounds(steps)
        return steps[i0:i1], self._join(name, code, i0, i1, n, tail), code

    def _read_positions(
        self, name: str, code: str, entry: F.Entry | None, sel: Selection
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]:
        """Rows picked by position, reading only their own steps and values: a chart reads
        a long column a slice at a time, never its whole index file."""
        n, step_at = self._col_count(name, code, entry)
        tail = self._hot_tail(name, int(step_at(n - 1)) if n else -1)
        i0, i1 = sel.positions(n + len(tail))
        c1 = min(i1, n)
        if entry is None or c1 <= i0:
            steps = _EMPTY_STEPS
        elif entry.explicit:
            steps = self._src.array(F.index_file(name), F.INDEX_DTYPE, i0, c1 - i0)
            if len(steps) < c1 - i0:
                raise _Stale  # the index file shrank since it was sized
        else:
            steps = entry.steps(self._value_rows(name, code)[0], i0, c1)
        if i1 > n:
            hot = np.array([s for s, _ in tail[max(i0 - n, 0) : i1 - n]], F.INDEX_DTYPE)
            steps = np.concatenate([steps, hot])
        return steps, self._join(name, code, i0, i1, n, tail), code

    def _join(
        self, name: str, code: str, i0: int, i1: int, n: int, tail: list[tuple[int, Any]]
    ) -> np.ndarray[Any, Any]:
        """Values of rows [i0, i1) across the columnar part (first n rows) and the hot tail."""
        col = self._column_values(name, code, i0, min(i1, n))
        if i1 <= n:
            return col
        hot = [v for _s, v in tail[max(i0 - n, 0) : i1 - n]]
        return np.concatenate([col, hot_array(hot, code)]) if len(col) else hot_array(hot, code)

    def _one(self, name: str, idx: int, dtype: DTypeArg) -> tuple[Any, Any]:
        code, entry = self._entry(name)
        n, step_at = self._col_count(name, code, entry)
        tail = self._hot_tail(name, int(step_at(n - 1)) if n else -1)
        total = n + len(tail)
        pos = idx + total if idx < 0 else idx
        if not 0 <= pos < total:
            raise IndexError(f"index {idx} out of range for metric {name!r} ({total} rows)")
        if pos < n:
            step, values = np.uint32(step_at(pos)), self._column_values(name, code, pos, pos + 1)
        else:
            step, values = np.uint32(tail[pos - n][0]), hot_array([tail[pos - n][1]], code)
        self._check_layout(name, entry)
        return step, cast(values, code, dtype, name)[0]

    def _col_count(
        self, name: str, code: str, entry: F.Entry | None
    ) -> tuple[int, Callable[[int], Any]]:
        """Columnar row count and a step lookup, touching only file sizes and single rows."""
        if entry is None:
            return 0, int
        nvals, torn = self._value_rows(name, code)
        if not entry.explicit:
            n = self._agree(name, code, nvals, entry.rows(nvals), torn)
            return n, lambda i: entry.steps(nvals, i, i + 1)[0]
        rel = F.index_file(name)
        isize = self._size(name, rel)
        nidx, torn = isize // F.INDEX_DTYPE.itemsize, torn or isize % F.INDEX_DTYPE.itemsize > 0

        def step_at(i: int) -> Any:
            return self._src.array(rel, F.INDEX_DTYPE, i, 1)[0]

        return self._agree(name, code, nvals, nidx, torn), step_at


class _Stale(RuntimeError):
    """The cached manifest no longer matches the files (a live writer changed a layout)."""

    def __init__(self) -> None:
        super().__init__("the run kept changing under the read; try again")
