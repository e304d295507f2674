"""GPU hand-off benchmark: how fast batches arrive on the device, every path side by side.

Workload: the store benchmark's (``structured``: 20000 records of (3, 64, 64) uint8, batches
of 256 random indices) from zstd and raw stores, and the insitu benchmark's Zarr array
(2000 x 181 x 360 float32 in (8, 181, 360) zstd chunks, batch 32, train split). Rows, with
16 and 2 gather threads side by side: gather alone (into page-locked memory), host-to-device
copy rates (pinned and pageable), the chute loader + ``to_torch(batch, device=...)`` (a
pageable copy), the chute device loader (``to_device``, zstd and raw), loaderx's loader +
``.to(device)``, torch's ``DataLoader`` (as many workers, ``pin_memory=True``) over a
memory-mapped ``.npy``, and ``chute.insitu`` alone, + ``to_torch``, and through
``to_device``. GB/s of batch data delivered (the device synchronized at the end).

On a GPU host (no network needed; it builds chute's compiled core in place with
``setup.py build_ext --inplace`` if it is not built for this Python)::

    python bench/gpu.py [--wheels DIR] [--batches 200] [--threads 16 2]

``--wheels DIR`` installs the wheels there first (loaderx 0.7.3 and cffi, pycparser; zarr
and its needs for the insitu rows); a contender whose package is missing is reported as
skipped. Writes bench/results/gpu.md. Without CUDA, ``--cpu-smoke`` runs every path at a
tiny size with ``device="cpu"`` (pinned and copy rows skipped) to show the script works,
and writes bench/data/gpu-smoke.md (ignored by git).
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

GB = 1e9
TARGETS = (
    "device loader, zstd, most threads: >= 15 GB/s, >= 3x loaderx, >= 0.65x gather alone, "
    ">= 10x torch"
)
TORCH_ROW = "torch DataLoader (a worker per thread), pin_memory=True, memmapped .npy"


def ensure_core() -> None:
    """chute's compiled core, built in place for this Python when it is missing."""
    try:
        importlib.import_module("chute._native._zrecord")
        importlib.import_module("chute._native._sampler")
    except ImportError:
        print("building chute's compiled core for", sys.version.split()[0], flush=True)
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=REPO, check=True
        )
        importlib.invalidate_caches()
        for name in [m for m in sys.modules if m == "chute" or m.startswith("chute.")]:
            del sys.modules[name]  # the failed import left parts of the package behind
        importlib.import_module("chute._native._zrecord")


def install_wheels(folder: str) -> None:
    target = Path(tempfile.mkdtemp(prefix="chute-bench-site-"))
    wheels = sorted(str(p) for p in Path(folder).glob("*.whl"))
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
             "--target", str(target), *wheels],
            check=True,
        )  # fmt: skip
        sys.path.insert(0, str(target))


def optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class Bench:
    """Timing on one device: warm up, then ``batches`` steps, the device synchronized."""

    def __init__(self, device: str, batches: int, warmup: int) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.cuda = device.startswith("cuda")
        self.batches, self.warmup = batches, warmup

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def rate(self, step: Callable[[], int]) -> float:
        """GB/s of ``step()`` (which returns the bytes it delivered)."""
        for _ in range(self.warmup):
            step()
        self.sync()
        start, total = time.perf_counter(), 0
        for _ in range(self.batches):
            total += step()
        self.sync()
        return total / (time.perf_counter() - start) / GB

    def pinned(self, nbytes: int) -> np.ndarray:
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=self.cuda)
        return t.numpy()


# -- the store workload ------------------------------------------------------------------------


def write_stores(root: Path, images: np.ndarray) -> None:
    import chute

    np.save(root / "images.npy", images)
    for codec in ("zstd", "raw"):
        chute.write_dataset(root / f"c-{codec}.zr", images, codec=codec, progress=False).close()
    loaderx = optional("loaderx")
    if loaderx is not None:
        loaderx.write_dataset(str(root / "l-zstd.zr"), images, codec="zstd")


