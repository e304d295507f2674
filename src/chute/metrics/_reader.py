"""Reader: columnar reads of a live or finished run, hot rows merged, torn tails tolerated."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from chute._util.checks import check_int
from chute._util.closing import Closing
from chute.errors import CorruptRunError, RunFileMissingError

from . import _config
from . import _format as F
from ._dtypes import natural_code
from ._hot import parse_rows
from ._select import Selection, cast, common_steps, same_steps, select
from ._source import open_source
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
        self._exclude_hot = exclude_hot or not self._src.live
        self._manifest: dict[str, Any] | None = None
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
            except (CorruptRunError, ValueError, _Stale) as e:
                msg = str(e) if isinstance(e, RunRowsCutError) else f"metric {name!r}: {e}"
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
        self._jsonl.clear()
        self._segments.clear()

    # -- metadata ----------------------------------------------------------------------------
    def _raw_manifest(self) -> dict[str, Any]:
        if self._manifest is None:
            self._hot_cols()  # hot rows are snapshotted before the manifest that may absorb them
            data = self._src.read(F.MANIFEST)
            if data is None:
                raise RunFileMissingError(
                    f"{self._src.where(F.MANIFEST)} is missing: not a run, or a live run that was "
                    "finalized or removed since this Reader opened it",
                    path=self._src.where(F.MANIFEST),
                )
            self._manifest = F.load_manifest(data, self._src.where(F.MANIFEST))
            self._manifest_raw = data
        return self._manifest

    def manifest(self) -> dict[str, dict[str, Any]]:
        """Manifest entries of the columnar metrics (storage dtype and index layout)."""
        m = self._raw_manifest()
        return {k: dict(m[k]) for k in F.metric_names(m)}

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
        m = self._raw_manifest()
        if isinstance(m.get("run_rows"), int):
            return int(m["run_rows"])
        best, probes = 0, []
        for name in F.metric_names(m):
            spec, code = m[name].get("indices", "indices"), m[name].get("dtype")
            if spec != "indices" and F.closed(spec):
                best = max(best, F.segment_rows(spec))
            elif code in F.NUMERIC_DTYPES:
                probes.append(name)
        if probes and nprobes > 0:
            pick = np.unique(np.linspace(0, len(probes) - 1, min(nprobes, len(probes))).astype(int))
            for i in pick:
                name = probes[int(i)]
                best = max(best, self._col_count(name, m[name]["dtype"], m[name])[0])
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
            on_steps = read[on][0]
            window = (
                Selection(kind="step", lo=int(on_steps[0]), hi=int(on_steps[-1]))
                if len(on_steps)
                else Selection(kind="index", lo=0, hi=0)
            )
            for n in cols:
                if n != on:
                    read[n] = self._read(n, window)
        common = read[cols[0]][0]
        aligned = all(same_steps(common, read[n][0]) for n in cols[1:])  # same cadence: no join
        if not aligned:
            for n in cols[1:]:
                common = common_steps(common, read[n][0])
        if on == "step" and sel.kind == "index":
            common, aligned = common[slice(sel.lo, sel.hi)], False
        out = {}
        for n in cols:
            s, v, code = read[n]
            out[n] = (v if aligned else v[np.searchsorted(s, common)], code)
        return common.astype(F.INDEX_DTYPE, copy=False), out

    # -- internals ---------------------------------------------------------------------------
    def _retry(self, fn: Callable[[], T]) -> T:
        """Run a read; if a live writer moved a file under it, refresh and run it again."""
        for _ in range(_RETRIES):
            try:
                return fn()
            except (FileNotFoundError, _Stale):
                if not self._src.live:
                    raise
                self.refresh()
        return fn()

    def _entry(self, name: str) -> tuple[str, dict[str, Any] | None]:
        m = self._raw_manifest()
        hot_cols = self._hot_cols()
        entry = m.get(name) if name not in F.META_KEYS else None
        if isinstance(entry, dict):
            code = entry.get("dtype")
            if code not in F.DTYPE_CODES:
                raise ValueError(f"metric {name!r} has unknown dtype {code!r}")
            return str(code), entry
        hot = hot_cols.get(name)
        if hot:
            return natural_code(hot[1][0]), None
        raise KeyError(f"unknown metric {name!r} in run {self._path}")

    def _hot_cols(self) -> dict[str, tuple[list[int], list[Any]]]:
        if self._exclude_hot:
            return {}
        if self._hot is None:
            # Newest first: a row leaves hot.jsonl only for hot.compacting.jsonl, and leaves
            # that only once it is in the columns, which are read after this.
            hot = parse_rows(self._src.read(F.HOT) or b"", self._src.where(F.HOT))
            compacting = self._src.read(F.HOT_COMPACTING) or b""
            rows = parse_rows(compacting, self._src.where(F.HOT_COMPACTING)) + hot
            cols: dict[str, tuple[list[int], list[Any]]] = {}
            for step, row in rows:
                for k, v in row.items():
                    steps, vals = cols.setdefault(k, ([], []))
                    steps.append(step)
                    vals.append(v)
            self._hot = cols
        return self._hot

    def _hot_tail(self, name: str, last: int) -> list[tuple[int, Any]]:
        """Hot rows of a metric after step `last` (its columnar data), strictly increasing."""
        hot = self._hot_cols().get(name)
        if not hot:
            return []
        out = []
        for s, v in zip(*hot, strict=True):
            if s > last:
                out.append((s, v))
                last = s
        return out

    def _jsonl_values(self, name: str) -> list[Any]:
        return self._jsonl_column(name)[1]

    def _jsonl_column(self, name: str) -> tuple[int, list[Any], bool]:
        """(file size, values, whether a torn last line was left out) of a JSON column."""
        rel = F.value_file(name, F.JSONL)
        size = self._size(name, rel)
        cached = self._jsonl.get(name)
        if cached is None or cached[0] != size:
            data = self._src.read(rel, 0, size) or b""
            lines = data.split(b"\n")  # an unterminated last line is a torn append
            vals = []
            for lineno, line in enumerate(lines[:-1], 1):
                try:
                    vals.append(json.loads(line))
                except ValueError:
                    where = self._src.where(rel)
                    raise CorruptRunError(
                        f"{where}:{lineno}: not a JSON value; the run is damaged",
                        path=where,
                        line=lineno,
                    ) from None
            self._jsonl[name] = cached = (size, vals, lines[-1] != b"")
        return cached

    def _size(self, name: str, rel: str) -> int:
        """Size of a file the manifest names; its absence is damage unless a writer moved it."""
        size = self._src.size(rel)
        if size is not None:
            return size
        if self._src.live and self._src.read(F.MANIFEST) != self._manifest_raw:
            raise _Stale  # widened, tightened or re-indexed under our cached manifest
        entry = self._raw_manifest().get(name)
        if isinstance(entry, dict) and not F.promises_rows(entry.get("indices", "indices")):
            return 0  # no rows yet
        if self._src.live and any(self._src.size(h) is not None for h in _HOT_LOGS):
            # Plättli's CompactingWriter publishes a column's steps before creating its
            # file; while a hot log exists the rows may still be on their way.
            return 0
        where = self._src.where(rel)
        raise RunFileMissingError(
            f"{where} is missing but the manifest lists metric {name!r}; the run is damaged",
            path=where,
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
        entry: dict[str, Any] | None,
        like: np.ndarray[Any, Any] | None = None,
    ) -> tuple[int, np.ndarray[Any, Any]]:
        """(columnar row count, their steps: `like` itself where the index file holds it)."""
        if entry is None:
            return 0, _EMPTY_STEPS
        nvals, torn = self._value_rows(name, code)
        spec = entry.get("indices", "indices")
        if spec == "indices":
            torn = torn or self._size(name, F.index_file(name)) % F.INDEX_DTYPE.itemsize > 0
            steps = self._src.array(F.index_file(name), F.INDEX_DTYPE, 0, -1, like)
        else:
            steps = self._expand(spec, nvals)
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
                problem = run_rows_problem(self._src, m)
                if problem:
                    self._damaged(RunRowsCutError(problem, path=self._src.where(F.MANIFEST)))
                self._run_rows_ok = True
        return min(nvals, nsteps)

    def _damaged(self, error: CorruptRunError) -> None:
        """Raise damage, unless a live writer changed the manifest since it was cached."""
        if self._src.live and self._src.read(F.MANIFEST) != self._manifest_raw:
            raise _Stale
        raise error

    def _expand(self, spec: Any, nvals: int) -> np.ndarray[Any, Any]:
        """Segment expansion, shared (read-only) by metrics with the same index layout.

        One entry per layout: an open one growing with a live run replaces its expansion
        instead of keeping one per row count.
        """
        key = json.dumps(spec, sort_keys=True)
        rows = nvals if not F.closed(spec) else -1
        hit = self._segments.get(key)
        if hit is not None and hit[0] == rows:
            return hit[1]
        if hit is None and len(self._segments) >= _SEGMENT_CACHE:
            self._segments.clear()
        steps = F.segments_to_steps(spec, rows_hint=nvals)
        steps.flags.writeable = False
        self._segments[key] = (rows, steps)
        return steps

    def _column_values(self, name: str, code: str, i0: int, i1: int) -> np.ndarray[Any, Any]:
        if i1 <= i0:
            return np.zeros(0, object if code == F.JSONL else F.NUMERIC_DTYPES[code])
        if code == F.JSONL:
            return _objects(self._jsonl_values(name)[i0:i1])
        out = self._src.array(F.value_file(name, code), F.NUMERIC_DTYPES[code], i0, i1 - i0)
        if len(out) < i1 - i0:
            raise _Stale  # the file shrank since it was sized: a writer is rewriting it
        return out

    def _check_layout(self, name: str, entry: dict[str, Any] | None) -> None:
        """After reading an open-segment column of a live run, confirm its layout still holds.

        Steps of such a column are derived from the manifest; a writer that changed the
        cadence after our manifest snapshot has appended rows the snapshot would mislabel.
        """
        if entry is None or not self._src.live or F.closed(entry.get("indices", "indices")):
            return
        raw = self._src.read(F.MANIFEST) or b"{}"
        if raw == self._manifest_raw:
            return
        fresh = F.load_manifest(raw, self._src.where(F.MANIFEST)).get(name)
        if not isinstance(fresh, dict) or fresh.get("indices") != entry.get("indices"):
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
        self, name: str, code: str, entry: dict[str, Any] | None, sel: Selection
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]:
        """Rows picked by position, reading only their own steps and values: a chart reads
        a long column a slice at a time, never its whole index file."""
        n, step_at = self._col_count(name, code, entry)
        tail = self._hot_tail(name, int(step_at(n - 1)) if n else -1)
        i0, i1 = sel.positions(n + len(tail))
        c1 = min(i1, n)
        if entry is None or c1 <= i0:
            steps = _EMPTY_STEPS
        elif entry.get("indices", "indices") == "indices":
            steps = self._src.array(F.index_file(name), F.INDEX_DTYPE, i0, c1 - i0)
            if len(steps) < c1 - i0:
                raise _Stale  # the index file shrank since it was sized
        else:
            steps = self._expand(entry["indices"], self._value_rows(name, code)[0])[i0:c1]
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
        return np.concatenate([col, _hot_array(hot, code)]) if len(col) else _hot_array(hot, code)

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
            step, values = np.uint32(tail[pos - n][0]), _hot_array([tail[pos - n][1]], code)
        self._check_layout(name, entry)
        return step, cast(values, code, dtype, name)[0]

    def _col_count(
        self, name: str, code: str, entry: dict[str, Any] | None
    ) -> tuple[int, Callable[[int], Any]]:
        """Columnar row count and a step lookup, touching only file sizes and single rows."""
        if entry is None:
            return 0, int
        nvals, torn = self._value_rows(name, code)
        spec = entry.get("indices", "indices")
        if spec != "indices":
            steps = self._expand(spec, nvals)
            return self._agree(name, code, nvals, len(steps), torn), steps.__getitem__
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


def _objects(values: list[Any]) -> np.ndarray[Any, Any]:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _hot_array(values: list[Any], code: str) -> np.ndarray[Any, Any]:
    """Hot-log values in the column's storage dtype (a wider one if a promotion is pending)."""
    if code == F.JSONL:
        return _objects(values)
    try:
        return np.array(values, dtype=F.NUMERIC_DTYPES[code])
    except (OverflowError, TypeError, ValueError):
        return np.array(values)
