"""DirectWriter: every value goes straight to its column file."""

from __future__ import annotations

import os
import struct

from chute._util.checks import check_int

from . import _config
from ._columns import encode_values
from ._dtypes import Value
from ._streaming import StreamingWriter

_STEP = struct.Struct("<I")


class DirectWriter(StreamingWriter):
    """Append each value to its column as it is written; for fast local disks.

    A row that keeps its column's step cadence costs one small append and no
    thread hand-off. Rows that need the manifest to change first (a new metric, a
    wider dtype, a new cadence) wait for `end_step`, which publishes the manifest
    once for all of them and then appends them. `write_threads` is accepted for
    compatibility with Plättli and must be a non-negative int; appends are synchronous.
    ``clock=True`` logs ``clock/walltime`` and ``clock/elapsed`` at every step (see
    `chute.metrics` and docs/metrics.md).

    >>> import tempfile
    >>> from chute.metrics import DirectWriter, Reader
    >>> run = tempfile.mkdtemp()
    >>> with DirectWriter(run, config={"lr": 0.1}) as w:
    ...     for loss in (0.9, 0.5, 0.4):
    ...         w.write(loss=loss); w.end_step()
    >>> w = DirectWriter(run, step=2)  # resume at step 2 (a checkpoint's): step 2 is cut
    >>> w.write(loss=0.45, note="resumed"); w.end_step(); w.finish()
    >>> with Reader(run) as r:  # the finished run: metrics.plattli
    ...     r.metric("loss")[1].tolist(), r.metric("note")[1].tolist()
    ([0.9, 0.5, 0.45], ['resumed'])
    """

    def __init__(
        self,
        outdir: str | os.PathLike[str],
        step: int | None = None,
        write_threads: int = 16,
        config: _config.ConfigArg = "config.json",
        allow_resume_finalized: bool = False,
        *,
        clock: bool = False,
    ) -> None:
        check_int("write_threads", write_threads)
        super().__init__(outdir, step, config, allow_resume_finalized, clock)
        self._deferred: list[tuple[str, Value, str]] = []

    def _apply(self, checked: list[tuple[str, Value, str]]) -> None:
        store, step = self._store, self._step
        cols = store.cols
        packed = b""
        for name, val, code in checked:
            col = cols.get(name)
            if (
                col is None
                or col.code != code
                or store.changes_layout(name, step)
                or col.mono.changes(val.num)  # the manifest's flag goes first
            ):
                self._deferred.append((name, val, code))
                continue
            if col.explicit and not packed:
                packed = _STEP.pack(step)
            store.append_raw(name, encode_values(code, (val,)), packed, (step,))
            col.mono.add(val.num)

    def end_step(self) -> None:
        """Publish rows that needed a manifest change, then advance the step."""
        self._check_open()
        self._tick()
        if self._deferred:
            self._publish()
        self._step += 1

    def _publish(self) -> None:
        step = [self._step]
        self._store.append_many([(n, step, [v], code) for n, v, code in self._deferred])
        self._deferred = []

    def _drain(self, final: bool) -> None:
        if self._deferred:
            self._publish()
        self._store.flush_manifest()
