"""Record-store benchmark: chute against loaderx 0.7.3, a memory-mapped .npy, LMDB, HDF5,
Grain's ArrayRecord, MosaicML Streaming (MDS) and LitData.

One run, one workload, every contender side by side; results as ratios, since the machines
here are shared and noisy. Writes bench/results/store.md (and store.png with --plot).

    python bench/store.py [--records 20000] [--batches 200] [--plot]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _peers
import numpy as np
from _charts import ratio_chart

import chute

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "store"
RESULTS = ROOT / "results"
MiB = 1 << 20
WRITE_ROUNDS = 2


def structured(n: int, seed: int = 0) -> np.ndarray:
    """The issue's workload: per-sample smooth ramps plus noise, (n, 3, 64, 64) uint8."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, 12288)
    out = np.empty((n, 12288), np.uint8)
    for s in range(0, n, 2000):
        k = min(2000, n - s)
        amp = 1 + 4 * rng.random((k, 1))
        phase = rng.random((k, 1))
        wave = np.sin(2 * np.pi * (t * amp + phase)) * 0.5 + 0.5
        noisy = wave + rng.random((k, 12288)) * 0.06
        out[s : s + k] = (np.clip(noisy, 0, 1) * 255).astype(np.uint8)
    return out.reshape(n, 3, 64, 64)