def store_rows(b: Bench, root: Path, threads: int, batch: int, n: int) -> dict[str, float | str]:
    import torch

    import chute
    from chute.frameworks import to_device, to_torch

    rows: dict[str, float | str] = {}
    rng = np.random.default_rng(0)
    record = np.load(root / "images.npy", mmap_mode="r")[0]
    batch_bytes = batch * record.nbytes

    for codec in ("zstd", "raw"):
        ds = chute.Dataset(root / f"c-{codec}.zr", threads=threads)
        out = b.pinned(batch_bytes).reshape(batch, *record.shape)

        def gather(ds: Any = ds, out: np.ndarray = out) -> int:
            ds.gather_into(rng.integers(0, n, batch), out)
            return batch_bytes

        rows[f"chute {codec} gather alone (into pinned memory)"] = b.rate(gather)
        ds.close()

    def loader(codec: str) -> Any:
        ds = chute.Dataset(root / f"c-{codec}.zr", threads=threads)
        return chute.DataLoader(  # as many batches ahead as threads, twice: all stay busy
            {"x": ds}, batch, sampler="iid", seed=1, num_threads=threads, prefetch=2 * threads
        )

    with loader("zstd") as dl:
        rows["chute DataLoader (zstd) + to_torch(batch, device) (pageable copy)"] = b.rate(
            lambda: to_torch(next(dl), device=b.device)["x"].nbytes
        )
    for codec in ("zstd", "raw"):
        with to_device(loader(codec), b.device, depth=2) as dev:
            rows[f"**chute to_device(DataLoader) ({codec})**"] = b.rate(
                lambda dev=dev: next(dev)["x"].nbytes
            )

    jax = optional("jax")
    if jax is None:
        rows["chute to_device(DataLoader) (zstd), JAX"] = "skipped: JAX not installed"
    else:
        target = jax.devices("gpu" if b.cuda else "cpu")[0]
        with to_device(loader("zstd"), target, depth=2) as dev:
            rows["chute to_device(DataLoader) (zstd), JAX"] = b.rate(
                lambda dev=dev: jax.block_until_ready(next(dev)["x"]).nbytes
            )

    loaderx = optional("loaderx")
    if loaderx is None:
        rows["loaderx DataLoader + .to(device)"] = "skipped: loaderx not installed"
    else:
        lx = loaderx.DataLoader(
            {"x": loaderx.Dataset(str(root / "l-zstd.zr"))},
            num_workers=threads,
            batch_size=batch,
            prefetch_size=2 * threads,
            mode=2,
        )
        it = iter(lx)
        rows["loaderx DataLoader + .to(device)"] = b.rate(
            lambda: torch.from_numpy(np.asarray(next(it)["x"])).to(b.device).nbytes
        )
        lx.close()

    images = np.load(root / "images.npy", mmap_mode="r")
    tdl = torch.utils.data.DataLoader(
        _Memmap(root / "images.npy"),
        batch_size=batch,
        shuffle=True,
        num_workers=threads,
        pin_memory=b.cuda,
        persistent_workers=True,
        drop_last=True,
    )
    epochs = _endless(tdl)
    rows[TORCH_ROW] = b.rate(lambda: next(epochs).to(b.device, non_blocking=True).nbytes)
    epochs.close()
    del tdl, images
    return rows


class _Memmap:
    """torch map-style dataset: one record per index from the memory map (opened lazily)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.n = len(np.load(path, mmap_mode="r"))
        self._mm: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if self._mm is None:
            self._mm = np.load(self.path, mmap_mode="r")
        return np.array(self._mm[i])


def _endless(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def copy_rows(b: Bench, nbytes: int) -> dict[str, float | str]:
    if not b.cuda:
        return {"host-to-device copy, pinned / pageable": "skipped: no CUDA"}
    torch = b.torch
    pinned = torch.from_numpy(b.pinned(nbytes))
    pageable = torch.from_numpy(np.ones(nbytes, np.uint8))
    fast = b.rate(lambda: pinned.to(b.device, non_blocking=True).nbytes)
    slow = b.rate(lambda: pageable.to(b.device).nbytes)
    return {"host-to-device copy, pinned / pageable": f"{fast:.1f} / {slow:.1f}"}


# -- the insitu workload -----------------------------------------------------------------------


def insitu_archive(root: Path, smoke: bool) -> tuple[str, int]:
    """The insitu benchmark's array (or a tiny one of the same layout); its path and batch."""
    import insitu

    if not smoke:
        insitu.make_archive()
        return str(insitu.ARCHIVE), insitu.BATCH
    import zarr
    from zarr.codecs import ZstdCodec

    path = root / "tiny.zarr"
    group = zarr.open_group(str(path), mode="w")
    arr = group.create_array(
        "t2m", shape=(160, 18, 36), chunks=(8, 18, 36), dtype="f4", compressors=ZstdCodec(level=3)
    )
    arr[:] = np.random.default_rng(0).standard_normal((160, 18, 36), dtype=np.float32)
    return str(path), 8


