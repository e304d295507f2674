"""Plots of a run's metrics: raw curves faint, EMA-smoothed curves on top."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._reader import Reader


def ema(values: np.ndarray[Any, Any], factor: float) -> np.ndarray[Any, Any]:
    """Debiased exponential moving average (NaNs carry the previous value)."""
    if not 0 <= factor < 1:
        raise ValueError(f"smoothing factor must be in [0, 1), got {factor}")
    out = np.empty(len(values), dtype=np.float64)
    acc, weight = 0.0, 0.0
    for i, v in enumerate(values.astype(np.float64)):
        if np.isfinite(v):
            acc = factor * acc + (1 - factor) * v
            weight = factor * weight + (1 - factor)
        out[i] = acc / weight if weight else np.nan
    return out


def plot_run(
    run: str, metrics: list[str], output: str, x: str = "step", smooth: float = 0.9
) -> None:
    """Write one panel per metric to `output`, against steps or another metric (e.g. walltime)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install 'chute[plot]'") from e
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 2.6 * len(metrics)), squeeze=False)
    with Reader(run) as r:
        for ax, name in zip(axes[:, 0], metrics, strict=True):
            if x == "step":
                steps, y = r.metric(name, dtype=np.float64)
                xs = steps.astype(np.float64)
            else:
                _steps, cols = r.table([x, name], on=x, dtype=np.float64)
                xs, y = cols[x], cols[name]
            ax.plot(xs, y, color="C0", alpha=0.3, linewidth=0.8, label="raw")
            if smooth > 0 and len(y):
                ax.plot(xs, ema(y, smooth), color="C0", linewidth=1.6, label=f"ema {smooth}")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
            ax.legend(loc="best", fontsize="small")
        axes[-1, 0].set_xlabel(x)
    fig.suptitle(run, fontsize="small")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
