"""Datasets in object storage: chute from S3 against MosaicML Streaming and LitData.

Workload: the store benchmark's images (``structured`` from bench/store.py, 20000 records of
3x64x64 uint8), sharded (80 shards of 250 records, about 3 MiB each, in every format), in a
bucket of a ``moto_server`` on 127.0.0.1 that this script starts. A small counting HTTP proxy
(a process of its own) stands in front of moto, so every contender's GET requests and the
bytes they fetch are counted. Each contender reads two epochs in random order, batch 256,
2 threads or loader workers each, in a process of its own (opening included in epoch 0):

* chute on local disk (the baseline);
* chute from ``s3://``: cold (empty cache) then warm (the cache holds the dataset), and with
  ``cache_bytes`` at 10% of the dataset under the shard-window sampler;
* MosaicML Streaming's ``StreamingDataset`` (MDS shards) with ``cache_limit`` at the same 10%,
  and without a limit;
* LitData's ``StreamingDataset`` (its optimized chunks).

Contenders take turns, round by round; each figure is the median over rounds. Every batch is
checked against the data written (each record's fingerprint, the first batch of each epoch
byte for byte), so a row also says how many distinct records its epoch delivered.

    python bench/remote.py [--rounds 3]          # writes bench/results/remote.md and .png
    python bench/remote.py --tiny [--peers-only]  # a smoke run that writes no results

``--peers-only`` leaves out the chute rows read from ``s3://``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _peers
import numpy as np
from _charts import ratio_chart
from _s3proxy import counts, start_proxy
from insitu import start_moto
from store import disk_bytes, structured

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "remote"
RESULTS = ROOT / "results"
MiB = 1 << 20
BUCKET = "bench"
THREADS = 2  # threads or loader workers, for everyone (as bench/loader.py)
EPOCHS = 2
CREDENTIALS = {"region": "us-east-1", "access_key_id": "testing", "secret_access_key": "testing"}


# -- data -----------------------------------------------------------------------------------

FINGERPRINT_BYTES = 32  # bytes sampled across a record: unique on this workload (checked)


def fingerprints(flat: np.ndarray) -> np.ndarray:
    """One uint64 per record (rows of ``flat``) from bytes spread across it."""
    pos = np.linspace(0, flat.shape[1] - 1, FINGERPRINT_BYTES).astype(np.int64)
    words = np.ascontiguousarray(flat[:, pos]).view(np.uint64)
    weights = np.arange(1, words.shape[1] + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return (words * (weights | np.uint64(1))).sum(axis=1, dtype=np.uint64)


def write_formats(root: Path, images: np.ndarray, shard_records: int, codec: str) -> None:
    """The images as chute, MDS and LitData shards of ``shard_records`` records each."""
    import chute

    chute.write_dataset(root / "chute", images, shard_records=shard_records, codec=codec,
                        progress=False).close()  # fmt: skip
    columns = {"data": images}
    zstd = codec == "zstd"
    if _peers.available("streaming"):
        per_record = images[0].nbytes + 8  # MDS stores a size and an offset per record
        limit = shard_records * per_record + 1024  # and a header of some hundred bytes
        _peers.mds_write(root / "mds", columns, zstd, size_limit=limit)
    if _peers.available("litdata"):  # uncompressed: its compression= leaves chunks raw here
        _peers.litdata_write(root / "lit", columns, shard_records)


def upload(endpoint: str, folder: Path, prefix: str) -> int:
    """Every file of ``folder`` under ``s3://BUCKET/prefix/`` (straight to moto, not through
    the proxy); returns the bytes stored."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, client_options={"allow_http": True},
                    **CREDENTIALS)  # type: ignore[arg-type]  # fmt: skip
    files = [p for p in folder.rglob("*") if p.is_file()]

    def put(p: Path) -> None:
        obstore.put(store, f"{prefix}/{p.relative_to(folder).as_posix()}", p.read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))
    return sum(p.stat().st_size for p in files)