def insitu_rows(b: Bench, url: str, batch: int, threads: int) -> dict[str, float | str]:
    if optional("zarr") is None:
        return {"chute.insitu rows": "skipped: zarr not installed"}
    from chute.frameworks import to_device, to_torch
    from chute.insitu import InSituDataset, open_geometries, split_by_chunk

    def dataset() -> Any:
        geoms = open_geometries(url, ["t2m"])
        manifest = split_by_chunk(geoms["t2m"], (0.8, 0.1, 0.1))
        return InSituDataset(url, manifest, geoms, batch_size=batch, decode_threads=threads)

    def endless(source: Any) -> Iterator[Any]:
        while True:
            yield from source

    rows: dict[str, float | str] = {}
    with dataset() as ds:
        it = endless(ds.train)
        rows["chute.insitu alone (host batches)"] = b.rate(lambda: next(it)["t2m"].nbytes)
    with dataset() as ds:
        it = endless(ds.train)
        rows["chute.insitu + to_torch(batch, device) (pageable copy)"] = b.rate(
            lambda: to_torch(next(it), device=b.device)["t2m"].nbytes
        )
    with dataset() as ds:
        it = endless(to_device(ds.train, b.device, depth=2))
        rows["**chute.insitu to_device(ds.train)**"] = b.rate(lambda: next(it)["t2m"].nbytes)
    return rows


# -- the report --------------------------------------------------------------------------------


def cell(value: float | str) -> str:
    return f"{value:.2f}" if isinstance(value, float) else value


def targets(rows: dict[str, float | str]) -> list[list[str]]:
    def get(key: str) -> float | None:
        value = rows.get(key)
        return value if isinstance(value, float) else None

    dev = get("**chute to_device(DataLoader) (zstd)**")
    refs = {
        ">= 15 GB/s": (dev, 15.0, 1.0),
        ">= 3x loaderx": (dev, 3.0, get("loaderx DataLoader + .to(device)")),
        ">= 0.65x gather alone": (dev, 0.65, get("chute zstd gather alone (into pinned memory)")),
        ">= 10x torch DataLoader": (
            dev,
            10.0,
            next(
                (v for k, v in rows.items() if k.startswith("torch") and isinstance(v, float)), None
            ),
        ),
    }
    out = []
    for name, (value, want, ref) in refs.items():
        if value is None or ref is None:
            out.append([name, "n/a", "-"])
            continue
        got = value / ref
        out.append(
            [name, f"{got:.2f}" + ("" if ref == 1.0 else "x"), "yes" if got >= want else "no"]
        )
    return out


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--threads", type=int, nargs="+", default=[16, 2])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--wheels", default=None, help="install these wheels first")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny run on CPU, no CUDA")
    parser.add_argument("--workdir", default=None, help="where to write the stores (temp)")
    args = parser.parse_args()
    if args.wheels:
        install_wheels(args.wheels)
    ensure_core()
    import torch
    from store import structured  # the store benchmark's workload

    smoke = args.cpu_smoke
    if smoke:
        args.records, args.batches, args.threads = 600, 6, [2, 1]
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU host, or pass --cpu-smoke")
    device = "cpu" if smoke else "cuda"
    batch = 32 if smoke else 256
    bench = Bench(device, args.batches, warmup=2 if smoke else 20)
    columns: dict[int, dict[str, float | str]] = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        root = Path(tmp)
        images = structured(args.records)
        write_stores(root, images)
        url, insitu_batch = insitu_archive(root, smoke)
        os.sync()
        for threads in args.threads:
            print(f"measuring with {threads} threads", flush=True)
            rows = copy_rows(bench, batch * images[0].nbytes)
            rows |= store_rows(bench, root, threads, batch, args.records)
            rows |= insitu_rows(bench, url, insitu_batch, threads)
            columns[threads] = rows
    names = list(next(iter(columns.values())))
    body = [[name, *(cell(columns[t].get(name, "-")) for t in args.threads)] for name in names]
    gpu = torch.cuda.get_device_name() if bench.cuda else "none (CPU smoke run)"
    title = " (CPU smoke run: sizes are tiny, numbers mean nothing)" if smoke else ""
    archive = url.rstrip("/").split("/")[-1]
    text = (
        f"# GPU hand-off benchmark{title}\n\n"
        f"GPU: {gpu}; {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"torch {torch.__version__}. Store workload: {args.records} records of "
        f"{images.shape[1:]} uint8, batches of {batch} random indices; insitu: {archive}, "
        f"batch {insitu_batch}. GB/s of batch data on the device ({args.batches} batches after "
        f"warm-up, synchronized).\n\n"
        + table(["path", *(f"{t} threads" for t in args.threads)], body)
        + f"\n\nTargets ({TARGETS}), at {args.threads[0]} threads:\n\n"
        + table(["target", "measured", "met"], targets(columns[args.threads[0]]))
        + "\n"
    )  # fmt: skip
    print(text)
    out = HERE / "data" / "gpu-smoke.md" if smoke else HERE / "results" / "gpu.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print("wrote", out)


if __name__ == "__main__":
    main()
