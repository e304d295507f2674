"""Base of the two streaming writers: lock, resume, config, finish, context manager."""

from __future__ import annotations

import os
import time
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from chute._util.closing import Closing
from chute.errors import RunFinalizedError, RunHasStepsError, WriterClosedError

from . import _config
from . import _format as F
from ._archive import unzip_run, zip_run
from ._columns import ColumnStore
from ._dtypes import Value
from ._lock import RunLock
from ._reader import Reader
from ._source import is_run
from ._writer import Schema, Steps, check_overrides, check_step, run_paths


class StreamingWriter(Steps, Closing):
    """Shared life cycle of `DirectWriter` and `CompactingWriter`."""

    def __init__(
        self,
        outdir: str | os.PathLike[str],
        step: int | None,
        config: _config.ConfigArg,
        allow_resume_finalized: bool,
        clock: bool = False,
    ) -> None:
        self._step = 0 if step is None else check_step(step)
        frozen = _config.freeze(config)
        self._outdir, self._pdir, self._zip = run_paths(outdir)
        if os.path.exists(self._zip) and not allow_resume_finalized:
            raise RunFinalizedError(
                f"{self._zip} is a finalized run; pass allow_resume_finalized=True to resume it"
            )
        if step is None:  # before taking over a live writer of this process
            _refuse_if_logged(self._outdir)
        os.makedirs(self._outdir, exist_ok=True)
        self._closed = False
        self._lock = RunLock(self._outdir, self.close)
        try:
            if os.path.exists(self._zip):
                unzip_run(self._zip, self._pdir)
            self._store = ColumnStore.open(self._pdir, self._step)
            _config.apply(frozen, self._outdir, self._pdir)
        except BaseException:
            self._lock.release()
            raise
        self._schema = Schema.of(self._pdir, self._store.cols)
        self._clock = _Clock(self._outdir, self._step) if clock else None

    def _tick(self) -> None:
        """With ``clock=True``: log the step's wall clock and elapsed time (before it ends)."""
        if self._clock is not None:
            metas = self._schema.metas
            due = {name: value for name, value in self._clock.now().items()
                   if name not in metas or metas[name].last_step != self._step}  # fmt: skip
            if due:  # a value the caller wrote at this step stands
                self.write(due)

    def write(self, metrics: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        """Log metrics at the current step; the whole batch is validated before any change."""
        self._apply(self._accept(metrics, kwargs))

    def set_config(self, config: Mapping[str, Any]) -> None:
        """Atomically replace the run's config.json (a linked target is left unchanged)."""
        self._check_open()
        _config.replace(os.path.join(self._pdir, F.CONFIG), _config.freeze_dict(config))

    def finish(
        self,
        optimize: bool = True,
        zip: bool = True,
        config_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Flush, optionally tighten and index-compress, and optionally zip the run."""
        self._check_open()
        overrides = check_overrides(config_overrides)
        self._drain(final=True)
        self._store.remove_orphans()
        if optimize:
            self._store.optimize()
        else:
            self._store.seal()
        if overrides:
            _config.override(self._pdir, overrides)
        if zip:
            zip_run(self._pdir, self._zip)
        self._closed = True
        self._lock.release()

    def flush(self) -> None:
        """Make everything logged so far durable against a process crash."""
        self._check_open()
        self._drain(final=False)

    def close(self) -> None:
        """Flush and release the run without finishing it (it stays resumable)."""
        if self._closed:
            return
        try:
            self._drain(final=False)
            self._store.close_files()
        finally:
            self._closed = True
            self._lock.release()

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(
                f"writer of {self._outdir!r} is finished, closed or taken over by a newer writer"
            )

    @abstractmethod
    def _apply(self, checked: list[tuple[str, Value, str]]) -> None:
        """Store a validated batch at the current step."""

    @abstractmethod
    def _drain(self, final: bool) -> None:
        """Push everything pending to disk (`final`: also fold the hot log into columns)."""


def _refuse_if_logged(outdir: str) -> None:
    """Without `step=`, a run that holds steps is never cut: say how to resume or restart."""
    if not is_run(outdir):
        return
    with Reader(outdir) as r:
        last = max((int(r.metric(n, idx=-1)[0]) for n in r.metrics() if r.rows(n)), default=-1)
    if last >= 0:
        raise RunHasStepsError(
            f"run {outdir!r} already holds steps up to {last}; pass step={last + 1} to resume "
            f"after them, or step=0 to start over (which deletes them)"
        )


CLOCK_WALL = "clock/walltime"
"""The metric ``clock=True`` logs each step: seconds since the epoch (f64) as the step ends."""
CLOCK_ELAPSED = "clock/elapsed"
"""And the seconds of the run so far: summed over its writers, so a resume goes on from the
last step kept instead of starting over (the time the job was down is not counted)."""


class _Clock:
    """The two clock metrics of a writer opened at ``step`` of the run at ``outdir``."""

    def __init__(self, outdir: str, step: int) -> None:
        self.base = 0.0
        if step > 0 and is_run(outdir):
            with Reader(outdir) as r:
                if CLOCK_ELAPSED in r.metrics():
                    _, values = r.metric(CLOCK_ELAPSED, stop=step)
                    if len(values):
                        self.base = float(values[-1])
        self.start = time.monotonic()

    def now(self) -> dict[str, float]:
        return {
            CLOCK_WALL: time.time(),
            CLOCK_ELAPSED: self.base + (time.monotonic() - self.start),
        }