def server_ceiling(endpoint: str, prefix: str) -> tuple[int, float, int]:
    """GET every chunk object under ``prefix`` once, whole, 8 at a time, through ``endpoint``:
    how many, the seconds it took and the bytes. What the server alone can serve: a reader
    that fetches the dataset again each epoch cannot read faster."""
    import re

    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, client_options={"allow_http": True},
                    **CREDENTIALS)  # type: ignore[arg-type]  # fmt: skip
    keys = [m["path"] for batch in obstore.list(store, prefix=f"{prefix}/") for m in batch
            if re.search(r"/\d+\.zr$", m["path"])]  # fmt: skip
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        got = sum(pool.map(lambda k: len(obstore.get(store, k).bytes()), keys))
    return len(keys), time.perf_counter() - t0, got


# -- in a worker: one session, two epochs ---------------------------------------------------


@dataclass
class Reference:
    """What the worker checks batches against: the images written and their fingerprints."""

    images: np.ndarray
    keys: np.ndarray = field(init=False)
    order: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        keys = fingerprints(self.images.reshape(len(self.images), -1))
        self.order = np.argsort(keys)
        self.keys = keys[self.order]

    def positions(self, batch: np.ndarray) -> np.ndarray:
        """Which records ``batch`` holds; a record that is none of them is an error."""
        got = fingerprints(batch.reshape(len(batch), -1))
        at = np.minimum(np.searchsorted(self.keys, got), len(self.keys) - 1)
        if not np.array_equal(self.keys[at], got):
            raise AssertionError("a batch holds a record that was never written")
        return self.order[at]


@dataclass
class Start:
    """A session's beginning: the reference built (not timed), then the proxy's counters and
    the time, just before the dataset is opened."""

    ref: Reference
    before: dict[str, int]
    t0: float


def begin(cfg: dict[str, Any]) -> Start:
    ref = Reference(np.load(cfg["images"], mmap_mode="r"))
    before = counts(cfg["proxy"])
    return Start(ref, before, time.perf_counter())


def measure(
    cfg: dict[str, Any], start: Start, epoch: Callable[[int], Iterator[np.ndarray]]
) -> list[dict[str, Any]]:
    """Each epoch's time (epoch 0's from ``start``, so opening counts), records, distinct
    records, the proxy's requests, GETs and GET bytes meanwhile, and the cache's size on disk
    at its end."""
    ref, before, t0 = start.ref, start.before, start.t0
    cache = cfg.get("cache_dir")
    out: list[dict[str, Any]] = []
    for e in range(EPOCHS):
        seen = np.zeros(len(ref.images), bool)
        records, first = 0, None
        for batch in epoch(e):
            at = ref.positions(batch)
            if first is None:
                first = time.perf_counter() - t0
                if not np.array_equal(batch, ref.images[at]):
                    raise AssertionError("the first batch differs from the records written")
            seen[at] = True
            records += len(batch)
        end = time.perf_counter()
        after = counts(cfg["proxy"])
        out.append({
            "seconds": end - t0, "first_batch_s": first, "records": records,
            "distinct": int(seen.sum()), **{k: after[k] - before[k] for k in after},
            "cache_bytes": disk_bytes(Path(cache)) if cache else 0,
        })  # fmt: skip
        t0, before = end, after
    return out


