"""In-place Zarr loader benchmark: chute.insitu against insitubatch 0.2.0, plain zarr and torch.

Workload (the issue's): a local Zarr v3 array of 2000 x 181 x 360 float32 standard-normal
values in (8, 181, 360) zstd chunks; train split 0.8, batch 32. Every engine runs in its own
process (so peak RSS is its own), side by side in one run, and is reported as a ratio to
insitubatch's defaults, since the machines here are shared and noisy. insitubatch needs
Python 3.12: it runs from a venv under bench/data/ that this script makes if missing.

    python bench/insitu.py [--reps 3] [--s3] [--plot]
    python bench/insitu.py --tiny --only-new   # a smoke run of the chute-only rows

Besides the engine comparison it measures chute alone: an Icechunk repository of the same
data against the plain Zarr archive, two processes reading the archive at once with and
without a shared ``cache_dir`` (decodes counted, throughput), and the time to first batch
from a cold start (opening the archive included).

Writes bench/results/insitu.md (and insitu.png with --plot); --tiny writes nothing there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _charts import ratio_chart

ROOT = Path(__file__).resolve().parent
TINY = os.environ.get("CHUTE_BENCH_TINY") == "1"  # set by --tiny, seen by the workers too
DATA = ROOT / "data" / ("insitu-tiny" if TINY else "insitu")
ARCHIVE = DATA / "era5.zarr"
ICECHUNK = DATA / "era5.icechunk"
PEER_VENV = ROOT / "data" / "insitu" / "venv-insitubatch"
RESULTS = ROOT / "results"
SHAPE, CHUNKS = ((160, 18, 36), (8, 18, 36)) if TINY else ((2000, 181, 360), (8, 181, 360))
BATCH = 32
CAPPED = 256  # samples per epoch for the per-sample engines (they are 10x slower)
S3_OPTIONS = {
    "region": "us-east-1",
    "access_key_id": "bench",
    "secret_access_key": "bench",
    "client_options": {"allow_http": True},
}


# -- data -----------------------------------------------------------------------------------


def make_archive() -> None:
    """Write the workload once (about 460 MB on disk)."""
    if (ARCHIVE / "t2m" / "zarr.json").exists():
        return
    import zarr
    from zarr.codecs import ZstdCodec

    root = zarr.open_group(str(ARCHIVE), mode="w")
    arr = root.create_array(
        "t2m", shape=SHAPE, chunks=CHUNKS, dtype="f4", compressors=ZstdCodec(level=3)
    )
    rng = np.random.default_rng(0)
    for start in range(0, SHAPE[0], 200):
        rows = min(200, SHAPE[0] - start)
        arr[start : start + rows] = rng.standard_normal((rows, *SHAPE[1:]), dtype=np.float32)


def make_icechunk() -> None:
    """The same array, chunks and codec, committed to a local Icechunk repository."""
    if ICECHUNK.exists():
        return
    import icechunk
    import zarr

    src = zarr.open_array(str(ARCHIVE), path="t2m", mode="r")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(ICECHUNK)))
    session = repo.writable_session("main")
    root = zarr.open_group(session.store, mode="w")
    arr = root.create_array(
        "t2m", shape=src.shape, chunks=src.chunks, dtype=src.dtype, compressors=src.compressors
    )
    for start in range(0, SHAPE[0], 200):
        arr[start : start + 200] = src[start : start + 200]
    session.commit("the benchmark archive")


def peer_python() -> Path:
    """The Python 3.12 venv with insitubatch 0.2.0 (made on first use)."""
    exe = PEER_VENV / "bin" / "python"
    if not exe.exists():
        # pyenv's shim exists even where no 3.12 is selected: take an interpreter that runs
        found = sorted(Path.home().glob(".pyenv/versions/3.12.*/bin/python3.12"))
        candidates = [*map(str, found), shutil.which("python3.12")]
        py312 = next(c for c in candidates if c and subprocess.run(
            [c, "-c", ""], capture_output=True).returncode == 0)  # fmt: skip
        subprocess.run([py312, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run(
            [str(exe), "-m", "pip", "install", "-q", "insitubatch==0.2.0", "psutil"], check=True
        )
    return exe


# -- measuring inside a worker ------------------------------------------------------------------


class PeakRss:
    """Peak resident memory of this process and its children, sampled every 10 ms.

    Finding the children scans every process on the machine (about 1.5 ms of CPU, holding
    the GIL), so the list is refreshed every 20th sample only; reading the RSS of known
    processes is cheap. The sampler thus costs the engine it measures well under 1% of a
    core instead of about 13%.
    """

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        procs: list[Any] = []
        for tick in itertools.count():
            if self._stop.wait(0.01):
                return
            try:
                if not procs or tick % 20 == 0:
                    procs = [self._proc, *self._proc.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in procs))
            except Exception:  # a child exiting mid-sample: look for the children again
                procs = []

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(self.peak, own)


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (DataLoader workers)."""
    import psutil

    t = psutil.Process().cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def measure(
    epochs: Callable[[int], Iterator[np.ndarray]], n_epochs: int = 2, cold: float | None = None
) -> dict[str, Any]:
    """MB/s per epoch, MB per CPU-second (insensitive to other load on the machine) and
    time to the first batch of epoch 0, from a batch generator; with ``cold`` (when the
    worker began opening the archive) also the time from then to the first batch."""
    out: dict[str, Any] = {}
    for epoch in range(n_epochs):
        start, cpu = time.perf_counter(), cpu_seconds()
        nbytes, first = 0, None
        for arr in epochs(epoch):
            if first is None:
                first = time.perf_counter() - start
            nbytes += arr.nbytes
        elapsed = time.perf_counter() - start
        out[f"epoch{epoch}_mbps"] = nbytes / elapsed / 1e6
        if epoch == 0:
            out["first_batch_ms"] = (first or 0.0) * 1e3
            if cold is not None:
                out["ttfb_cold_ms"] = (start + (first or 0.0) - cold) * 1e3
            out["epoch0_mb_per_cpu_s"] = nbytes / max(cpu_seconds() - cpu, 1e-9) / 1e6
    return out


