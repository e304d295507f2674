"""DirectWriter: every value goes straight to its column file."""

from __future__ import annotations

import operator
import os
import struct

from . import _config
from ._columns import encode_values
from ._dtypes import Value
from ._streaming import StreamingWriter

_STEP = struct.Struct("<I")


class DirectWriter(StreamingWriter):
    """Append each value to its column as it is written; for fast local disks.

    A completed step costs two small appends per metric and no thread hand-off,
    so it is the fastest writer; the manifest is rewritten only on steps that add
    a metric or widen a dtype. `write_threads` is accepted for compatibility with
    Plättli and must be a non-negative int; appends are synchronous.
    """

    def __init__(
        self,
        outdir: str | os.PathLike[str],
        step: int = 0,
        write_threads: int = 16,
        config: _config.ConfigArg = "config.json",
        allow_resume_finalized: bool = False,
    ) -> None:
        if isinstance(write_threads, bool) or operator.index(write_threads) < 0:
            raise ValueError(f"write_threads must be a non-negative int, got {write_threads!r}")
        super().__init__(outdir, step, config, allow_resume_finalized)
        self._dirty = False

    def _apply(self, checked: list[tuple[str, Value, str]]) -> None:
        store, step = self._store, self._step
        packed = _STEP.pack(step)
        for name, val, code in checked:
            col = store.cols.get(name)
            if col is None:
                store.add(name, code)
                self._dirty = True
            elif col.code != code:
                store.convert(name, code)
            store.append_raw(name, encode_values(code, (val,)), packed, 1, step)

    def end_step(self) -> None:
        """Publish the manifest if this step added metrics, then advance the step."""
        self._check_open()
        if self._dirty:
            self._store.flush_manifest()
            self._dirty = False
        self._step += 1

    def _drain(self, final: bool) -> None:
        if self._dirty or final:
            self._store.flush_manifest()
            self._dirty = False
