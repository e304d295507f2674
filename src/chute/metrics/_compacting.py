"""CompactingWriter: rows go to the hot log, a background thread folds them into columns."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from chute._util.checks import check_int
from chute._util.safe_open import create_regular

from . import _config
from . import _format as F
from ._dtypes import Value
from ._hot import encode_row
from ._streaming import StreamingWriter

#: A completed step: (step, metric names, their values); rows of one loop share name tuples.
Row = tuple[int, tuple[str, ...], tuple[Value, ...]]
_BACKLOG_FACTOR = 10


class CompactingWriter(StreamingWriter):
    """One appended `hot.jsonl` line per step; columns are written in batches of `hotsize` steps.

    Suits slow or networked filesystems: the training loop pays one append per
    step, and the columnar files are touched once per batch, off the loop's thread.
    When the backlog reaches 10x `hotsize`, `end_step` waits for the in-flight batch.

    >>> import tempfile
    >>> from chute.metrics import CompactingWriter, Reader
    >>> run = tempfile.mkdtemp()
    >>> with CompactingWriter(run, hotsize=2) as w:
    ...     for step in range(5):
    ...         w.write(loss=1 / (step + 1)); w.end_step()
    ...     with Reader(run) as live:  # readable while the writer works
    ...         live.rows("loss")
    5
    """

    def __init__(
        self,
        outdir: str | os.PathLike[str],
        step: int | None = None,
        *,
        hotsize: int,
        config: _config.ConfigArg = "config.json",
        allow_resume_finalized: bool = False,
        clock: bool = False,
    ) -> None:
        self._hotsize = check_int("hotsize", hotsize, minimum=1)
        self._row: dict[str, Value] = {}
        self._pending: list[Row] = []
        self._inflight: threading.Thread | None = None
        self._bg_error: BaseException | None = None
        self._hot_fd: int | None = None
        self._partial_flushed = False
        self._new: list[str] = []  # metrics of the pending row that have no column yet
        self._wider: list[str] = []  # and those whose values need a wider column
        super().__init__(outdir, step, config, allow_resume_finalized, clock)
        self._hot_path = os.path.join(self._pdir, F.HOT)

    def write(
        self, metrics: Mapping[str, Any] | None = None, /, *, flush: bool = False, **kwargs: Any
    ) -> None:
        """Log metrics at the current step; `flush=True` also rewrites the hot log with them."""
        if metrics is not None or kwargs:
            super().write(metrics, **kwargs)
        else:
            self._check_open()
        if flush:
            self._register_new()
            self._widen()
            self._rewrite_hot()
            self._partial_flushed = True

    def _apply(self, checked: list[tuple[str, Value, str]]) -> None:
        cols, row = self._store.cols, self._row
        for name, val, code in checked:
            row[name] = val
            col = cols.get(name)
            if col is None:
                self._new.append(name)
            elif code != col.code:
                self._wider.append(name)

    def end_step(self) -> None:
        """Append the step's row to the hot log and advance; may start a background batch."""
        self._check_open()
        self._tick()
        self._raise_background_error()
        if self._row:
            if self._new:
                self._register_new()
            if self._wider:
                self._widen()
            row = (self._step, tuple(self._row), tuple(self._row.values()))
            self._row = {}
            self._pending.append(row)
            if self._partial_flushed:
                self._rewrite_hot()
            else:
                os.write(self._hot(), encode_row(self._step, zip(row[1], row[2], strict=True)))
        self._partial_flushed = False
        self._step += 1
        self._maybe_compact()

    # -- hot log -----------------------------------------------------------------------------
    def _hot(self) -> int:
        if self._hot_fd is None:
            self._hot_fd = create_regular(self._hot_path, self._pdir, os.O_WRONLY | os.O_APPEND)
        return self._hot_fd

    def _close_hot(self) -> None:
        if self._hot_fd is not None:
            os.close(self._hot_fd)
            self._hot_fd = None

    def _rewrite_hot(self) -> None:
        data = b"".join(
            encode_row(s, zip(names, vals, strict=True)) for s, names, vals in self._all_rows()
        )
        self._close_hot()
        F.atomic_write(self._hot_path, data)

    def _register_new(self) -> None:
        """Give metrics first seen this step their (empty) columns and manifest entries."""
        new = [n for n in self._new if n not in self._store.cols]
        for name in new:
            self._store.add(name, self._schema.metas[name].code, create=False)
        if new:
            self._store.flush_manifest()
        self._new = []

    def _widen(self) -> None:
        """Widen columns to what this step's values need before the hot log holds them: a
        reader takes hot rows in the manifest's dtype (plattli's cannot put 7000 in `u8`).
        The batch in flight lands first; the column is rewritten, then the manifest switched."""
        if not self._wider:
            return
        self._wait()
        for name in dict.fromkeys(self._wider):
            code = self._schema.metas[name].code
            if self._store.cols[name].code != code:
                self._store.convert(name, code)
        self._wider = []

    # -- compaction ----------------------------------------------------------------------------
    def _maybe_compact(self) -> None:
        if self._inflight is not None and not self._inflight.is_alive():
            self._wait()
        if len(self._pending) < self._hotsize:
            return
        if self._inflight is not None and len(self._pending) >= _BACKLOG_FACTOR * self._hotsize:
            self._wait()
        if self._inflight is None:
            self._close_hot()
            os.replace(self._hot_path, os.path.join(self._pdir, F.HOT_COMPACTING))
            batch, self._pending = self._pending, []
            targets = self._targets(batch)
            self._inflight = threading.Thread(
                target=self._compact_in_background, args=(batch, targets), name="chute-compact"
            )
            self._inflight.start()

    def _compact_in_background(self, batch: list[Row], targets: dict[str, str]) -> None:
        try:
            self._compact(batch, targets)
            os.unlink(os.path.join(self._pdir, F.HOT_COMPACTING))
        except BaseException as e:  # re-raised on the writer's thread
            self._bg_error = e

    def _all_rows(self) -> list[Row]:
        """Pending rows plus the current step's partial row, if any."""
        if not self._row:
            return self._pending
        return [*self._pending, (self._step, tuple(self._row), tuple(self._row.values()))]

    def _targets(self, batch: list[Row]) -> dict[str, str]:
        """Storage codes of the batch's metrics now (they only ever widen later)."""
        metas = self._schema.metas
        return {n: metas[n].code for names in {r[1] for r in batch} for n in names}

    def _compact(self, batch: list[Row], targets: dict[str, str]) -> None:
        """Append a batch to the columns; runs of rows with the same names transpose at once."""
        columns: dict[str, tuple[list[int], list[Value]]] = {}
        i = 0
        while i < len(batch):
            names, j = batch[i][1], i + 1
            while j < len(batch) and batch[j][1] == names:
                j += 1
            run = batch[i:j]
            steps = [r[0] for r in run]
            for name, vals in zip(names, zip(*[r[2] for r in run], strict=True), strict=True):
                col_steps, col_vals = columns.setdefault(name, ([], []))
                col_steps.extend(steps)
                col_vals.extend(vals)
            i = j
        self._store.append_many([(n, s, v, targets[n]) for n, (s, v) in columns.items()])

    def _wait(self) -> None:
        if self._inflight is not None:
            self._inflight.join()
            self._inflight = None
        self._raise_background_error()

    def _raise_background_error(self) -> None:
        if self._bg_error is not None:
            err, self._bg_error = self._bg_error, None
            raise RuntimeError(f"background compaction of {self._outdir!r} failed") from err

    def _drain(self, final: bool) -> None:
        self._wait()
        self._register_new()
        batch = self._all_rows()
        self._compact(batch, self._targets(batch))
        self._store.flush_manifest()
        self._pending, self._row, self._partial_flushed = [], {}, False
        self._wider = []
        self._close_hot()
        if os.path.exists(self._hot_path):
            os.unlink(self._hot_path)