def _wait_for_peers(sync: Path, kind: str, peers: int) -> None:
    (sync / f"{kind}-{os.getpid()}").touch()
    deadline = time.monotonic() + 600
    while len(list(sync.glob(f"{kind}-*"))) < peers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"peers did not reach {kind!r}")
        time.sleep(0.005)


def worker_chute(url: str, options: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """chute on ``url`` (``icechunk:PATH`` opens a repository's main branch read-only);
    ``_sync``/``_peers`` in ``kw`` line this process up with others reading at once."""
    from chute.insitu import InSituDataset, open_geometries, split_by_chunk

    cold = time.perf_counter()  # imports done: the cold start opens the archive
    sync = kw.pop("_sync", None)
    peers = int(kw.pop("_peers", 1))
    source: Any = url
    if url.startswith("icechunk:"):
        import icechunk

        storage = icechunk.local_filesystem_storage(url.removeprefix("icechunk:"))
        source = icechunk.Repository.open(storage).readonly_session("main")
    geoms = open_geometries(source, ["t2m"], **options)
    manifest = split_by_chunk(geoms["t2m"], (0.8, 0.1, 0.1))
    ds = InSituDataset(source, manifest, geoms, batch_size=BATCH, **kw, **options)
    if sync is not None:
        _wait_for_peers(Path(sync), "ready", peers)
        cold = time.perf_counter()

    def epochs(epoch: int) -> Iterator[np.ndarray]:
        ds.set_epoch(epoch)
        return (b["t2m"] for b in ds.train)

    result = measure(epochs, cold=cold)
    if sync is not None:
        _wait_for_peers(Path(sync), "done", peers)  # nobody leaves the shared pool early
    info = ds.describe()
    result["limiting_stage"] = info["limiting_stage"]
    result["config"] = {k: info["config"][k] for k in ("max_inflight", "block_chunks")}
    result["decodes"] = info["stats"]["decodes"]
    ds.close()
    return result


def worker_insitubatch(url: str, options: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    import insitubatch
    from insitubatch.source import InSituDataset

    cold = time.perf_counter()

    if "://" not in url:
        url = Path(url).absolute().as_uri()
    store = insitubatch.obstore_store(url, **options)
    geoms = insitubatch.open_geometries(store, ["t2m"])
    manifest = insitubatch.split_by_chunk(geoms["t2m"], fractions=(0.8, 0.1, 0.1))
    ds = InSituDataset(store, manifest, geoms, batch_size=BATCH, **kw)

    def epochs(epoch: int) -> Iterator[np.ndarray]:
        ds.set_epoch(epoch)
        return (b.arrays["t2m"] for b in ds.train)

    result = measure(epochs, cold=cold)
    ds.close()
    return result


def _train_indices(epoch: int) -> np.ndarray:
    n_train = round(0.8 * SHAPE[0] / CHUNKS[0]) * CHUNKS[0]
    return np.random.default_rng(epoch).permutation(n_train)[:CAPPED]


def worker_zarr(url: str, options: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    import zarr

    arr = zarr.open_array(url, path="t2m", mode="r")

    def epochs(epoch: int) -> Iterator[np.ndarray]:
        batch: list[np.ndarray] = []
        for i in _train_indices(epoch):
            batch.append(np.asarray(arr[int(i)]))
            if len(batch) == BATCH:
                yield np.stack(batch)
                batch = []

    return measure(epochs)


class _ZarrSamples:
    """A map-style dataset reading one sample per ``__getitem__`` (opened per worker)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._arr: Any = None

    def __len__(self) -> int:
        return SHAPE[0]

    def __getitem__(self, i: int) -> np.ndarray:
        if self._arr is None:
            import zarr

            self._arr = zarr.open_array(self.url, path="t2m", mode="r")
        return np.asarray(self._arr[i])


def worker_torch(url: str, options: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)

    def epochs(epoch: int) -> Iterator[np.ndarray]:
        loader = DataLoader(
            _ZarrSamples(url),
            batch_size=BATCH,
            sampler=[int(i) for i in _train_indices(epoch)],
            num_workers=2,
        )
        return (b.numpy() for b in loader)

    return measure(epochs)


def worker_fetch_cost(url: str, options: dict[str, Any], kw: dict[str, Any]) -> dict[str, Any]:
    """CPU milliseconds per MB to fetch every stored chunk once (4 in flight) through a
    store's ``get``, and to zstd-decode them: what bounds a CPU-bound run on 2 cores.
    ``readv:PATH`` reads the chunk files with chute's own local read instead (``readv``
    into one reused per-thread buffer, no new allocation per chunk)."""
    import asyncio

    import zarr
    from numcodecs import Zstd
    from zarr.core.buffer import default_buffer_prototype

    readv = url.startswith("readv:")
    url = url.removeprefix("readv:")
    if url.startswith("icechunk:"):
        import icechunk

        storage = icechunk.local_filesystem_storage(url.removeprefix("icechunk:"))
        store: Any = icechunk.Repository.open(storage).readonly_session("main").store
    else:
        store = zarr.storage.LocalStore(url, read_only=True)
    arr = zarr.open_array(store, path="t2m", mode="r")
    n_chunks = -(-arr.shape[0] // arr.chunks[0])
    keys = [f"t2m/{arr.metadata.encode_chunk_key((i, 0, 0))}" for i in range(n_chunks)]
    fetched: list[np.ndarray] = []

    async def fetch_all() -> None:
        sem = asyncio.Semaphore(4)

        async def one(key: str) -> None:
            async with sem:
                buf = await store.get(key, prototype=default_buffer_prototype())
                fetched.append(buf.as_numpy_array())

        await asyncio.gather(*(one(k) for k in keys))

    asyncio.run(fetch_all())  # once to warm the page cache and the store's own caches
    if readv:
        from chute.insitu._decode import _read_file  # the very read chute's engine does
        from chute.insitu._files import ArchiveFiles

        files = ArchiveFiles(url)
        cpu = time.process_time()
        for key in keys:
            _read_file(files, key, 1 << 40)
        fetch_cpu = time.process_time() - cpu
    else:
        fetched.clear()
        cpu = time.process_time()
        asyncio.run(fetch_all())
        fetch_cpu = time.process_time() - cpu
    stored = sum(f.nbytes for f in fetched)
    codec, out = Zstd(), np.empty(int(np.prod(arr.chunks)) * 4, dtype=np.uint8)
    cpu = time.process_time()
    for f in fetched:
        codec.decode(f, out=out)
    decode_cpu = time.process_time() - cpu
    return {
        "fetch_ms_per_mb": fetch_cpu / stored * 1e9,
        "decode_ms_per_mb": decode_cpu / stored * 1e9,
    }


WORKERS = {
    "fetch_cost": worker_fetch_cost,
    "chute": worker_chute,
    "insitubatch": worker_insitubatch,
    "zarr": worker_zarr,
    "torch": worker_torch,
}


def worker_main(engine: str, url: str, options: str, kw: str) -> None:
    rss = PeakRss()
    result = WORKERS[engine](url, json.loads(options), json.loads(kw))
    result["peak_rss_mb"] = rss.stop() / 2**20
    print("RESULT " + json.dumps(result))


# -- the driver -----------------------------------------------------------------------------------


def _start_engine(
    engine: str, url: str, options: dict[str, Any] | None, kw: dict[str, Any] | None
) -> subprocess.Popen[str]:
    python = str(peer_python()) if engine == "insitubatch" else sys.executable
    args = [engine, url, json.dumps(options or {}), json.dumps(kw or {})]
    cmd = [python, __file__, "--worker", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _result_of(proc: subprocess.Popen[str], what: str) -> dict[str, Any]:
    stdout, stderr = proc.communicate(timeout=900)
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise RuntimeError(f"{what} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}")


def run_engine(
    engine: str, url: str, options: dict[str, Any] | None = None, kw: dict[str, Any] | None = None
) -> dict[str, Any]:
    return _result_of(_start_engine(engine, url, options, kw), f"{engine} {kw}")


def run_pair(url: str, cache_dir: Path | None) -> dict[str, Any]:
    """Two chute processes reading ``url`` at the same time, with or without a shared
    ``cache_dir``: decodes summed, throughput as all bytes over the slower one's time."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=DATA) as sync:
        kw: dict[str, Any] = {"_sync": sync, "_peers": 2}
        if cache_dir is not None:
            kw["cache_dir"] = str(cache_dir)
        procs = [_start_engine("chute", url, None, dict(kw)) for _ in range(2)]
        runs = [_result_of(p, f"chute pair (cache_dir={cache_dir})") for p in procs]
    return {
        "decodes": sum(r["decodes"] for r in runs),
        # both processes read the same bytes: together, twice that over the slower's time
        "epoch0_mbps": 2 * min(r["epoch0_mbps"] for r in runs),
        "epoch1_mbps": 2 * min(r["epoch1_mbps"] for r in runs),
        "ttfb_cold_ms": max(r["ttfb_cold_ms"] for r in runs),
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("epoch0_mbps", "epoch1_mbps", "first_batch_ms", "peak_rss_mb", "epoch0_mb_per_cpu_s")
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out.update({k: v for k, v in runs[0].items() if k not in keys})
    return out


def s3_upload(endpoint: str, bucket: str) -> str:
    import obstore
    from obstore.store import S3Store

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")).close()
    store = S3Store(bucket, endpoint=endpoint, **S3_OPTIONS)  # type: ignore[arg-type]
    files = [p for p in ARCHIVE.rglob("*") if p.is_file()]

    def put(p: Path) -> None:
        obstore.put(store, f"era5.zarr/{p.relative_to(ARCHIVE)}", p.read_bytes())

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))
    return f"s3://{bucket}/era5.zarr"


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # its first answer loads moto's backends: slow under load
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=10).close()
            return proc, endpoint
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.2)


