"""The full input pipeline (sample, gather, collate, hand over), batch 256, end to end.

Workload: 20000 images of 3x64x64 uint8, smooth ramps plus noise (the store benchmark's
``structured``, from bench/store.py), plus an int32 label stream. Contenders, each
reading what it is built for: chute (zstd and raw stores), loaderx 0.7.3's DataLoader
(zstd and raw stores), torch's DataLoader over a memory-mapped .npy (2 worker processes,
persistent), a plain numpy loop over the same .npy, and, when installed (bench extra), Grain's
DataLoader over ArrayRecord files (group_size:1, raw and zstd), MosaicML's StreamingDataLoader
over MDS shards (raw and zstd) and LitData's StreamingDataLoader (records of image + label;
the formats' adapters are in bench/_peers.py). Everyone gets 2 threads or workers
(this machine has 2 cores). Reported as ratios of batches/s; run:
``python bench/loader.py [--plot]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import _peers
import loaderx
import numpy as np
from _charts import ratio_chart
from _steploader import RESULTS, interleaved, report, table
from store import structured  # the store benchmark's workload

import chute

N, SHAPE, BATCH, WORKERS, WARMUP = 20_000, (3, 64, 64), 256, 2, 20


Session = tuple[Iterator[Any], Callable[[], None]]
"""A started loader: its batch iterator and how to stop it."""


def _endless(make_epoch: Callable[[], Iterator[Any]]) -> Generator[Any, None, None]:
    while True:
        yield from make_epoch()


def _chute(root: Path, codec: str) -> Session:
    streams = {
        "data": chute.Dataset(root / f"c-{codec}-x.zr"),
        "label": chute.Dataset(root / f"c-{codec}-y.zr"),
    }
    dl = chute.DataLoader(streams, BATCH, num_threads=WORKERS)

    def close() -> None:
        dl.close()
        for ds in streams.values():
            ds.close()

    return dl, close


def _gather_alone(root: Path, codec: str) -> Session:
    """The bare gather the loader runs: the same random batches read on the calling thread,
    no loader (what the loader's overhead is measured against)."""
    x, y = chute.Dataset(root / f"c-{codec}-x.zr"), chute.Dataset(root / f"c-{codec}-y.zr")
    rng = np.random.default_rng(0)

    def batches() -> Iterator[dict[str, np.ndarray]]:
        while True:
            idx = rng.integers(0, len(x), BATCH)
            yield {"data": x.__getitems__(idx), "label": y.__getitems__(idx)}

    def close() -> None:
        x.close()
        y.close()

    return batches(), close


def _loaderx(root: Path, codec: str) -> Session:
    streams = {
        "data": loaderx.Dataset(str(root / f"l-{codec}-x.zr")),
        "label": loaderx.Dataset(str(root / f"l-{codec}-y.zr")),
    }
    dl = loaderx.DataLoader(streams, num_workers=WORKERS, batch_size=BATCH, mode=2)
    return iter(dl), dl.close


class _MemmapPairs:
    """torch map-style dataset: one (image, label) sample per index from the memory maps."""

    def __init__(self, root: Path) -> None:
        self.images = np.load(root / "images.npy", mmap_mode="r")
        self.labels = np.load(root / "labels.npy", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.images[i]), np.array(self.labels[i])


def _torch(root: Path) -> Session:
    import torch.utils.data as tud

    dl = tud.DataLoader(
        _MemmapPairs(root),
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        persistent_workers=True,
        drop_last=True,
    )
    epochs = _endless(lambda: iter(dl))
    return epochs, epochs.close  # the workers stop when the loader is collected


def _numpy(root: Path) -> Session:
    images = np.load(root / "images.npy", mmap_mode="r")
    labels = np.load(root / "labels.npy", mmap_mode="r")

    def epoch() -> Iterator[dict[str, np.ndarray]]:
        order = np.random.default_rng().permutation(len(labels))
        for k in range(len(order) // BATCH):
            idx = order[k * BATCH : (k + 1) * BATCH]
            yield {"data": images[idx], "label": labels[idx]}

    batches = _endless(epoch)
    return batches, batches.close


def _grain(root: Path, codec: str, like: dict[str, Any]) -> Session:
    it = _peers.grain_loader(root / f"ar-{codec}.array_record", like, BATCH, WORKERS)
    return it, lambda: None  # Grain stops its workers when the iterator is collected


def _mds(root: Path, codec: str, like: dict[str, Any]) -> Session:
    from streaming import StreamingDataLoader

    ds = _peers.mds_dataset(root / f"mds-{codec}", shuffle=True, batch=BATCH)
    dl = StreamingDataLoader(
        ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_peers.collate(like),
        persistent_workers=True, drop_last=True,
    )  # fmt: skip
    epochs = _endless(lambda: iter(dl))
    return epochs, epochs.close


def _litdata(root: Path, like: dict[str, Any]) -> Session:
    import litdata

    ds = litdata.StreamingDataset(input_dir=str(root / "lit-raw"), shuffle=True, seed=0)
    dl = litdata.StreamingDataLoader(
        ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_peers.collate(like),
        drop_last=True,
    )  # fmt: skip
    epochs = _endless(lambda: iter(dl))
    return epochs, epochs.close


def _peer_starts(root: Path, columns: _peers.Columns) -> dict[str, Callable[[], Session]]:
    """Write the installed peers' files; their loaders, by name."""
    like = _peers.like_of(columns)
    starts: dict[str, Callable[[], Session]] = {}
    for codec in ("raw", "zstd"):
        if _peers.available("grain") and _peers.available("array_record"):
            _peers.arrayrecord_write(root / f"ar-{codec}.array_record", columns, codec == "zstd")
            starts[f"grain-arrayrecord-{codec}"] = partial(_grain, root, codec, like)
        if _peers.available("streaming"):
            _peers.mds_write(root / f"mds-{codec}", columns, codec == "zstd")
            starts[f"mds-{codec}"] = partial(_mds, root, codec, like)
    if _peers.available("litdata"):  # its zstd chunks do not read back from a local folder
        _peers.litdata_write(root / "lit-raw", columns)
        starts["litdata-raw"] = partial(_litdata, root, like)
    return starts


def _write_all(root: Path, images: np.ndarray, labels: np.ndarray) -> None:
    np.save(root / "images.npy", images)
    np.save(root / "labels.npy", labels)
    for codec in ("zstd", "raw"):
        for name, array in (("x", images), ("y", labels)):
            chute.write_dataset(root / f"c-{codec}-{name}.zr", array, codec=codec).close()
            loaderx.write_dataset(str(root / f"l-{codec}-{name}.zr"), array, codec=codec)


def _session(start: Callable[[], Session], batches: int) -> Callable[[], float]:
    """A measurement: start the loader, warm it up, time ``batches`` batches, stop it.

    One loader runs at a time, so no contender's background threads tax another's turn.
    """

    def measure() -> float:
        it, close = start()
        try:
            for _ in range(WARMUP):
                next(it)
            begin = time.perf_counter()
            for _ in range(batches):
                batch = next(it)
                first = batch["data"] if isinstance(batch, dict) else batch[0]
                assert len(first) == BATCH
            return batches / (time.perf_counter() - begin)
        finally:
            close()

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--plot", action="store_true", help="write bench/results/loader.png")
    parser.add_argument("--workdir", default=None, help="where to write the data (temp dir)")
    parser.add_argument("--records", type=int, default=N, help="records (smoke runs: fewer)")
    args = parser.parse_args()
    images = structured(args.records)
    labels = np.random.default_rng(1).integers(0, 1000, args.records).astype(np.int32)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        _write_all(root, images, labels)
        peers = _peer_starts(root, {"data": images, "label": labels})
        os.sync()  # no write-back of the fresh stores during anyone's turn
        starts: dict[str, Callable[[], Session]] = {
            "chute-zstd": partial(_chute, root, "zstd"),
            "chute-raw": partial(_chute, root, "raw"),
            "chute-zstd gather alone": partial(_gather_alone, root, "zstd"),
            "loaderx-zstd": partial(_loaderx, root, "zstd"),
            "loaderx-raw": partial(_loaderx, root, "raw"),
            "torch": partial(_torch, root),
            "numpy": partial(_numpy, root),
            **peers,
        }
        measures = {name: _session(start, args.batches) for name, start in starts.items()}
        rate = interleaved(measures, args.rounds)
    mib = BATCH * (images[0].nbytes + 4) / 2**20
    alone = rate.pop("chute-zstd gather alone")
    best = max(r for name, r in rate.items() if not name.startswith("chute"))
    rows = [
        [name, f"{r:.0f}", f"{1e3 / r:.2f}", f"{r * BATCH:,.0f}", f"{r * mib:,.0f}",
         f"{r / rate['loaderx-zstd']:.2f}x", f"{r / rate['torch']:.2f}x", f"{r / best:.2f}x"]
        for name, r in sorted(rate.items(), key=lambda kv: -kv[1])
    ]  # fmt: skip

    def target(label: str, value: float, goal: float, above: bool = True) -> list[str]:
        met = value >= goal if above else value <= goal
        wanted = f">= {goal:g}x" if above else f"<= {goal:.0%}"
        shown = f"{value:.2f}x" if above else f"{value:.1%}"
        return [label, wanted, shown, "met" if met else "NOT met"]

    # the loader's time per batch beyond the bare gather's, as a share of the gather's
    overhead = alone / rate["chute-zstd"] - 1
    targets = [
        target("chute-zstd / loaderx-zstd", rate["chute-zstd"] / rate["loaderx-zstd"], 1.2),
        target("chute-raw / loaderx-raw", rate["chute-raw"] / rate["loaderx-raw"], 1.3),
        target("chute-zstd / torch", rate["chute-zstd"] / rate["torch"], 5),
        target(f"chute-zstd loader overhead over the bare gather ({1e3 / alone:.2f} ms a batch "
               "on the calling thread)", overhead, 0.10, above=False),
    ]  # fmt: skip
    body = (
        f"{args.records} records of {SHAPE} uint8 + int32 labels, batch {BATCH}, {WORKERS} "
        f"threads or workers each; median batches/s of {args.rounds} interleaved rounds of "
        f"{args.batches} batches.\n\n"
        + table(["loader", "batches/s", "ms/batch", "samples/s", "MiB/s", "vs loaderx-zstd",
                 "vs torch", "vs strongest peer"], rows)
        + "\n\n"
        + table(["target", "wanted", "measured", ""], targets)
    )  # fmt: skip
    report("loader", "Loader benchmark", body)
    if args.plot:
        ratio_chart(
            RESULTS / "loader.png",
            "Full pipeline, batch 256: ratio to the strongest peer",
            [r[0] for r in rows],
            {"batches/s": [float(r[1]) for r in rows]},
        )


if __name__ == "__main__":
    main()
