"""Index sampling: chute's Sampler against numpy and loaderx 0.7.3's sampler.

Per batch cost at 256 / 1024 / 8192 for each mode over a 1M index space, the cost of
seeking to step 100000 (then drawing that batch), the weighted sampler against numpy's
``Generator.choice(p=...)``, and the shard-window sampler against the cyclic one. Reported
as ratios, since this machine is shared and noisy.
Run: ``python bench/sampler.py [--plot]``; ``--smoke`` runs tiny sizes and writes nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from functools import partial

import numpy as np
from _steploader import bar_plot, interleaved, per_call, report, table
from loaderx._sampler import Sampler as LoaderxSampler

from chute import Sampler, ShardWindowSampler, WeightedSampler
from chute.loader import SamplerMode

LENGTH = 1 << 20
BATCHES = (256, 1024, 8192)
CALLS = 400_000  # indices drawn per measurement
MODES: dict[SamplerMode, int] = {"sequential": 0, "iid": 1, "cyclic": 2}  # -> loaderx code
SEEK_STEP = 100_000
SHARD_RECORDS = 1024  # the shard-window sampler's shards: 1024 of them over LENGTH
WINDOW = 4


def _draw_times(rounds: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for batch in BATCHES:
        calls = max(200, CALLS // batch)
        draw = partial(np.random.default_rng(0).integers, 0, LENGTH, batch)
        contenders = {"numpy": per_call(draw, calls)}
        for mode, code in MODES.items():
            ours = Sampler(LENGTH, batch, mode, seed=1)
            theirs = LoaderxSampler(LENGTH, batch, code, 1)
            contenders[f"chute {mode}"] = per_call(ours.__next__, calls)
            contenders[f"loaderx {mode}"] = per_call(theirs.next, calls)
        t = interleaved(contenders, rounds)
        for mode in MODES:
            c, lx = t[f"chute {mode}"], t[f"loaderx {mode}"]
            rows.append(
                [mode, batch, f"{c * 1e6:.2f}", f"{lx * 1e6:.2f}", f"{t['numpy'] * 1e6:.2f}",
                 f"**{lx / c:.2f}x**", f"{t['numpy'] / c:.2f}x"]
            )  # fmt: skip
    return rows


def _seek_times(rounds: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for mode, code in MODES.items():
        ours, theirs = Sampler(LENGTH, 256, mode, seed=1), LoaderxSampler(LENGTH, 256, code, 1)

        def chute_seek(s: Sampler = ours, step: int = SEEK_STEP) -> None:
            s.seek(step)
            next(s)

        def loaderx_seek(s: LoaderxSampler = theirs) -> None:
            s.seek(SEEK_STEP)
            s.next()

        far = Sampler(LENGTH, 256, mode, seed=1)
        t = interleaved(
            {
                "chute": per_call(chute_seek, 200),
                "chute far": per_call(partial(chute_seek, far, 10**15), 200),
                "loaderx": per_call(loaderx_seek, 3),
            },
            rounds,
        )
        rows.append(
            [mode, f"{t['chute'] * 1e6:.2f}", f"{t['chute far'] * 1e6:.2f}",
             f"{t['loaderx'] * 1e6:.1f}", f"**{t['loaderx'] / t['chute']:.0f}x**"]
        )  # fmt: skip
    return rows


def _weighted_times(rounds: int) -> list[list[object]]:
    weights = np.random.default_rng(0).pareto(1.5, LENGTH)  # skewed, as real weights are
    p = weights / weights.sum()
    rows: list[list[object]] = []
    for batch in BATCHES:
        calls = max(20, CALLS // batch // 10)
        ours = WeightedSampler(weights, batch, seed=1)
        far = WeightedSampler(weights, batch, seed=1)
        far.seek(10**15)
        rng = np.random.default_rng(1)
        t = interleaved(
            {
                "chute": per_call(ours.__next__, calls),
                "chute far": per_call(far.__next__, calls),
                "numpy": per_call(partial(rng.choice, LENGTH, batch, p=p), max(3, calls // 20)),
            },
            rounds,
        )
        rows.append(
            [batch, f"{t['chute'] * 1e6:.1f}", f"{t['chute far'] * 1e6:.1f}",
             f"{t['numpy'] * 1e6:.1f}", f"**{t['numpy'] / t['chute']:.1f}x**"]
        )  # fmt: skip
    return rows


def _window_times(rounds: int) -> list[list[object]]:
    """The shard-window sampler against cyclic: a batch, a batch at step 10^15, and the
    first batch of a cycle (which lays the cycle's shard order out)."""
    lengths = [SHARD_RECORDS] * (LENGTH // SHARD_RECORDS)
    rows: list[list[object]] = []
    for batch in BATCHES:
        calls = max(200, CALLS // batch)
        cyclic = Sampler(LENGTH, batch, "cyclic", seed=1)
        window = ShardWindowSampler(lengths, batch, window=WINDOW, seed=1)
        far = ShardWindowSampler(lengths, batch, window=WINDOW, seed=1)
        far.seek(10**15)
        fresh = ShardWindowSampler(lengths, batch, window=WINDOW, seed=1)
        cycles = iter(range(0, 1 << 60, fresh.steps_per_cycle))  # a new cycle every call

        def new_cycle(s: ShardWindowSampler = fresh, steps: Iterator[int] = cycles) -> None:
            s.indices(next(steps))

        t = interleaved(
            {
                "cyclic": per_call(cyclic.__next__, calls),
                "window": per_call(window.__next__, calls),
                "window far": per_call(far.__next__, calls),
                "new cycle": per_call(new_cycle, max(20, calls // 10)),
            },
            rounds,
        )
        rows.append(
            [batch, f"{t['cyclic'] * 1e6:.2f}", f"{t['window'] * 1e6:.2f}",
             f"{t['window far'] * 1e6:.2f}", f"{t['new cycle'] * 1e6:.1f}",
             f"{t['window'] / t['cyclic']:.2f}x"]
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--plot", action="store_true", help="write bench/results/sampler.png")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; prints, writes nothing")
    args = parser.parse_args()
    if args.smoke:
        global LENGTH, BATCHES, CALLS
        LENGTH, BATCHES, CALLS, args.rounds = 4096, (64,), 2000, 1
    draws = _draw_times(args.rounds)
    seeks = _seek_times(args.rounds)
    weighted = _weighted_times(args.rounds)
    windows = _window_times(args.rounds)
    body = (
        f"Index space {LENGTH:,}; median of {args.rounds} interleaved rounds. µs per batch; "
        "the ratio columns are how many times faster chute is.\n\n"
        + table(
            ["mode", "batch", "chute µs", "loaderx µs", "numpy integers µs",
             "vs loaderx", "vs numpy"],
            draws,
        )
        + f"\n\nSeek to step {SEEK_STEP:,} and draw its batch (batch 256); "
        "'chute @1e15' seeks to step 10^15 to show the cost does not grow with the step.\n\n"
        + table(["mode", "chute µs", "chute @1e15 µs", "loaderx µs", "vs loaderx"], seeks)
        + "\n\nWeighted sampling with replacement over the same index space (Pareto weights): "
        "chute's `WeightedSampler` (counter-based, so drawing at step 10^15 costs the same) "
        "against numpy's `Generator.choice(p=...)`, which rebuilds its cumulative table on "
        "every call.\n\n"
        + table(["batch", "chute µs", "chute @1e15 µs", "numpy choice µs", "vs numpy"], weighted)
        + f"\n\nThe shard-window sampler (`ShardWindowSampler`, window={WINDOW}, "
        f"{LENGTH // SHARD_RECORDS} shards of {SHARD_RECORDS}) against cyclic over the same "
        "index space: a batch, a batch at step 10^15, and the first batch of a cycle, which "
        "lays out the cycle's shard order (O(shards), once per cycle). 'cost' is window over "
        "cyclic per batch (lower is better).\n\n"
        + table(["batch", "cyclic µs", "window µs", "window @1e15 µs", "new cycle µs",
                 "cost"], windows)
    )  # fmt: skip
    if args.smoke:
        print(body)
        return
    report("sampler", "Sampler benchmark", body)
    if args.plot:
        labels = [f"{r[0]} {r[1]}" for r in draws]
        bar_plot("sampler", labels, [float(str(r[5]).strip("*x")) for r in draws], "x loaderx")


if __name__ == "__main__":
    main()
