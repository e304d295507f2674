"""PNG (or SVG, PDF...) plots comparing runs: one panel per metric, one colour per run."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from chute.errors import PlotError

from ._reader import Reader
from ._smooth import ema, thin

_PIXELS = 2000  # thinning budget per curve: far more points than the image has columns


def run_labels(runs: list[str]) -> list[str]:
    """Short distinct legend labels: each run's shortest trailing path that no other run
    shares (its base name when those differ).

    >>> run_labels(["exp/a/", "exp/b"]), run_labels(["/x/seed1/run", "/x/seed2/run"])
    (['a', 'b'], ['seed1/run', 'seed2/run'])
    """
    parts = [[p for p in r.rstrip("/").split("/") if p] or [r] for r in runs]
    depth = 1
    while True:
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels) or all(depth >= len(p) for p in parts):
            return labels
        depth += 1


def _curve(r: Reader, name: str, x: str, run: str) -> tuple[np.ndarray[Any, Any], ...]:
    if x == "step":
        steps, y = r.metric(name, dtype="storage")
        xs = steps.astype(np.float64)
    else:
        if x not in r.metrics():
            raise PlotError(f"run {run!r} has no metric {x!r} to use as the x axis")
        _steps, cols = r.table(dict.fromkeys([x, name]), on=x, dtype="storage")
        xs, y = cols[x], cols[name]
        if xs.dtype == object:
            raise PlotError(f"x metric {x!r} of run {run!r} holds text, not numbers")
    if y.dtype == object:
        raise PlotError(
            f"metric {name!r} of run {run!r} holds text, not numbers; it cannot be plotted"
        )
    xs = xs.astype(np.float64)
    if x != "step" and len(xs) > 1 and bool((np.diff(xs) < 0).any()):
        raise PlotError(
            f"x metric {x!r} of run {run!r} goes back (a clock reset by a resume?): the curve "
            "would fold over itself; plot against clock/elapsed (a writer's clock=True), "
            "which a resume continues, or against step"
        )
    return xs, y.astype(np.float64)


def plot_runs(
    runs: list[str],
    metrics: list[str],
    output: str,
    *,
    x: str = "step",
    smooth: float = 0.0,
    logy: bool = False,
    labels: list[str] | None = None,
) -> list[tuple[str, str]]:
    """Write one panel per metric with every run overlaid to exactly the file `output`.

    The format follows the file's extension (PNG when it has none). `smooth` in [0, 1)
    draws an EMA over faint raw curves; 0 (the default) draws the raw values only.
    `labels` name the runs in the legends (default: `run_labels`). Returns the (run,
    metric) pairs left out because that run lacks the metric; a metric
    no run has is an error, and so is a text metric.
    """
    if not runs or not metrics:
        raise PlotError("plot needs at least one run and one metric")
    if not 0 <= smooth < 1:
        raise PlotError(f"smoothing factor must be in [0, 1), got {smooth}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'chute[plot]'") from e
    fmt = os.path.splitext(output)[1][1:].lower() or "png"
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 2.8 * len(metrics)), squeeze=False)
    try:
        supported = fig.canvas.get_supported_filetypes()
        if fmt not in supported:
            raise PlotError(
                f"cannot write {output!r}: unknown image type {fmt!r} "
                f"(one of {', '.join(sorted(supported))})"
            )
        names = run_labels(runs) if labels is None else labels
        missing = _draw(axes[:, 0], runs, names, metrics, x=x, smooth=smooth, logy=logy)
        fig.tight_layout()
        _save(fig, output, fmt)
    finally:
        plt.close(fig)
    return missing


def _draw(
    axes: Any,
    runs: list[str],
    labels: list[str],
    metrics: list[str],
    *,
    x: str,
    smooth: float,
    logy: bool,
) -> list[tuple[str, str]]:
    missing = []
    readers = [Reader(run) for run in runs]
    try:
        for ax, name in zip(axes, metrics, strict=True):
            drawn = 0
            for i, (run, label, r) in enumerate(zip(runs, labels, readers, strict=True)):
                if name not in r.metrics():
                    missing.append((run, name))
                    continue
                xs, y = _curve(r, name, x, run)
                color = f"C{i % 10}"
                if smooth > 0 and len(y):
                    keep = thin(xs, y, _PIXELS)
                    ax.plot(xs[keep], y[keep], color=color, alpha=0.25, linewidth=0.8)
                    s = ema(y, smooth)[0]
                    keep = thin(xs, s, _PIXELS)
                    ax.plot(xs[keep], s[keep], color=color, linewidth=1.6, label=label)
                else:
                    keep = thin(xs, y, _PIXELS)
                    ax.plot(xs[keep], y[keep], color=color, linewidth=1.2, label=label)
                drawn += 1
            if not drawn:
                raise PlotError(f"no run has a metric {name!r} (`chute metrics ls RUN` lists them)")
            if logy:
                _log_axis(ax)
            ax.set_title(name + (f"  (EMA {smooth})" if smooth > 0 else ""), fontsize="medium")
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize="small")
        axes[-1].set_xlabel(x)
    finally:
        for r in readers:
            r.close()
    return missing


def _log_axis(ax: Any) -> None:
    """A log y axis whose ticks read as plain numbers (2.4, 0.05, 1e+06), not as
    ``2.4×10⁰``."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    low, high = ax.get_ylim()
    if high > 0 and low > 0 and high / low > 100:  # many decades: label the decades only
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _save(fig: Any, output: str, fmt: str) -> None:
    """Write to a temporary file beside `output`, then rename: never a torn or renamed file."""
    folder = os.path.dirname(os.path.abspath(output))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".chute-plot-", suffix="." + fmt)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, dpi=110)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        os.replace(tmp, output)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
