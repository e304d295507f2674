"""Shared by bench/sampler.py and bench/loader.py: interleaved timing and the report."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def interleaved(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median of each contender's measurements, taking turns round by round (each round
    starting with the next contender) so that load from other processes on a shared machine
    falls on all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate who goes first
            samples[name].append(contenders[name]())
    return {name: statistics.median(values) for name, values in samples.items()}


def per_call(fn: Callable[[], object], calls: int) -> Callable[[], float]:
    """A measurement: seconds per call of ``fn`` over ``calls`` calls."""

    def measure() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls

    return measure


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def report(area: str, title: str, body: str) -> None:
    """Print the markdown and write it to bench/results/<area>.md."""
    text = f"# {title}\n\n{body}\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{area}.md").write_text(text)


def bar_plot(area: str, labels: Sequence[str], values: Sequence[float], ylabel: str) -> None:
    """bench/results/<area>.png, when matplotlib is installed (the bench extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    ax.bar(range(len(labels)), values)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{area}.png", dpi=120)
