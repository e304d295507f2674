"""`SummaryWriter`: torch's ``torch.utils.tensorboard.SummaryWriter`` calls, writing a chute
run, so logging code switches with an import change."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from chute._util.closing import Closing
from chute.errors import StepOrderError

from ._direct import DirectWriter
from ._reader import Reader
from ._source import is_run

__all__ = ["SummaryWriter"]

#: What torch's SummaryWriter records that a metric run does not: calling one is an error
#: that says so, rather than a value silently dropped.
_NOT_KEPT = (
    "add_histogram", "add_histogram_raw", "add_image", "add_images", "add_image_with_boxes",
    "add_figure", "add_video", "add_audio", "add_graph", "add_embedding", "add_pr_curve",
    "add_pr_curve_raw", "add_custom_scalars", "add_custom_scalars_multilinechart",
    "add_custom_scalars_marginchart", "add_mesh", "add_onnx_graph",
)  # fmt: skip


def _default_log_dir(comment: str) -> str:
    """torch's default: ``runs/<month><day>_<H>-<M>-<S>_<host><comment>``."""
    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")


class SummaryWriter(Closing):
    """Scalars, text and hyperparameters as torch's SummaryWriter logs them, into a chute
    metric run (a `DirectWriter` at ``log_dir``, read with `chute.metrics.Reader`, plotted
    and served as any run).

    A run is logged in step order, where TensorBoard's event files take any order: a value
    for a later ``global_step`` ends the steps before it, and one for an earlier step is a
    `StepOrderError` (a ValueError). ``global_step=None`` logs at the current step.
    ``add_scalars("acc", {"a": ...})`` logs ``acc/a``; ``add_text`` logs a text metric;
    ``add_hparams`` merges the hyperparameters into the run's config and logs its metrics.
    Each step also gets ``clock/walltime`` and ``clock/elapsed`` (``clock=False`` turns
    them off; a call's own ``walltime=`` is not kept). Opening an existing run continues
    after its last step; ``purge_step=N`` starts over from step N, dropping the steps from
    N on, as TensorBoard's purge does. Images, histograms and the other kinds a metric run
    does not hold raise NotImplementedError.

    >>> import tempfile
    >>> from chute.metrics import Reader, SummaryWriter
    >>> run = tempfile.mkdtemp()
    >>> with SummaryWriter(run) as writer:  # was: from torch.utils.tensorboard import ...
    ...     for step in range(3):
    ...         writer.add_scalar("loss/train", 1.0 / (step + 1), step)
    ...         writer.add_scalars("acc", {"top1": 0.5, "top5": 0.9}, step)
    ...     writer.add_hparams({"lr": 0.1}, {"hp/final": 0.3})
    >>> with Reader(run) as r:
    ...     r.metric("loss/train")[1].tolist(), r.metric("acc/top5")[0].tolist(), r.config()
    ([1.0, 0.5, 0.3333333333333333], [0, 1, 2], {'lr': 0.1})
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        *,
        clock: bool = True,
    ) -> None:
        self.log_dir = os.fspath(log_dir) if log_dir is not None else _default_log_dir(comment)
        step = purge_step
        if step is None and is_run(self.log_dir):
            with Reader(self.log_dir) as r:
                last = max((int(r.metric(n, idx=-1)[0]) for n in r.metrics() if r.rows(n)),
                           default=-1)  # fmt: skip
            step = last + 1
        self._writer = DirectWriter(self.log_dir, step=step or 0, clock=clock)
        self._hparams: dict[str, Any] = {}
        self._pending = False  # the current step holds values

    def get_logdir(self) -> str:
        """The run's folder."""
        return self.log_dir

    def _at(self, global_step: int | None) -> None:
        """Make ``global_step`` the writer's step (ending the steps before it)."""
        if global_step is None:
            return
        current = self._writer.step
        step = int(global_step)
        if step < current:
            raise StepOrderError(
                f"global_step {step} comes after step {current - 1 if self._pending else current}"
                " was logged: a chute run is logged in step order (TensorBoard's event files "
                "take any); log steps in order, or reopen the writer with purge_step="
                f"{step} to rewrite from there"
            )
        if step > current:
            if self._pending:
                self._writer.end_step()
                self._pending = False
            if step > self._writer.step:
                self._writer.step = step

    def _write(self, values: Mapping[str, Any], global_step: int | None) -> None:
        self._at(global_step)
        self._writer.write(dict(values))
        self._pending = True

    def add_scalar(
        self,
        tag: str,
        scalar_value: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        """Log ``scalar_value`` (a number, or a 0-d tensor or array) as metric ``tag``."""
        self._write({tag: scalar_value}, global_step)

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: Mapping[str, Any],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log each value of ``tag_scalar_dict`` as metric ``main_tag/key``."""
        self._write({f"{main_tag}/{k}": v for k, v in tag_scalar_dict.items()}, global_step)

    def add_text(
        self,
        tag: str,
        text_string: str,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        """Log ``text_string`` as text metric ``tag``."""
        self._write({tag: str(text_string)}, global_step)

    def add_hparams(
        self,
        hparam_dict: Mapping[str, Any],
        metric_dict: Mapping[str, Any],
        hparam_domain_discrete: Mapping[str, list[Any]] | None = None,
        run_name: str | None = None,
        global_step: int | None = None,
    ) -> None:
        """Merge ``hparam_dict`` into the run's config (config.json) and log ``metric_dict``
        at ``global_step`` (the current step by default)."""
        self._hparams.update(hparam_dict)
        self._writer.set_config(self._hparams)
        if metric_dict:
            self._write(metric_dict, global_step)

    def flush(self) -> None:
        """Make what was logged durable (the current step stays open for more values)."""
        self._writer.flush()

    def close(self) -> None:
        """End the current step and release the run; it stays open for a later writer."""
        if self._pending:
            self._writer.end_step()
            self._pending = False
        self._writer.close()

    def __getattr__(self, name: str) -> Any:
        if name in _NOT_KEPT:
            raise NotImplementedError(
                f"SummaryWriter.{name}: a chute metric run keeps scalars, text and "
                "hyperparameters; log this kind of data elsewhere"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
