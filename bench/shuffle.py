"""Shuffle quality against working set: what the shard-window sampler gives up, and saves.

A labelled dataset laid out as real data often is: records sorted by label, cut into 100
shards of 1000, so each shard holds a few of 50 classes (of uneven sizes); then the same
records shuffled once before sharding. For one
epoch of batches of 256 from each sampler (iid, cyclic, and the shard-window sampler at
window 1 to 16), per batch: how many distinct labels it holds, the KL divergence of its
label histogram from the dataset's, and the chance that two of its records share a label
(the dataset's own is the floor); then how many shards a batch touches, and how many shard
fetches the epoch costs a host whose cache holds K shards, least recently used evicted
(1.00x: each shard fetched once).

Counts, not timings: deterministic, so it may run on any machine at any time.
Run: ``python bench/shuffle.py [--plot]``; ``--smoke`` runs a small dataset and writes nothing.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from _charts import ratio_chart
from _steploader import RESULTS, report, table

from chute import Sampler, ShardWindowSampler
from chute.loader import SamplerLike

SHARDS, SHARD_RECORDS, CLASSES, BATCH = 100, 1000, 50, 256
WINDOWS = (1, 2, 4, 8, 16)
CACHES = (4, 8, 16, 32)  # shards a host's cache holds
SEED = 0


@dataclass(frozen=True)
class Layout:
    labels: npt.NDArray[np.int64]  # the label of each record, sorted
    shard_of: npt.NDArray[np.int64]  # the shard of each record
    lengths: list[int]


def sorted_layout(shards: int, records: int, classes: int) -> Layout:
    """Records sorted by label, classes of uneven sizes (a seeded gamma draw), in shards of
    ``records`` consecutive records."""
    total = shards * records
    share = np.random.default_rng(SEED).gamma(2.0, size=classes)
    sizes = np.maximum(1, np.floor(share / share.sum() * total)).astype(np.int64)
    sizes[-1] += total - sizes.sum()
    labels = np.repeat(np.arange(classes), sizes)
    return Layout(labels, np.arange(total) // records, [records] * shards)


@dataclass
class Row:
    name: str
    labels: float  # distinct labels per batch, mean
    kl: float  # KL(batch histogram || dataset histogram), nats, mean
    agree: float  # P(two records of a batch share a label), mean
    shards: float  # shards per batch, mean
    widest: int  # shards per batch, max
    fetches: dict[int, int]  # cache size -> shard fetches in the epoch


def _lru_fetches(batches: list[npt.NDArray[np.int64]], size: int) -> int:
    """Shard fetches of a cache of ``size`` shards, least recently used evicted, serving
    ``batches`` (each the shards one batch reads, in the order it reads them)."""
    cache: OrderedDict[int, None] = OrderedDict()
    fetches = 0
    for shards in batches:
        for shard in shards.tolist():
            if shard in cache:
                cache.move_to_end(shard)
                continue
            fetches += 1
            cache[shard] = None
            if len(cache) > size:
                cache.popitem(last=False)
    return fetches


def measure(name: str, sampler: SamplerLike, layout: Layout, steps: int) -> Row:
    q = np.bincount(layout.labels, minlength=CLASSES) / layout.labels.size
    distinct, kl, agree, needed = [], [], [], []
    for step in range(steps):
        records = sampler.indices(step).astype(np.int64)
        counts = np.bincount(layout.labels[records], minlength=CLASSES)
        p = counts / counts.sum()
        seen = p > 0
        distinct.append(int(seen.sum()))
        kl.append(float((p[seen] * np.log(p[seen] / q[seen])).sum()))
        agree.append(float((counts * (counts - 1)).sum() / (records.size * (records.size - 1))))
        shards = layout.shard_of[records]
        _, first = np.unique(shards, return_index=True)
        needed.append(shards[np.sort(first)])  # in the order the batch first reads them
    return Row(
        name,
        float(np.mean(distinct)),
        float(np.mean(kl)),
        float(np.mean(agree)),
        float(np.mean([s.size for s in needed])),
        max(s.size for s in needed),
        {k: _lru_fetches(needed, k) for k in CACHES},
    )


def _table(layout: Layout, batch: int) -> tuple[list[Row], str]:
    """One epoch of each sampler over ``layout``, measured, and its markdown table."""
    n = layout.labels.size
    steps = n // batch  # one epoch: a cycle of the cyclic and window samplers
    samplers: dict[str, SamplerLike] = {
        "iid": Sampler(n, batch, "iid", SEED),
        "cyclic": Sampler(n, batch, "cyclic", SEED),
    }
    for w in WINDOWS:
        samplers[f"window={w}"] = ShardWindowSampler(layout.lengths, batch, window=w, seed=SEED)
    rows = [measure(name, s, layout, steps) for name, s in samplers.items()]
    shards = len(layout.lengths)
    mixed = [np.unique(layout.labels[layout.shard_of == i]).size for i in range(shards)]
    text = (
        f"{n:,} records in {shards} shards of {n // shards:,}: each shard holds "
        f"{min(mixed)}-{max(mixed)} classes ({np.mean(mixed):.1f} on average); one epoch is "
        f"{steps} batches of {batch}.\n\n"
        + table(
            ["sampler", "labels", "KL", "same label", "shards",
             *(f"fetches K={k}" for k in CACHES)],
            [[r.name, f"{r.labels:.1f}", f"{r.kl:.3f}", f"{r.agree:.4f}",
              f"{r.shards:.1f} / {r.widest}",
              *(f"{r.fetches[k] / shards:.2f}x" for k in CACHES)]
             for r in rows],
        )
    )  # fmt: skip
    return rows, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plot", action="store_true", help="write bench/results/shuffle.png")
    parser.add_argument("--smoke", action="store_true", help="small sizes; prints, writes nothing")
    args = parser.parse_args()
    shards, records, batch = (20, 200, 64) if args.smoke else (SHARDS, SHARD_RECORDS, BATCH)
    layout = sorted_layout(shards, records, CLASSES)
    rows, by_label = _table(layout, batch)
    order = np.random.default_rng(SEED).permutation(layout.labels.size)
    _, mixed = _table(Layout(layout.labels[order], layout.shard_of, layout.lengths), batch)
    floor = float(np.square(np.bincount(layout.labels) / layout.labels.size).sum())
    body = (
        f"{CLASSES} classes of uneven sizes; seed {SEED}. Columns: labels, the distinct labels "
        "of a batch (mean); KL, the divergence of a batch's label histogram from the "
        "dataset's (nats, mean; iid is the floor for a batch of this size); same label, the "
        "chance that two records of a batch share a label (the dataset's own: "
        f"{floor:.4f}); shards, the shards one batch reads (mean / max); fetches, the shard "
        "fetches of one epoch by a host whose cache holds K shards, least recently used "
        "evicted, as a multiple of the shard count (1.00x: each shard fetched once). The "
        "simulated host reads a batch's shards in turn, so at a window boundary it reads the "
        "end of one window, then the start of the next; a host that holds all of a batch's "
        "shards at once needs `2 * window` of them.\n\n"
        "## Records sorted by label, as real data often is\n\n"
        f"{by_label}\n\n"
        "A window batch mixes the classes of `window` shards, not of the dataset: that is the "
        "price of fetching each shard once per epoch, where iid and cyclic batches each read "
        "most of the shards, so a cache smaller than the dataset refetches shards for nearly "
        "every batch. Choose the window from the cache a host can hold.\n\n"
        "## The same records shuffled once before sharding\n\n"
        f"{mixed}\n\n"
        "Shards that each mix the classes make every window batch as diverse as an iid one, "
        "at the same one fetch per shard: where the data allows, shuffle once when writing.\n"
    )
    if args.smoke:
        print(body)
        return
    report("shuffle", "Shuffle quality against working set", body)
    if args.plot:
        k = CACHES[1]
        ratio_chart(
            RESULTS / "shuffle.png",
            f"Records sorted by label: shuffle quality and shard fetches (cache of {k} shards)",
            [r.name for r in rows],
            {
                "distinct labels per batch": [r.labels for r in rows],
                "KL from the dataset's labels": [r.kl for r in rows],
                f"shard fetches per epoch, K={k}": [float(r.fetches[k]) for r in rows],
            },
            lower_is_better=["KL from the dataset's labels", f"shard fetches per epoch, K={k}"],
            ours="",
            baseline="iid",
        )


if __name__ == "__main__":
    main()
