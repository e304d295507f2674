"""BulkWriter: a whole run buffered in memory, written as a finished export once."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from chute.errors import WriterClosedError

from . import _config
from . import _format as F
from ._archive import zip_run
from ._columns import ColumnStore
from ._dtypes import Value
from ._lock import RunLock
from ._writer import Schema, Steps, check_overrides, check_step, run_paths


class BulkWriter(Steps):
    """Buffer every metric in memory; `finish()` writes, optimizes and publishes the run.

    The export is built in a staging folder and swapped in, so a crash never
    leaves a half-written run; an existing run is only replaced with `overwrite=True`.

    >>> import os, tempfile
    >>> from chute.metrics import BulkWriter, Reader
    >>> run = tempfile.mkdtemp()
    >>> w = BulkWriter(run, config={"source": "eval.csv"})
    >>> for acc in (0.5, 0.7, 0.8):
    ...     w.write(acc=acc); w.end_step()
    >>> w.finish()  # nothing is on disk before this
    >>> with Reader(run) as r:
    ...     os.listdir(run), r.config(), r.finished
    (['metrics.plattli'], {'source': 'eval.csv'}, True)
    """

    def __init__(
        self,
        outdir: str | os.PathLike[str],
        step: int = 0,
        config: _config.ConfigArg = "config.json",
        overwrite: bool = False,
    ) -> None:
        self._step = check_step(step)
        self._config = _config.freeze(config)
        self._outdir, self._pdir, self._zip = run_paths(outdir)
        self._overwrite = bool(overwrite)
        self._check_target()
        self._schema = Schema(self._pdir)
        self._columns: dict[str, tuple[list[int], list[Value]]] = {}
        self._finished = False

    def _check_target(self) -> None:
        if not self._overwrite and (os.path.exists(self._pdir) or os.path.exists(self._zip)):
            raise FileExistsError(f"{self._outdir} already holds a run; pass overwrite=True")

    def write(self, metrics: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        """Buffer metrics at the current step (same rules as the streaming writers)."""
        for name, val, _code in self._accept(metrics, kwargs):
            steps, vals = self._columns.setdefault(name, ([], []))
            steps.append(self._step)
            vals.append(val)

    def end_step(self) -> None:
        """Advance to the next step."""
        self._check_open()
        self._step += 1

    def set_config(self, config: Mapping[str, Any]) -> None:
        """Replace the config written at `finish()`."""
        self._config = _config.freeze_dict(config)

    def finish(
        self,
        optimize: bool = True,
        zip: bool = True,
        config_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """Write the run to a staging folder, then publish it as `plattli/` or `metrics.plattli`."""
        self._check_open()
        overrides = check_overrides(config_overrides)
        self._check_target()
        os.makedirs(self._outdir, exist_ok=True)
        lock = RunLock(self._outdir, lambda: None)
        try:
            self._publish(optimize, zip, overrides)
        finally:
            lock.release()
        self._finished = True

    def _publish(self, optimize: bool, zip: bool, overrides: dict[str, Any]) -> None:
        staging = os.path.join(self._outdir, ".plattli-staging" + F.TMP_SUFFIX)
        if os.path.exists(staging):
            shutil.rmtree(staging)
        store = ColumnStore(staging)
        os.makedirs(staging)
        store.append_many(
            [(n, s, v, self._schema.metas[n].code) for n, (s, v) in self._columns.items()]
        )
        if optimize:
            store.optimize()
        else:
            store.seal()
        self._stage_config(staging)
        if overrides:
            _config.override(staging, overrides)
        if zip:
            zip_run(staging, self._zip)
            _remove(self._pdir)
        else:
            retired = self._pdir + ".old" + F.TMP_SUFFIX
            _remove(retired)
            if os.path.exists(self._pdir):
                os.replace(self._pdir, retired)
            os.replace(staging, self._pdir)
            _remove(retired)
            _remove(self._zip)

    def _stage_config(self, staging: str) -> None:
        """Config into staging; a linked config inside the output being replaced is copied."""
        frozen = self._config
        if isinstance(frozen, str):
            target = os.path.realpath(os.path.join(self._outdir, frozen))
            inside_old = target.startswith(os.path.realpath(self._pdir) + os.sep)
            if inside_old and os.path.isfile(target):
                with open(target, "rb") as f:
                    frozen = f.read()
        _config.apply(frozen, self._outdir, staging)

    def _check_open(self) -> None:
        if self._finished:
            raise WriterClosedError(f"BulkWriter of {self._outdir!r} is already finished")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