def disk_bytes(path: Path) -> int:
    """Allocated bytes (so sparse preallocation is not counted as data); a file removed while
    the folder is walked (a cache evicting) counts nothing."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    total = 0
    for p in files:
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_blocks * 512
    return total


def timed(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass
class Contender:
    name: str
    write: Callable[[Path, np.ndarray], None]
    # open(path, like) -> a batch reader; ``like`` is one record, for dtype and shape
    open: Callable[[Path, np.ndarray], Callable[[np.ndarray], np.ndarray]]
    suffix: str = ".zr"


def chute_contender(codec: str, verify: bool = False, dict_size: int | None = None) -> Contender:
    def write(path: Path, a: np.ndarray) -> None:
        chute.write_dataset(path, a, codec=codec, dict_size=dict_size, progress=False).close()

    def open_(path: Path, like: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        return chute.Dataset(path, verify=verify).__getitems__

    label = f"chute-{codec}" + ("+verify" if verify else "")
    label += f"-{dict_size >> 10}KiB" if dict_size else ""
    return Contender(label, write, open_)


def loaderx_contender(codec: str) -> Contender | None:
    try:
        import loaderx
    except ImportError:
        return None

    def write(path: Path, a: np.ndarray) -> None:
        loaderx.write_dataset(str(path), a, codec=codec)

    def open_(path: Path, like: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        ds = loaderx.Dataset(str(path))
        return lambda idx: ds[idx]

    return Contender(f"loaderx-{codec}", write, open_)


def npy_contender() -> Contender:
    def write(path: Path, a: np.ndarray) -> None:
        np.save(path, a)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())

    def open_(path: Path, like: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        mm = np.load(path, mmap_mode="r")
        return lambda idx: mm[idx]

    return Contender("npy-mmap", write, open_, ".npy")


def lmdb_contender() -> Contender | None:
    try:
        import lmdb
    except ImportError:
        return None

    def write(path: Path, a: np.ndarray) -> None:
        env = lmdb.open(str(path), map_size=4 << 30, subdir=True)
        flat = a.reshape(len(a), -1)
        with env.begin(write=True) as txn:
            for i in range(len(a)):
                txn.put(i.to_bytes(8, "big"), flat[i].tobytes())
        env.close()

    def open_(path: Path, like: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)

        def read(idx: np.ndarray) -> np.ndarray:
            out = np.empty((len(idx), *like.shape[1:]), like.dtype)
            flat = out.reshape(len(idx), -1).view(np.uint8)
            with env.begin(buffers=True) as txn:
                for k, i in enumerate(idx.tolist()):
                    flat[k] = np.frombuffer(txn.get(i.to_bytes(8, "big")), np.uint8)
            return out

        return read

    return Contender("lmdb", write, open_, ".lmdb")


def h5py_contender() -> Contender | None:
    try:
        import h5py
    except ImportError:
        return None

    def write(path: Path, a: np.ndarray) -> None:
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=a, chunks=(1, *a.shape[1:]))

    def open_(path: Path, like: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        ds = h5py.File(path, "r")["x"]

        def read(idx: np.ndarray) -> np.ndarray:
            uniq, inverse = np.unique(idx, return_inverse=True)  # h5py wants increasing
            return ds[uniq][inverse]

        return read

    return Contender("h5py", write, open_, ".h5")


def peer_contenders() -> list[Contender]:
    """The formats of bench/_peers.py that are installed, one record per row."""

    def wrap(name: str, write: Callable, reader: Callable, suffix: str) -> Contender:
        def open_(path: Path, like: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
            read = reader(path, _peers.like_of({"data": like}))
            return lambda idx: read(idx)["data"]

        return Contender(name, lambda path, a: write(path, {"data": a}), open_, suffix)

    out = []
    if _peers.available("array_record") and _peers.available("grain"):
        for zstd in (False, True):
            write = functools.partial(_peers.arrayrecord_write, zstd=zstd)
            label = "arrayrecord-" + ("zstd" if zstd else "raw")
            out.append(wrap(label, write, _peers.arrayrecord_reader, ".array_record"))
    if _peers.available("streaming"):
        for zstd in (False, True):
            write = functools.partial(_peers.mds_write, zstd=zstd)
            out.append(wrap("mds-" + ("zstd" if zstd else "raw"), write, _peers.mds_reader, ".mds"))
    if _peers.available("litdata"):  # its zstd chunks do not read back from a local folder
        out.append(wrap("litdata-raw", _peers.litdata_write, _peers.litdata_reader, ".lit"))
    return out


def run_workload(
    label: str,
    a: np.ndarray,
    contenders: list[Contender],
    batches: int,
    batch: int,
    rounds: int,
    extra: dict[str, Callable[[], object]] | None = None,
) -> tuple[list[dict[str, object]], dict[str, float]]:
    """Write with every contender, then time reads in rounds that rotate through all of
    them, keeping each one's best: on a shared machine, load that comes and goes then hits
    every contender alike instead of whichever ran at the wrong moment."""
    rng = np.random.default_rng(42)
    plan = [rng.integers(0, len(a), batch) for _ in range(batches)]
    singles = [np.array([i]) for i in rng.integers(0, len(a), 2000).tolist()]
    rows: dict[str, dict[str, object]] = {}
    readers = {}
    write_s = {c.name: float("inf") for c in contenders}
    for k in range(WRITE_ROUNDS):  # rotate writes too; one round is enough for slow writers
        for c in contenders:
            if k and write_s[c.name] > 15.0:
                continue
            path = DATA / f"{label}-{c.name}{c.suffix}"
            for old in (path, path.with_name(path.name + "-cache")):
                if old.exists():
                    shutil.rmtree(old) if old.is_dir() else old.unlink()
            t0 = time.perf_counter()
            c.write(path, a)
            write_s[c.name] = min(write_s[c.name], time.perf_counter() - t0)
    for c in contenders:
        path = DATA / f"{label}-{c.name}{c.suffix}"
        read = c.open(path, a[:1])
        got = read(plan[0]).reshape(batch, -1)
        assert np.array_equal(got, a[plan[0]].reshape(batch, -1)), c.name
        for idx in plan[:20]:  # warm the page cache and the code
            read(idx)
        readers[c.name] = read
        rows[c.name] = {
            "name": c.name,
            "write": a.nbytes / MiB / write_s[c.name],
            "disk": disk_bytes(path),
            "ratio": a.nbytes / max(disk_bytes(path), 1),
            "gather_s": float("inf"),
            "single_s": float("inf"),
        }
        print(f"  {label:6s} {c.name:24s} written", file=sys.stderr)
    extras = {name: float("inf") for name in extra or {}}
    for k in range(rounds):
        for name, read in readers.items():
            r = rows[name]
            if k and r["gather_s"] > 5.0:  # type: ignore[operator]
                continue  # one round of a contender this slow is enough to place it
            g = timed(lambda read=read: consume(read, plan), 1)
            s1 = timed(lambda read=read: consume(read, singles), 1)
            r["gather_s"] = min(r["gather_s"], g)  # type: ignore[type-var]
            r["single_s"] = min(r["single_s"], s1)  # type: ignore[type-var]
        for name, fn in (extra or {}).items():
            extras[name] = min(extras[name], timed(fn, 1))
    out = []
    for r in rows.values():
        g, s1 = float(r.pop("gather_s")), float(r.pop("single_s"))  # type: ignore[arg-type]
        r["gather"] = batches * batch * a[0].nbytes / MiB / g
        r["per_batch_ms"] = g / batches * 1e3
        r["single_us"] = s1 / len(singles) * 1e6
        out.append(r)
    return out, extras


def consume(read: Callable[[np.ndarray], object], plan: list[np.ndarray]) -> None:
    """Every batch of ``plan`` read and dropped before the next, as a training loop does: a
    list of them all would time first-touch page faults on hundreds of MiB of fresh memory
    (about 1 ms a 3 MiB batch here, more than its decode) instead of the reads."""
    for idx in plan:
        read(idx)


def decode_limit(a: np.ndarray) -> tuple[Callable[[], object], int] | None:
    """libzstd's own single-core decode of ``a``'s records, as a timed callable and a count
    (256 frames a call, each call's output dropped before the next, as the gathers' are)."""
    try:
        import zstandard
    except ImportError:
        return None
    flat = a.reshape(len(a), -1)
    cctx = zstandard.ZstdCompressor(level=3)
    frames = [cctx.compress(flat[i].tobytes()) for i in range(min(len(a), 4096))]
    return _frames_limit(zstandard.ZstdDecompressor(), frames)


def stored_frames_limit(path: Path) -> tuple[Callable[[], object], int] | None:
    """libzstd's single-core decode of a chute zstd_dict store's own frames (its first 4096
    records, read from its chunk file) with the store's dictionary: at high levels a frame
    costs several times what a level-3 frame does, so only the stored frames make a limit."""
    try:
        import zstandard
    except ImportError:
        return None
    if not (path / "dict.zr").exists():
        return None
    with chute.RecordStore(path) as store:
        table = store._current().table[:4096]  # where each record's frame lies
    chunk = (path / "0.zr").read_bytes()
    where = zip(table["offset"].tolist(), table["phys_length"].tolist(), strict=True)
    frames = [chunk[o : o + n] for o, n in where]
    zdict = zstandard.ZstdCompressionDict((path / "dict.zr").read_bytes())
    return _frames_limit(zstandard.ZstdDecompressor(dict_data=zdict), frames)


def _frames_limit(dctx: Any, frames: list[bytes]) -> tuple[Callable[[], object], int]:
    """Decoding ``frames`` 256 a call on one thread (no Python work per record), timed."""
    calls = [frames[k : k + 256] for k in range(0, len(frames), 256)]

    def decode() -> None:
        for batch in calls:
            dctx.multi_decompress_to_buffer(batch, threads=1)

    return decode, len(frames)


def table(rows: list[dict[str, object]], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| store | write MiB/s | gather MiB/s | per batch | batch-1 read | on disk | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['write']:.0f} | {r['gather']:.0f} | {r['per_batch_ms']:.2f} ms "
            f"| {r['single_us']:.1f} µs | {r['disk'] / MiB:.1f} MiB | {r['ratio']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5, help="timing rounds through all readers")
    p.add_argument("--plot", action="store_true")
    args = p.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))

    big = structured(args.records)
    main_contenders = [
        chute_contender("raw"),
        chute_contender("zstd"),
        chute_contender("zstd", verify=True),
        chute_contender("zstd_dict"),
        chute_contender("zstd_dict", dict_size=1 << 20),
        *filter(None, [loaderx_contender(c) for c in ("raw", "zstd", "zstd_dict")]),
        npy_contender(),
        *filter(None, [lmdb_contender(), h5py_contender()]),
        *peer_contenders(),
    ]
    limit_fn = decode_limit(big)
    extra = {"decode": limit_fn[0]} if limit_fn else {}
    rows, extras = run_workload(
        "images", big, main_contenders, args.batches, args.batch, args.rounds, extra
    )
    small = np.random.default_rng(1).integers(0, 1000, (args.records, 64)).astype(np.int32)
    small_contenders = [
        chute_contender("raw"),
        chute_contender("zstd"),
        *filter(None, [loaderx_contender(c) for c in ("raw", "zstd")]),
        npy_contender(),
        *peer_contenders(),
    ]
    small_rows, _ = run_workload(
        "small", small, small_contenders, args.batches, args.batch, args.rounds
    )
    # libzstd's single-core time per batch, spread over the cores: the 2-core decode limit
    limit = extras["decode"] / limit_fn[1] * args.batch / cores * 1e3 if limit_fn else None
    # the same for the small records, one frame each: the per-frame floor of their gather
    small_fn = decode_limit(small)
    floor = None
    if small_fn:
        floor = timed(small_fn[0], args.rounds) / small_fn[1] * args.batch / cores * 1e3

    # and the zstd_dict store's own frames with its dictionary: the limit of its gather
    dict_fn = stored_frames_limit(DATA / "images-chute-zstd_dict.zr")
    dict_limit = None
    if dict_fn:
        dict_limit = timed(dict_fn[0], args.rounds) / dict_fn[1] * args.batch / cores * 1e3

    by = {r["name"]: r for r in rows}
    sby = {r["name"]: r for r in small_rows}

    def ratio(a: dict | None, b: dict | None, key: str) -> float | None:
        return None if a is None or b is None else a[key] / b[key]

    checks = []

    def check(label: str, value: float | None, op: str = "", target: float = 0.0,
              note: str = "") -> None:  # fmt: skip
        """A row: the value, its target and whether it is met (no op: a reference row)."""
        shown = "n/a" if value is None else f"{value:.2f}x{note}"
        if not op:
            checks.append(f"| {label} | {shown} | (reference) | |")
            return
        met = value is not None and (value >= target if op == ">=" else value <= target)
        checks.append(f"| {label} | {shown} | {op} {target}x | {'met' if met else 'NOT met'} |")

    g = lambda n: by.get(n)  # noqa: E731
    check("raw gather vs npy-mmap", ratio(g("chute-raw"), g("npy-mmap"), "gather"), ">=", 1.0)
    if limit:
        lim_mib = args.batch * big[0].nbytes / MiB / (limit / 1e3)
        check("zstd gather vs 2-core decode limit", by["chute-zstd"]["gather"] / lim_mib, ">=",
              0.93, f" ({lim_mib:.0f} MiB/s limit)")  # fmt: skip
    if floor:
        floor_mib = args.batch * small[0].nbytes / MiB / (floor / 1e3)
        check("small zstd gather vs libzstd's per-frame floor (within 1.1x)",
              sby["chute-zstd"]["gather"] / floor_mib, ">=", 0.91,
              f" ({floor_mib:.0f} MiB/s floor)")  # fmt: skip
    check("zstd gather vs loaderx-zstd", ratio(g("chute-zstd"), g("loaderx-zstd"), "gather"),
          ">=", 1.05)  # fmt: skip
    check("small raw gather vs loaderx",
          ratio(sby.get("chute-raw"), sby.get("loaderx-raw"), "gather"), ">=", 3)  # fmt: skip
    check("small zstd gather vs loaderx",
          ratio(sby.get("chute-zstd"), sby.get("loaderx-zstd"), "gather"), ">=", 3)  # fmt: skip
    check("zstd_dict write vs loaderx",
          ratio(g("chute-zstd_dict"), g("loaderx-zstd_dict"), "write"), ">=", 5)  # fmt: skip
    check("zstd_dict gather vs loaderx",
          ratio(g("chute-zstd_dict"), g("loaderx-zstd_dict"), "gather"), ">=", 2)  # fmt: skip
    if dict_limit:
        dict_mib = args.batch * big[0].nbytes / MiB / (dict_limit / 1e3)
        check("zstd_dict gather vs libzstd decoding with the same dictionary on 2 cores",
              by["chute-zstd_dict"]["gather"] / dict_mib,
              note=f" ({dict_mib:.0f} MiB/s limit)")  # fmt: skip
    for key in ("write", "gather"):
        check(f"zstd_dict {key} vs loaderx, both ~1 MiB dictionaries",
              ratio(g("chute-zstd_dict-1024KiB"), g("loaderx-zstd_dict"), key))  # fmt: skip
    check("batch-1 read vs npy-mmap (time, lower is better)",
          ratio(g("chute-zstd"), g("npy-mmap"), "single_us"), "<=", 2)  # fmt: skip
    check("batch-1 read, loaderx-zstd vs npy-mmap",
          ratio(g("loaderx-zstd"), g("npy-mmap"), "single_us"))  # fmt: skip
    check("verify cost (zstd gather with/without)",
          ratio(g("chute-zstd+verify"), g("chute-zstd"), "gather"))  # fmt: skip

    out = [
        "# Store benchmark",
        "",
        f"{args.records} records, random batches of {args.batch}, {args.batches} batches, "
        f"warm page cache, {cores} cores, Python {sys.version.split()[0]}. "
        "Gather MiB/s counts decoded bytes; batch-1 is one random record per call; on disk is "
        "allocated blocks.",
        "",
        table(rows, "Images: (3, 64, 64) uint8, structured"),
        "",
        table(small_rows, "Small records: 64 int32"),
        "",
        "### Targets (ratios from this run)",
        "",
        "| check | measured | target | |",
        "|---|---:|---:|---|",
        *checks,
    ]
    text = "\n".join(out) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "store.md").write_text(text)
    if args.plot:
        plot(rows, small_rows)


def plot(rows: list[dict], small_rows: list[dict]) -> None:
    """store.png and store-small.png: each table as ratios to its strongest peer."""
    for data, name, title in (
        (rows, "store", "Images (3, 64, 64) uint8: ratio to the strongest peer"),
        (small_rows, "store-small", "Small records (64 int32): ratio to the strongest peer"),
    ):
        metrics = {
            "gather MiB/s": [float(r["gather"]) for r in data],
            "batch-1 read": [float(r["single_us"]) for r in data],
            "write MiB/s": [float(r["write"]) for r in data],
            "compression": [float(r["ratio"]) for r in data],
        }
        names = [str(r["name"]) for r in data]
        low = ["batch-1 read"]
        ratio_chart(RESULTS / f"{name}.png", title, names, metrics, lower_is_better=low)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
