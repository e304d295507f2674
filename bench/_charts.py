"""One chart per benchmark table: every contender as a ratio to the strongest peer.

For each metric of a table the strongest peer is the best non-chute contender on that
metric; a bar is the contender's value over the peer's (inverted for metrics where lower is
better), so longer is better everywhere and 1.0 is the line to beat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def ratio_chart(
    path: Path,
    title: str,
    names: Sequence[str],
    metrics: Mapping[str, Sequence[float]],
    lower_is_better: Sequence[str] = (),
    ours: str = "chute",
    baseline: str | None = None,
) -> None:
    """Write ``path`` (PNG): a panel per metric, a bar per contender, ratio to the best peer
    (or to the contender named ``baseline``, for a table of chute against itself)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart")
        return
    peers = [i for i, n in enumerate(names) if not n.startswith(ours)]
    fig, axes = plt.subplots(
        1,
        len(metrics),
        figsize=(max(7.0, 4.2 * len(metrics)), 1.2 + 0.32 * len(names)),
        squeeze=False,
    )
    for ax, (metric, values) in zip(axes[0], metrics.items(), strict=True):
        low = metric in lower_is_better
        if baseline is not None:
            best = values[list(names).index(baseline)]
        else:
            best = (min if low else max)(values[i] for i in peers)
        ratios = [(best / v if low else v / best) if v > 0 else 0.0 for v in values]
        colors = ["tab:blue" if n.startswith(ours) else "tab:gray" for n in names]
        ax.barh(names, ratios, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        for y, r in enumerate(ratios):
            ax.text(r, y, f" {r:.2f}x", va="center", fontsize=7)
        ax.set_title(f"{metric}{' (lower is better)' if low else ''}", fontsize=9)
        against = "the strongest peer" if baseline is None else baseline
        ax.set_xlabel(f"x {against} (higher is better)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(ratios) * 1.25 or 1)
    for ax in axes[0][1:]:
        ax.set_yticklabels([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