TUNED = [
    {"max_inflight": 2, "block_chunks": 8},
    {"max_inflight": 4, "block_chunks": 8},
    {"max_inflight": 4, "block_chunks": 16},
    {"max_inflight": 8, "block_chunks": 16},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per default engine (median)")
    parser.add_argument("--s3", action="store_true", help="add rows read from a local moto S3")
    parser.add_argument("--plot", action="store_true", help="also write bench/results/insitu.png")
    parser.add_argument("--tiny", action="store_true", help="a small archive, to smoke-test")
    parser.add_argument(
        "--only-new", action="store_true", help="only chute's Icechunk, cache_dir and TTFB rows"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(*args.worker)
        return
    if args.tiny and not TINY:  # re-run with the tiny geometry seen by every worker too
        env = {**os.environ, "CHUTE_BENCH_TINY": "1"}
        argv = [a for a in sys.argv[1:] if a != "--tiny"]
        sys.exit(subprocess.run([sys.executable, __file__, *argv], env=env).returncode)

    DATA.mkdir(parents=True, exist_ok=True)
    make_archive()
    url = str(ARCHIVE)
    new = chute_rows(url, max(1, args.reps))
    text = report_chute(new)
    print(text)
    if not TINY:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "insitu-chute.md").write_text(text)
        if args.plot:
            runs = {k: v for k, v in new.items() if not k.startswith("fetch cost")}
            ratio_chart(
                RESULTS / "insitu-chute.png",
                "chute alone: ratio to plain Zarr read by one process",
                list(runs),
                {
                    "epoch 0 MB/s": [r["epoch0_mbps"] for r in runs.values()],
                    "epoch 1 MB/s": [r["epoch1_mbps"] for r in runs.values()],
                },
                ours="",
                baseline="plain Zarr, local",
            )
    if args.only_new:
        return
    peer_python()
    rows: dict[str, dict[str, Any]] = {}
    configs: list[tuple[str, dict[str, Any]]] = [
        ("chute", {}),
        ("insitubatch", {}),
        *(("insitubatch", kw) for kw in TUNED),
    ]
    runs: list[list[dict[str, Any]]] = [[] for _ in configs]
    for rep in range(args.reps):  # round-robin, so drift in machine load hits all alike
        print(f"rep {rep + 1}/{args.reps}: chute, insitubatch default and tuned", flush=True)
        for k, (engine, kw) in enumerate(configs):
            runs[k].append(run_engine(engine, url, kw=kw))
    rows["chute (defaults)"] = median_of(runs[0])
    rows["insitubatch 0.2.0 (defaults)"] = median_of(runs[1])
    tuned = [(median_of(r), kw) for r, (_, kw) in zip(runs[2:], configs[2:], strict=True)]
    best, best_kw = max(tuned, key=lambda t: t[0]["epoch0_mbps"])
    label = ", ".join(f"{k}={v}" for k, v in best_kw.items())
    rows[f"insitubatch 0.2.0 (best tuned: {label})"] = best
    print("zarr, one sample at a time", flush=True)
    rows[f"zarr, one random sample at a time ({CAPPED} samples/epoch)"] = run_engine("zarr", url)
    print("torch DataLoader", flush=True)
    rows[f"torch DataLoader, 2 workers ({CAPPED} samples/epoch)"] = run_engine("torch", url)
    if args.s3:
        proc, endpoint = start_moto()
        try:
            print("uploading to moto S3", flush=True)
            s3_url = s3_upload(endpoint, "bench")
            options = {**S3_OPTIONS, "endpoint": endpoint}
            s3_runs: dict[str, list[dict[str, Any]]] = {"chute": [], "insitubatch": []}
            for rep in range(args.reps):  # taking turns, as the local rows do
                print(f"s3 rep {rep + 1}/{args.reps}", flush=True)
                for engine, engine_runs in s3_runs.items():
                    engine_runs.append(run_engine(engine, s3_url, options))
            rows["chute, s3:// (moto)"] = median_of(s3_runs["chute"])
            rows["insitubatch 0.2.0, s3:// (moto, defaults)"] = median_of(s3_runs["insitubatch"])
        finally:
            proc.terminate()
            proc.wait()
    report(rows, tuned, args.plot)


def chute_rows(url: str, reps: int) -> dict[str, dict[str, Any]]:
    """chute alone: Icechunk against plain Zarr, two processes with and without a shared
    cache_dir, and cold time to first batch; engines take turns, medians of ``reps``."""
    import shutil as _shutil

    make_icechunk()
    cache = DATA / "cache"
    configs: dict[str, Callable[[], dict[str, Any]]] = {
        "plain Zarr, local": lambda: run_engine("chute", url),
        "Icechunk, local (same data)": lambda: run_engine("chute", f"icechunk:{ICECHUNK}"),
        "two processes, no cache_dir": lambda: run_pair(url, None),
        "two processes, shared cache_dir": lambda: run_pair(url, cache),
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in configs}
    fetch_runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(reps):
        print(f"rep {rep + 1}/{reps}: chute rows", flush=True)
        for name, run in configs.items():
            if name.endswith("shared cache_dir"):
                _shutil.rmtree(cache, ignore_errors=True)
                cache.mkdir()
            runs[name].append(run())
        fetchers = (
            ("plain files, as chute reads them", f"readv:{url}"),
            ("plain files", url),
            ("Icechunk", f"icechunk:{ICECHUNK}"),
        )
        for name, source in fetchers:
            fetch_runs.setdefault(name, []).append(run_engine("fetch_cost", source))
    _shutil.rmtree(cache, ignore_errors=True)
    keys = ("epoch0_mbps", "epoch1_mbps", "ttfb_cold_ms", "decodes")
    rows = {
        name: {k: statistics.median(r[k] for r in rs) for k in keys if k in rs[0]}
        for name, rs in runs.items()
    }
    for name, rs in fetch_runs.items():
        rows[f"fetch cost: {name}"] = {
            k: statistics.median(r[k] for r in rs) for k in ("fetch_ms_per_mb", "decode_ms_per_mb")
        }
    return rows


def report_chute(rows: dict[str, dict[str, Any]]) -> str:
    plain, ice = rows["plain Zarr, local"], rows["Icechunk, local (same data)"]
    alone, shared = rows["two processes, no cache_dir"], rows["two processes, shared cache_dir"]
    n_chunks = -(-SHAPE[0] // CHUNKS[0])
    lines = [
        "# In-place Zarr benchmark: chute alone",
        "",
        f"chute alone ({SHAPE} float32, chunks {CHUNKS}); two-process rows: both processes "
        "read the whole archive at once, throughput is their bytes together over the slower's "
        f"time; decodes are summed over both ({n_chunks} chunks in the archive).",
        "",
        "| row | epoch 0 MB/s | epoch 1 MB/s | cold TTFB ms | decodes |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        if not name.startswith("fetch cost"):
            lines.append(
                f"| {name} | {r['epoch0_mbps']:.0f} | {r['epoch1_mbps']:.0f} | "
                f"{r['ttfb_cold_ms']:.1f} | {r.get('decodes', 0):.0f} |"
            )
    own, files = (
        rows["fetch cost: plain files, as chute reads them"],
        rows["fetch cost: plain files"],
    )
    ice_fetch = rows["fetch cost: Icechunk"]
    decode = own["decode_ms_per_mb"]

    def ceiling(fetch: dict[str, float]) -> float:
        return (own["fetch_ms_per_mb"] + decode) / (fetch["fetch_ms_per_mb"] + decode)

    lines += [
        "",
        "Why Icechunk reads slower here: CPU milliseconds per stored MB to fetch every chunk "
        "once (page cache warm) and to zstd-decode it. chute reads a plain local archive's "
        "chunk files itself (`readv` into a reused buffer); an Icechunk repository only "
        "through its store's `get`, like any other zarr store (zarr's LocalStore shown for "
        "comparison). With both cores busy, epoch 0 is bound by fetch plus decode, so the "
        "last column is the ratio to chute's plain-file reads to expect from the CPU alone.",
        "",
        "| fetch | fetch CPU ms/MB | decode CPU ms/MB | CPU-bound estimate |",
        "|---|---:|---:|---:|",
        f"| plain files, as chute reads them (`readv`) | {own['fetch_ms_per_mb']:.2f} | "
        f"{decode:.2f} | 1.00x |",
        f"| plain files through zarr's LocalStore `get` | {files['fetch_ms_per_mb']:.2f} | "
        f"{decode:.2f} | {ceiling(files):.2f}x |",
        f"| Icechunk (local filesystem storage) `get` | {ice_fetch['fetch_ms_per_mb']:.2f} | "
        f"{decode:.2f} | {ceiling(ice_fetch):.2f}x |",
    ]
    ratio = ice["epoch0_mbps"] / plain["epoch0_mbps"]
    pair = shared["epoch0_mbps"] / alone["epoch0_mbps"]
    lines += [
        "",
        "| target | measured | goal | met |",
        "|---|---:|---:|---|",
        f"| Icechunk vs plain Zarr, epoch 0 | {ratio:.2f}x | >= 0.95x | {_met(ratio >= 0.95)} |",
        f"| shared cache_dir: decodes, two processes | {shared['decodes']:.0f} "
        f"(vs {alone['decodes']:.0f}) | one per chunk per epoch pass | "
        f"{_met(shared['decodes'] < alone['decodes'])} |",
        f"| shared cache_dir vs none, two processes, epoch 0 | {pair:.2f}x | > 1x | "
        f"{_met(pair > 1)} |",
    ]
    return "\n".join(lines) + "\n"


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def report(
    rows: dict[str, dict[str, Any]], tuned: list[tuple[dict[str, Any], dict[str, Any]]], plot: bool
) -> None:
    base = rows["insitubatch 0.2.0 (defaults)"]
    best = max(t[0]["epoch0_mbps"] for t in tuned)
    chute = rows["chute (defaults)"]
    lines = [
        "# In-place Zarr benchmark",
        "",
        "Workload: local Zarr v3, 2000 x 181 x 360 float32 standard normal, chunks (8, 181, 360),"
        " zstd; train split 0.8, batch 32; 2 epochs. Every row is the median of the repeated"
        " runs, engines taking turns; ratios are to insitubatch 0.2.0's defaults in the same"
        " run. MB per CPU-second counts the process's own CPU time, so it is the figure least"
        f" moved by other load on the machine ({os.cpu_count()} cores, shared).",
        "",
        "| engine | epoch 0 MB/s | epoch 1 MB/s | first batch ms | peak RSS MiB "
        "| epoch 0 MB per CPU-s | epoch 0 x | epoch 1 x | CPU efficiency x |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['epoch0_mbps']:.0f} | {r['epoch1_mbps']:.0f} | "
            f"{r['first_batch_ms']:.1f} | {r['peak_rss_mb']:.0f} | "
            f"{r['epoch0_mb_per_cpu_s']:.0f} | "
            f"{r['epoch0_mbps'] / base['epoch0_mbps']:.2f} | "
            f"{r['epoch1_mbps'] / base['epoch1_mbps']:.2f} | "
            f"{r['epoch0_mb_per_cpu_s'] / base['epoch0_mb_per_cpu_s']:.2f} |"
        )
    checks = [
        ("epoch-0 MB/s vs insitubatch defaults", chute["epoch0_mbps"] / base["epoch0_mbps"], 1.5),
        ("epoch-0 MB/s vs insitubatch best tuned", chute["epoch0_mbps"] / best, 1.2),
    ]
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for label, ratio, goal in checks:
        lines.append(f"| {label} | {ratio:.2f}x | >= {goal}x | {_met(ratio >= goal)} |")
    ttfb, rss = chute["first_batch_ms"], chute["peak_rss_mb"] / base["peak_rss_mb"]
    lines.append(f"| first batch | {ttfb:.1f} ms | <= 30 ms | {_met(ttfb <= 30)} |")
    lines.append(f"| peak RSS vs insitubatch defaults | {rss:.2f}x | <= 1.0x | {_met(rss <= 1)} |")
    tuned_rows = ", ".join(
        f"{kw} -> {r['epoch0_mbps']:.0f} MB/s" for r, kw in sorted(tuned, key=lambda t: str(t[1]))
    )
    lines += [
        "",
        f"insitubatch settings tried: {tuned_rows}.",
        f"chute chose {chute['config']}; describe() named the limiting stage:"
        f" {chute['limiting_stage']}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "insitu.md").write_text(text)
    if plot:
        names = list(rows)
        ratio_chart(
            RESULTS / "insitu.png",
            "In-place Zarr, batch 32: ratio to the strongest peer",
            names,
            {
                "epoch 0 MB/s": [rows[n]["epoch0_mbps"] for n in names],
                "epoch 1 MB/s": [rows[n]["epoch1_mbps"] for n in names],
                "first batch ms": [rows[n]["first_batch_ms"] for n in names],
                "peak RSS MiB": [rows[n]["peak_rss_mb"] for n in names],
            },
            lower_is_better=("first batch ms", "peak RSS MiB"),
        )


if __name__ == "__main__":
    main()