def session_chute(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """chute on the local copy, or on ``s3://`` through the proxy with a cache."""
    import chute

    start = begin(cfg)
    if cfg["url"].startswith("s3://"):
        options = {**CREDENTIALS, "endpoint": cfg["proxy"], "client_options": {"allow_http": True}}
        cache = {"cache_dir": cfg["cache_dir"], "cache_bytes": cfg["cache_bytes"]}
        ds = chute.Dataset(cfg["url"], **options, **cache)
    else:
        ds = chute.Dataset(cfg["url"])
    if cfg.get("window"):
        sampler: dict[str, Any] = {"sampler": "window", "window": cfg["window"]}
    else:
        sampler = {"sampler": "cyclic"}
    dl = chute.DataLoader({"x": ds}, batch_size=cfg["batch"], seed=0, num_threads=THREADS,
                          **sampler)  # fmt: skip
    steps = cfg["records"] // cfg["batch"]
    try:
        return measure(cfg, start, lambda e: (b["x"] for b in itertools.islice(dl, steps)))
    finally:
        dl.close()
        ds.close()


def _like(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"data": (np.dtype(np.uint8), tuple(cfg["item_shape"]))}


def session_streaming(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """MosaicML Streaming's StreamingDataset and StreamingDataLoader on the MDS shards."""
    _peers._streaming()  # its torchvision workaround
    from streaming import StreamingDataLoader, StreamingDataset

    start = begin(cfg)
    ds = StreamingDataset(
        remote=cfg["url"], local=cfg["cache_dir"], cache_limit=cfg["cache_bytes"],
        shuffle=True, shuffle_seed=0, batch_size=cfg["batch"],
    )  # fmt: skip
    dl = StreamingDataLoader(
        ds, batch_size=cfg["batch"], num_workers=THREADS, collate_fn=_peers.collate(_like(cfg)),
        persistent_workers=True, drop_last=True,
    )  # fmt: skip
    return measure(cfg, start, lambda e: (b["data"] for b in dl))


def session_litdata(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """LitData's StreamingDataset and StreamingDataLoader on its optimized chunks."""
    import litdata
    from litdata.streaming import downloader

    # LitData fetches chunks through obstore, which refuses a plain-http endpoint such as
    # moto's unless told to, and LitData has no option for it
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    start = begin(cfg)
    storage = {"endpoint_url": cfg["proxy"], "aws_access_key_id": "testing",
               "aws_secret_access_key": "testing", "region_name": "us-east-1"}  # fmt: skip
    ds = litdata.StreamingDataset(
        cfg["url"], cache_dir=cfg["cache_dir"], storage_options=storage, shuffle=True, seed=0,
        max_cache_size=cfg["cache_bytes"],
    )  # fmt: skip
    dl = litdata.StreamingDataLoader(
        ds, batch_size=cfg["batch"], num_workers=THREADS, collate_fn=_peers.collate(_like(cfg)),
        drop_last=True,
    )  # fmt: skip
    return measure(cfg, start, lambda e: (b["data"] for b in dl))


SESSIONS = {"chute": session_chute, "streaming": session_streaming, "litdata": session_litdata}


def worker_main(kind: str, cfg: str) -> None:
    print("RESULT " + json.dumps(SESSIONS[kind](json.loads(cfg))), flush=True)


# -- the driver -----------------------------------------------------------------------------


@dataclass
class Contender:
    """One loader configuration: a session (two epochs) per round, in a process of its own."""

    name: str
    kind: str  # which session function
    fmt: str  # the folder and bucket prefix it reads: chute, mds or lit
    role: str  # local, cached (cold then warm), window, or peer
    labels: tuple[str, str]  # its epochs 0 and 1 in the table
    cfg: dict[str, Any] = field(default_factory=dict)


def run_session(c: Contender, cfg: dict[str, Any], timeout: float) -> list[dict[str, Any]] | str:
    """One session's epochs; a peer's failure comes back as its message for the table, a
    chute failure is raised."""
    cfg = {**cfg, **c.cfg}
    cache = None if c.role == "local" else Path(tempfile.mkdtemp(prefix="cache-", dir=cfg["root"]))
    if cache is not None:
        cfg["cache_dir"] = str(cache)
    env = {
        **os.environ, "S3_ENDPOINT_URL": cfg["proxy"], "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    cmd = [sys.executable, __file__, "--worker", c.kind, json.dumps(cfg)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # its loader workers too
        proc.communicate()
        stdout, stderr = "", f"timed out after {timeout:.0f} s"
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return list(json.loads(line.removeprefix("RESULT ")))
    if c.role != "peer":
        raise RuntimeError(f"{c.name} failed:\n{stderr[-4000:]}")
    print(f"  {c.name} failed:\n{stderr[-2000:]}", file=sys.stderr)
    last = [line for line in stderr.splitlines() if line.strip()] or ["no output"]
    return f"failed: {last[-1].strip()[:160]}"


def contenders(args: argparse.Namespace, stored: dict[str, int], root: Path) -> list[Contender]:
    """chute local, chute from s3:// (cold then warm, and the window sampler with the small
    cache) unless --peers-only, and the installed peers; budgets from chute's stored bytes."""
    budget = int(stored["chute"] * args.cache_fraction)
    small = f"{args.cache_fraction:.0%} cache"
    if args.tiny:  # a smoke run's data is too small: a cache of three blocks, whatever it holds
        budget = max(budget, 3 * (4 * MiB + 1024))
        small = f"{budget / MiB:.0f} MiB cache"
    shard = stored["chute"] / -(-args.records // args.shard_records)
    window = args.window or max(1, int(budget / shard) // 2)

    def epochs(name: str) -> tuple[str, str]:
        return f"{name} (epoch 0)", f"{name} (epoch 1)"

    out = [Contender("chute local", "chute", "chute", "local", epochs("chute local"))]
    if not args.peers_only:
        win = f"chute s3, window={window}, {small}"
        out += [
            Contender("chute s3", "chute", "chute", "cached",
                      ("chute s3 cold (epoch 0)", "chute s3 warm (epoch 1)"),
                      {"cache_bytes": 2 * stored["chute"] + 64 * MiB}),
            Contender(win, "chute", "chute", "window", epochs(win),
                      {"cache_bytes": budget, "window": window}),
        ]  # fmt: skip
    if "mds" in stored:
        for name, limit in ((f"streaming, {small}", budget), ("streaming, no limit", None)):
            out.append(Contender(name, "streaming", "mds", "peer", epochs(name),
                                 {"cache_bytes": limit}))  # fmt: skip
    if "lit" in stored:
        out.append(Contender("litdata", "litdata", "lit", "peer", epochs("litdata"),
                             {"cache_bytes": None}))  # fmt: skip
    for c in out:
        c.cfg["url"] = str(root / c.fmt) if c.role == "local" else f"s3://{BUCKET}/{c.fmt}"
    return out


def aggregate(
    cs: list[Contender], runs: dict[str, list[list[dict[str, Any]] | str]], item_bytes: int
) -> dict[str, dict[str, Any] | str]:
    """Per table row (a contender's epoch): medians over the rounds, or a failure message."""
    rows: dict[str, dict[str, Any] | str] = {}
    for c in cs:
        failed = [r for r in runs[c.name] if isinstance(r, str)]
        for e, label in enumerate(c.labels):
            if failed:
                rows[label] = failed[0]
                continue
            got = [r[e] for r in runs[c.name] if not isinstance(r, str)]
            row: dict[str, Any] = {k: statistics.median(g[k] for g in got) for k in got[0]}
            row["distinct"] = min(g["distinct"] for g in got)
            mibps = (g["records"] * item_bytes / g["seconds"] / MiB for g in got)
            row.update(mibps=statistics.median(mibps), fmt=c.fmt, remote=c.role != "local")
            rows[label] = row
    return rows


def _ratio(rows: dict[str, Any], a: str | None, b: list[str | None]) -> float | None:
    """``a``'s MiB/s over the best of ``b``'s; None when a row is missing or failed."""
    good = [rows[x]["mibps"] for x in b if isinstance(rows.get(x), dict)]
    if not isinstance(rows.get(a), dict) or not good:
        return None
    return float(rows[a]["mibps"] / max(good))


def targets(
    cs: list[Contender], rows: dict[str, Any], stored: dict[str, int], records: int
) -> list[str]:
    """The issue's targets as table lines: measured, goal, met (n/a for rows not run)."""
    role: dict[str, tuple[str | None, str | None]] = {c.role: c.labels for c in cs}
    local = role["local"][1]
    cold, warm = role.get("cached", (None, None))
    window = role.get("window", (None, None))
    peers: list[str | None] = [c.labels[0] for c in cs if c.role == "peer"]
    checks = [
        ("s3 warm vs chute local (epoch 1)", _ratio(rows, warm, [local]), ">=", 0.9),
        ("s3 window, small cache vs s3 warm (epoch 1)", _ratio(rows, window[1], [warm]), ">=",
         0.8),
        ("s3 cold vs the faster of Streaming and LitData (epoch 0)", _ratio(rows, cold, peers),
         ">=", 1.5),
    ]  # fmt: skip
    win_rows = [rows.get(x) for x in window]
    most = None
    if all(isinstance(r, dict) for r in win_rows):
        most = max(r["get_bytes"] for r in win_rows) / stored["chute"]  # type: ignore[index]
    checks.append(("window mode: bytes fetched / dataset bytes, worst epoch", most, "<=", 1.0))
    both = None
    if all(isinstance(r, dict) for r in win_rows):
        read = sum(r["records"] for r in win_rows) / records  # type: ignore[index]
        fetched = sum(r["get_bytes"] for r in win_rows)  # type: ignore[index]
        both = fetched / (read * stored["chute"])
    checks.append(("window mode: bytes fetched / dataset bytes, per epoch over both", both, "<=",
                   1.0))  # fmt: skip
    lines = []
    for label, value, op, goal in checks:
        met = value is not None and (value >= goal if op == ">=" else value <= goal)
        shown = ("n/a", "n/a") if value is None else (_x(value), "yes" if met else "no")
        lines.append(f"| {label} | {shown[0]} | {op} {goal}x | {shown[1]} |")
    return lines


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("mosaicml-streaming", "litdata", "moto"):
        with contextlib.suppress(PackageNotFoundError):
            out.append(f"{name} {version(name)}")
    return ", ".join(out)


def _g(v: float) -> str:
    """Three significant figures, without an exponent for the sizes here."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _x(v: float) -> str:
    """A ratio: two decimals, or two significant figures when that would show 0.00."""
    return f"{v:.2f}x" if v == 0 or abs(v) >= 0.01 else f"{v:.2g}x"


def report(
    args: argparse.Namespace,
    cs: list[Contender],
    rows: dict[str, Any],
    stored: dict[str, int],
    ceiling: tuple[int, float, int],
) -> str:
    local = rows[cs[0].labels[1]]
    lines = [
        "# Datasets in object storage",
        "",
        f"{args.records} records of 3x64x64 uint8 (the store benchmark's images), shards of "
        f"{args.shard_records} records in every format, codec {args.codec} for chute and MDS "
        "(LitData leaves its chunks uncompressed when asked for zstd: raw here), in a moto S3 "
        f"server on 127.0.0.1 behind a counting proxy; batch {args.batch}, {THREADS} threads or "
        f"loader workers each, random order, {EPOCHS} epochs per session in a process of its "
        f"own (epoch 0 includes opening the dataset), medians of {args.rounds} interleaved "
        f"rounds. Stored: {', '.join(f'{k} {v / MiB:.1f} MiB' for k, v in stored.items())}. "
        "GETs and bytes fetched are counted at the proxy, per epoch; fetched / stored is over "
        "the bytes of that format in the bucket; the cache is measured at the epoch's end. "
        f"Versions: {_versions()}.",
        "",
        f"The server alone (moto, through the proxy) serves chute's {ceiling[0]} chunk objects, "
        f"each GET once, whole, 8 at a time, in {ceiling[1]:.2f} s "
        f"({ceiling[2] / MiB / ceiling[1]:.0f} MiB/s, about {1000 * ceiling[1] / ceiling[0]:.1f} "
        "ms a GET: moto handles requests one at a time): no epoch that fetches the dataset "
        "again can be faster than that, and every request costs the same few milliseconds "
        "whatever its size.",
        "",
        "| row | MiB/s | x chute local | first batch s | records (distinct) | GETs "
        "| MiB fetched | fetched / stored | cache on disk MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        if isinstance(r, str):
            lines.append(f"| {name} | {r} | | | | | | | |")
            continue
        net = "| - | - | - | - |"
        if r["remote"]:
            share = r["get_bytes"] / stored[r["fmt"]]
            net = (f"| {r['gets']:.0f} | {_g(r['get_bytes'] / MiB)} | {_x(share)} "
                   f"| {_g(r['cache_bytes'] / MiB)} |")  # fmt: skip
        lines.append(
            f"| {name} | {_g(r['mibps'])} | {_x(r['mibps'] / local['mibps'])} "
            f"| {r['first_batch_s']:.3f} | {r['records']:.0f} ({r['distinct']}) " + net
        )
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|",
              *targets(cs, rows, stored, args.records)]  # fmt: skip
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 onto 2 meanwhile (the writers' own worker processes included)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=None, help="20000 (--tiny: 2000)")
    p.add_argument("--batch", type=int, default=None, help="256 (--tiny: 64)")
    p.add_argument("--shard-records", type=int, default=None, help="250 (--tiny: 25)")
    p.add_argument("--codec", default="zstd", choices=("zstd", "raw"), help="chute's and MDS's")
    p.add_argument("--cache-fraction", type=float, default=0.1, help="the small cache's size")
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="shards per window (default: half the shards the small cache holds)",
    )
    p.add_argument("--rounds", type=int, default=None, help="3 (--tiny: 1)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds a session may take")
    p.add_argument("--tiny", action="store_true", help="a quick smoke run; writes no results")
    p.add_argument("--peers-only", action="store_true", help="leave out chute's s3:// rows")
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(*args.worker)
        return
    for name, full, tiny in (("records", 20000, 2000), ("batch", 256, 64),
                             ("shard_records", 250, 25), ("rounds", 3, 1)):  # fmt: skip
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    # the moto_server of this Python's environment, before any other on the PATH
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    images = structured(args.records)
    if len(np.unique(fingerprints(images.reshape(len(images), -1)))) != len(images):
        raise SystemExit("two records share a fingerprint: raise FINGERPRINT_BYTES")
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=DATA) as tmp:
        root = Path(tmp)
        np.save(root / "images.npy", images)
        print("writing chute, MDS and LitData shards", file=sys.stderr)
        with _stdout_to_stderr():  # LitData's writer talks; stdout is for the report
            write_formats(root, images, args.shard_records, args.codec)
        moto, endpoint = start_moto()
        proxy_proc, proxy = start_proxy(endpoint)
        try:
            request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
            urllib.request.urlopen(request).close()
            stored = {f: upload(endpoint, root / f, f) for f in ("chute", "mds", "lit")
                      if (root / f).exists()}  # fmt: skip
            ceiling = server_ceiling(proxy, "chute")
            cs = contenders(args, stored, root)
            base = {"images": str(root / "images.npy"), "records": args.records,
                    "batch": args.batch, "item_shape": images.shape[1:], "proxy": proxy,
                    "root": str(root)}  # fmt: skip
            runs: dict[str, list[list[dict[str, Any]] | str]] = {c.name: [] for c in cs}
            for r in range(args.rounds):  # taking turns, each round starting one further on
                for c in cs[r % len(cs) :] + cs[: r % len(cs)]:
                    print(f"round {r + 1}/{args.rounds}: {c.name}", file=sys.stderr)
                    runs[c.name].append(run_session(c, base, args.timeout))
        finally:
            for proc in (proxy_proc, moto):
                proc.terminate()
                proc.wait()
    rows = aggregate(cs, runs, images[0].nbytes)
    text = report(args, cs, rows, stored, ceiling)
    print(text)
    if not (args.tiny or args.peers_only):
        save(RESULTS, text, cs, rows, args.batch)


def save(folder: Path, text: str, cs: list[Contender], rows: dict[str, Any], batch: int) -> None:
    """remote.md (the report) and remote.png: each contender's MiB/s in epoch 0 (opening
    included, caches empty) and epoch 1, as a ratio to the strongest peer in that epoch;
    contenders that failed are left out."""
    folder.mkdir(exist_ok=True)
    (folder / "remote.md").write_text(text)
    ran = [c for c in cs if all(isinstance(rows[label], dict) for label in c.labels)]
    metrics = {
        name: [rows[c.labels[e]]["mibps"] for c in ran]
        for e, name in enumerate(("epoch 0 MiB/s (cold)", "epoch 1 MiB/s"))
    }
    title = f"From S3 (moto), batch {batch}: ratio to the strongest peer"
    ratio_chart(folder / "remote.png", title, [c.name for c in ran], metrics)


if __name__ == "__main__":
    main()
