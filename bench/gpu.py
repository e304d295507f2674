"""GPU hand-off benchmark: how fast batches arrive on the device, every path side by side.

Workload: the store benchmark's (``structured``: 20000 records of (3, 64, 64) uint8, batches
of 256 random indices) from zstd and raw stores, and an insitu Zarr array (800 x 181 x 360
float32 in (8, 181, 360) zstd chunks, batch 32, train split). Columns: the CPU threads the
path may use, 16 and 2. The loader's threads are its parallelism: a loader of T threads reads
a store opened with one thread (no pool inside a pool); a gather alone is one caller with T
store threads. Rows:

- host-to-device copy rates from pinned and from pageable memory (8 rotating batch buffers);
- gather alone into pinned memory, zstd and raw (8 rotating outputs, not one cache-hot one);
- the chute loader alone (fresh host arrays), and into the pinned ring (host only);
- the device loader, ``chute.frameworks.to_device(loader, "cuda")``, zstd and raw;
- the loader + ``to_torch(batch, device=...)`` (a pageable copy per batch);
- the device loader under a compute-bound consumer (a bf16 matmul loop sized to take about
  twice a batch's data time): milliseconds a step against the same loop alone;
- the device loader into a JAX GPU device (its own process: ``XLA_PYTHON_CLIENT_PREALLOCATE``
  off, no torch CUDA libraries beside it);
- loaderx 0.7.3's loader + ``.to("cuda")``;
- torch's ``DataLoader`` (forkserver workers, an endless sampler so no epoch restarts,
  T workers, ``pin_memory=True``) over a memory-mapped ``.npy``, + ``.to("cuda")``;
- ``chute.insitu`` alone, + ``to_torch``, and through ``to_device``.

Each row runs in a guarded section of a child process of its group (chute, JAX, loaderx,
torch's DataLoader, insitu; the children run one at a time, within a time budget): a row
that cannot run says "skipped: why" or "failed: why" in the table, and the rest go on. A
row is the median of 3 runs, each at least 2 s or 2000 batches, after a warm-up; GB/s of
batch data on the device, synchronized at the end of each run. A second table checks the
targets of issue 26.

    python bench/gpu.py                     # on a GPU host: writes bench/results/gpu.md
    python bench/gpu.py --cpu-smoke         # anywhere: every row it can, on CPU, tiny sizes

``--cpu-smoke`` runs the rows on ``device="cpu"`` (the CUDA-only rows say skipped) and writes
to ``--out`` (default a file in the temp folder), never over the GPU table. The compiled core
must be importable (``pip install -e .``, or the wheel bench/gpu-run.sh installs); nothing is
built here.

On the GPU machine (bench/GPU.md has the details): build the wheels here with
``make gpu-wheels`` (into ``.gpuwheels/``, ignored by git), then make the device tool's call

    run(command="bash bench/gpu-run.sh .gpuwheels", carry=[".gpuwheels"], timeout_s=540)

It installs the wheels into a temporary folder, checks every import, runs
tests/test_device_cuda.py and this benchmark, and leaves bench/results/gpu.md (plus the logs)
in ``$OUT``, all in under 8 minutes. Rehearse it on a CPU machine with
``bash bench/gpu-run.sh --cpu-smoke .gpuwheels``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import itertools
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if importlib.util.find_spec("chute") is None:
    sys.path.insert(0, str(REPO / "src"))  # a checkout run without chute installed
sys.path.insert(0, str(HERE))

GB = 1e9
RING = 8  # rotating buffers for the gather and copy baselines

# The table's rows, in order: key -> label (T: the column's thread count).
ROWS = {
    "copy-pinned": "host-to-device copy, pinned (8 rotating buffers)",
    "copy-pageable": "host-to-device copy, pageable (8 rotating buffers)",
    "gather-zstd": "chute zstd gather alone into pinned memory (1 caller, T store threads)",
    "gather-raw": "chute raw gather alone into pinned memory (1 caller, T store threads)",
    "loader-host": "chute DataLoader (zstd) alone, host batches (fresh arrays)",
    "loader-ring": "chute DataLoader (zstd) into the pinned ring, host",
    "device-zstd": "**chute to_device(DataLoader) (zstd)**",
    "device-raw": "chute to_device(DataLoader) (raw)",
    "to-torch": "chute DataLoader (zstd) + to_torch(batch, device) (pageable copy)",
    "compute": "to_device(DataLoader) (zstd) + compute-bound consumer: a step vs compute alone",
    "jax": "chute to_device(DataLoader) (zstd), JAX (own process)",
    "loaderx": 'loaderx 0.7.3 DataLoader (zstd) + .to("cuda")',
    "torch-dl": "torch DataLoader (forkserver, endless sampler, T workers, pin_memory) + .to",
    "insitu-host": "chute.insitu alone (host batches)",
    "insitu-torch": "chute.insitu + to_torch(batch, device) (pageable copy)",
    "insitu-device": "**chute.insitu to_device(ds.train)**",
}
GROUPS = {  # a child process each, per thread count; the first column only where marked
    "chute": ["copy-pinned", "copy-pageable", "gather-zstd", "gather-raw", "loader-host",
              "loader-ring", "device-zstd", "device-raw", "to-torch", "compute"],
    "jax": ["jax"],
    "loaderx": ["loaderx"],
    "torch-dl": ["torch-dl"],
    "insitu": ["insitu-host", "insitu-torch", "insitu-device"],
}  # fmt: skip
FIRST_ONLY = {"copy-pinned", "copy-pageable", "compute"}  # independent of the thread count
CAP_S = {"chute": 150, "jax": 60, "loaderx": 50, "torch-dl": 70, "insitu": 70}  # per child


@dataclass
class Timing:
    """How long each measurement runs: ``reps`` runs of ``seconds`` or ``batches`` steps,
    whichever comes first, after ``warmup`` seconds and at least ``warm_batches`` steps."""

    seconds: float
    batches: int
    reps: int
    warmup: float
    warm_batches: int


@dataclass
class Spec:
    """What one child measures."""

    group: str
    threads: int
    first: bool
    root: str
    smoke: bool
    records: int
    batch: int
    insitu_url: str
    insitu_batch: int
    timing: Timing


# -- the child: rows measured and printed one by one ----------------------------------------


def emit(key: str, threads: int, reps: list[float] | None = None, **extra: Any) -> None:
    """One row's result for the parent: ``reps`` in the row's unit, or ``text`` saying why."""
    print("ROW " + json.dumps({"key": key, "threads": threads, "reps": reps, **extra}),
          flush=True)  # fmt: skip


class _Skip(Exception):
    """A row that cannot run here (said as "skipped: ...")."""


class Rows:
    """Runs each row in a guarded section: an exception becomes the row's "failed: ..."."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def wanted(self, key: str) -> bool:
        return self.spec.first or key not in FIRST_ONLY

    def skip(self, key: str, why: str) -> None:
        if self.wanted(key):
            emit(key, self.spec.threads, text=f"skipped: {why}")

    def run(self, key: str, measure: Callable[[], dict[str, Any]]) -> None:
        if not self.wanted(key):
            return
        try:
            result = measure()
        except _Skip as why:
            emit(key, self.spec.threads, text=f"skipped: {why}")
        except ModuleNotFoundError as error:
            emit(key, self.spec.threads, text=f"skipped: {error.name} not installed")
        except Exception as error:
            traceback.print_exc()  # the whole story in the log; the table gets its last line
            text = f"failed: {type(error).__name__}: {error}".replace("\n", " ").replace("|", "/")
            emit(key, self.spec.threads, text=text[:160])
        else:
            emit(key, self.spec.threads, **result)


class Device:
    """Where batches go: torch's CUDA device, or the CPU in a smoke run (torch optional)."""

    def __init__(self, smoke: bool) -> None:
        torch: Any = None
        with contextlib.suppress(ImportError):
            torch = importlib.import_module("torch")
        self.torch = torch
        self.cuda = not smoke and torch is not None and bool(torch.cuda.is_available())
        self.target = "cuda" if self.cuda else "cpu"

    def need_torch(self) -> Any:
        if self.torch is None:
            raise ModuleNotFoundError("torch not installed", name="torch")
        return self.torch

    def need_cuda(self) -> Any:
        if not self.cuda:
            raise _Skip("no CUDA")
        return self.torch

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def pinned(self, nbytes: int) -> np.ndarray:
        """A flat uint8 root: page-locked (torch's allocator) with CUDA, else plain memory."""
        if not self.cuda:
            return np.empty(nbytes, np.uint8)
        array: np.ndarray = self.torch.empty(
            nbytes, dtype=self.torch.uint8, pin_memory=True
        ).numpy()
        return array


def measure(step: Callable[[], int], sync: Callable[[], None], t: Timing) -> list[float]:
    """Units a second of ``step()`` (which returns the units it delivered): one figure per
    run of ``t.seconds`` or ``t.batches`` steps, whichever comes first, after a warm-up; the
    device synchronized before each run's clock stops."""
    start, n = time.perf_counter(), 0
    while n < t.warm_batches or time.perf_counter() - start < t.warmup:
        step()
        n += 1
    sync()
    rates = []
    for _ in range(t.reps):
        total, n = 0, 0
        begin = time.perf_counter()
        while n < t.batches and time.perf_counter() - begin < t.seconds:
            total += step()
            n += 1
        sync()
        rates.append(total / (time.perf_counter() - begin))
    return rates


def gbps(rates: list[float]) -> dict[str, Any]:
    return {"reps": [r / GB for r in rates], "unit": "GB/s"}


def endless(make: Callable[[], Any]) -> Iterator[Any]:
    """Pass after pass of ``make()`` (a finite iterable), without end."""
    while True:
        yield from make()


def group_chute(spec: Spec, rows: Rows, dev: Device) -> None:
    import chute
    from chute.frameworks import to_device, to_torch

    root, n, batch, threads, t = (
        Path(spec.root),
        spec.records,
        spec.batch,
        spec.threads,
        spec.timing,
    )
    shape = np.load(root / "images.npy", mmap_mode="r").shape[1:]
    batch_bytes = int(batch * math.prod(shape))

    def copy(pinned: bool) -> dict[str, Any]:
        torch = dev.need_cuda()
        sources = [
            torch.from_numpy(dev.pinned(batch_bytes) if pinned else np.ones(batch_bytes, np.uint8))
            for _ in range(RING)
        ]
        targets = [torch.empty(batch_bytes, dtype=torch.uint8, device="cuda") for _ in range(RING)]
        turn = itertools.count()

        def step() -> int:
            k = next(turn) % RING
            targets[k].copy_(sources[k], non_blocking=pinned)
            return batch_bytes

        return gbps(measure(step, dev.sync, t))

    def gather(codec: str) -> dict[str, Any]:
        ds = chute.Dataset(root / f"c-{codec}.zr", num_threads=threads)
        outs = [dev.pinned(batch_bytes).reshape(batch, *shape) for _ in range(RING)]
        rng, turn = np.random.default_rng(0), itertools.count()

        def step() -> int:
            ds.gather_into(rng.integers(0, n, batch), outs[next(turn) % RING])
            return batch_bytes

        try:
            return gbps(measure(step, dev.sync, t))
        finally:
            ds.close()

    def loader(codec: str) -> Any:
        ds = chute.Dataset(root / f"c-{codec}.zr", num_threads=1)  # the loader's threads suffice
        return chute.DataLoader(  # as many batches ahead as threads, twice: all stay busy
            {"x": ds}, batch, sampler="iid", seed=1, num_threads=threads, prefetch=2 * threads
        )

    def loader_alone() -> dict[str, Any]:
        with loader("zstd") as dl:
            return gbps(measure(lambda: next(dl)["x"].nbytes, dev.sync, t))

    def loader_ring() -> dict[str, Any]:
        from chute._util.buffers import BatchBuffers

        with loader("zstd") as dl:
            dl.use_buffers(BatchBuffers((dl.prefetch + 4) * 2, dev.pinned))
            return gbps(measure(lambda: next(dl)["x"].nbytes, dev.sync, t))

    device_rates: dict[str, list[float]] = {}

    def device(codec: str) -> dict[str, Any]:
        dev.need_torch()
        with to_device(loader(codec), dev.target, depth=2) as moved:
            rates = measure(lambda: next(moved)["x"].nbytes, dev.sync, t)
        device_rates[codec] = rates
        return gbps(rates)

    def pageable() -> dict[str, Any]:
        dev.need_torch()
        with loader("zstd") as dl:
            return gbps(
                measure(lambda: to_torch(next(dl), device=dev.target)["x"].nbytes, dev.sync, t)
            )

    rows.run("copy-pinned", lambda: copy(True))
    rows.run("copy-pageable", lambda: copy(False))
    rows.run("gather-zstd", lambda: gather("zstd"))
    rows.run("gather-raw", lambda: gather("raw"))
    rows.run("loader-host", loader_alone)
    rows.run("loader-ring", loader_ring)
    rows.run("device-zstd", lambda: device("zstd"))
    rows.run("device-raw", lambda: device("raw"))
    rows.run("to-torch", pageable)
    rows.run("compute", lambda: compute_bound(spec, dev, loader, device_rates.get("zstd")))


def compute_bound(
    spec: Spec, dev: Device, loader: Callable[[str], Any], rates: list[float] | None
) -> dict[str, Any]:
    """Step time of a matmul loop fed by the device loader against the same loop fed one
    batch already on the device; the loop is sized to about twice a batch's data time at
    the device loader's measured rate, so the data path must overlap to keep up."""
    from chute.frameworks import to_device

    torch = dev.need_torch()
    if not rates:
        raise _Skip("the device loader's row did not run")
    size = 4096 if dev.cuda else 256
    dtype = torch.bfloat16 if dev.cuda else torch.float32
    a = torch.randn(size, size, device=dev.target, dtype=dtype)
    w = torch.randn(size, size, device=dev.target, dtype=dtype) / math.sqrt(size)
    c = torch.empty_like(a)
    acc = torch.zeros((), device=dev.target)

    def matmuls(k: int) -> None:
        for _ in range(k):
            torch.matmul(a, w, out=c)

    matmuls(3)
    dev.sync()
    begin = time.perf_counter()
    matmuls(10)
    dev.sync()
    one = (time.perf_counter() - begin) / 10
    shape = np.load(Path(spec.root) / "images.npy", mmap_mode="r").shape[1:]
    data_s = spec.batch * math.prod(shape) / statistics.median(rates)
    k = max(1, math.ceil(2 * data_s / one))
    fixed = torch.randint(0, 255, (spec.batch, *shape), dtype=torch.uint8, device=dev.target)

    def consume(x: Any) -> int:
        acc.add_(x.float().mean())  # the step reads its batch, then computes
        matmuls(k)
        return 1

    t = Timing(spec.timing.seconds, spec.timing.batches, 1, spec.timing.warmup, 5)
    alone: list[float] = []
    fed: list[float] = []
    with to_device(loader("zstd"), dev.target, depth=2) as moved:
        for _ in range(spec.timing.reps):  # interleaved: clock drift hits both alike
            alone += measure(lambda: consume(fixed), dev.sync, t)
            fed += measure(lambda: consume(next(moved)["x"]), dev.sync, t)
    step_ms, alone_ms = [1e3 / r for r in fed], [1e3 / r for r in alone]
    over = statistics.median(step_ms) / statistics.median(alone_ms) - 1
    text = (
        f"{statistics.median(step_ms):.2f} ms vs {statistics.median(alone_ms):.2f} ms alone "
        f"({over:+.1%}; {k} matmuls of {size}x{size} {str(dtype).split('.')[-1]} a step)"
    )
    return {"reps": step_ms, "alone": alone_ms, "unit": "ms a step", "text": text, "k": k}


def group_jax(spec: Spec, rows: Rows, dev: Device) -> None:
    del dev  # JAX's own process: torch is not imported here

    def run() -> dict[str, Any]:
        import jax

        import chute
        from chute.frameworks import to_device

        try:
            target = jax.devices("cpu" if spec.smoke else "gpu")[0]
        except RuntimeError as error:
            raise _Skip(f"JAX has no GPU backend ({str(error)[:80]})") from None
        root = Path(spec.root)
        ds = chute.Dataset(root / "c-zstd.zr", num_threads=1)
        loader = chute.DataLoader({"x": ds}, spec.batch, sampler="iid", seed=1,
                                  num_threads=spec.threads, prefetch=2 * spec.threads)  # fmt: skip
        held: deque[Any] = deque(maxlen=4)

        def step() -> int:
            batch = next(moved)
            held.append(batch)
            return int(batch["x"].nbytes)

        with to_device(loader, target, depth=2) as moved:
            block: Any = jax.block_until_ready
            rates = measure(step, lambda: block(list(held)), spec.timing)
        return {**gbps(rates), "device": str(target)}

    rows.run("jax", run)


def group_loaderx(spec: Spec, rows: Rows, dev: Device) -> None:
    def run() -> dict[str, Any]:
        torch = dev.need_torch()
        import loaderx

        path = Path(spec.root) / "l-zstd.zr"
        if not path.exists():
            raise _Skip("its store could not be written (see the log)")
        lx = loaderx.DataLoader(
            {"x": loaderx.Dataset(str(path))}, num_workers=spec.threads, batch_size=spec.batch,
            prefetch_size=2 * spec.threads, mode=2,
        )  # fmt: skip
        it = iter(lx)

        def step() -> int:
            return int(torch.from_numpy(np.asarray(next(it)["x"])).to(dev.target).nbytes)

        try:
            return gbps(measure(step, dev.sync, spec.timing))
        finally:
            lx.close()

    rows.run("loaderx", run)


class Memmap:
    """torch map-style dataset: one record per index from the memory map (opened lazily, in
    each worker)."""

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


class EndlessSampler:
    """Uniform random indices without end: torch's loader never restarts an epoch."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng(self.seed)
        while True:
            yield from rng.integers(0, self.n, 4096).tolist()


def group_torch_dl(spec: Spec, rows: Rows, dev: Device) -> None:
    def run() -> dict[str, Any]:
        torch = dev.need_torch()
        data = Memmap(Path(spec.root) / "images.npy")
        tdl = torch.utils.data.DataLoader(
            data, batch_size=spec.batch, sampler=EndlessSampler(len(data), 0),
            num_workers=spec.threads, pin_memory=dev.cuda, persistent_workers=True,
            multiprocessing_context="forkserver", drop_last=True,
        )  # fmt: skip
        it = iter(tdl)  # its workers end with this process

        def step() -> int:
            return int(next(it).to(dev.target, non_blocking=True).nbytes)

        warm = Timing(**{**asdict(spec.timing), "warm_batches": 4 * spec.threads})
        return gbps(measure(step, dev.sync, warm))

    rows.run("torch-dl", run)


def group_insitu(spec: Spec, rows: Rows, dev: Device) -> None:
    if not spec.insitu_url:
        for key in GROUPS["insitu"]:
            rows.skip(key, "no archive (zarr not installed?)")
        return

    def dataset() -> Any:
        from chute.insitu import InSituDataset, open_geometries, split_by_chunk

        geoms = open_geometries(spec.insitu_url, ["t2m"])
        manifest = split_by_chunk(geoms["t2m"], (0.8, 0.1, 0.1))
        return InSituDataset(spec.insitu_url, manifest, geoms, batch_size=spec.insitu_batch,
                             num_threads=spec.threads)  # fmt: skip

    def host() -> dict[str, Any]:
        with dataset() as ds:
            it = endless(lambda: ds.train)
            return gbps(measure(lambda: next(it)["t2m"].nbytes, dev.sync, spec.timing))

    def pageable() -> dict[str, Any]:
        from chute.frameworks import to_torch

        dev.need_torch()
        with dataset() as ds:
            it = endless(lambda: ds.train)
            return gbps(
                measure(
                    lambda: to_torch(next(it), device=dev.target)["t2m"].nbytes,
                    dev.sync,
                    spec.timing,
                )
            )

    def device() -> dict[str, Any]:
        from chute.frameworks import to_device

        dev.need_torch()
        with dataset() as ds:
            view = to_device(ds.train, dev.target, depth=2)
            it = endless(lambda: view)
            return gbps(measure(lambda: next(it)["t2m"].nbytes, dev.sync, spec.timing))

    rows.run("insitu-host", host)
    rows.run("insitu-torch", pageable)
    rows.run("insitu-device", device)


def child(spec: Spec) -> None:
    if spec.group == "jax":
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the parent sets it too
    rows = Rows(spec)
    dev = Device(spec.smoke) if spec.group != "jax" else None
    group = {"chute": group_chute, "jax": group_jax, "loaderx": group_loaderx,
             "torch-dl": group_torch_dl, "insitu": group_insitu}[spec.group]  # fmt: skip
    try:
        group(spec, rows, dev)  # type: ignore[arg-type]
    except _Skip as why:
        for key in GROUPS[spec.group]:
            rows.skip(key, str(why))


# -- the parent: data, children within a budget, the report ---------------------------------


@dataclass
class Child:
    """How one child went."""

    group: str
    threads: int
    seconds: float
    problem: str | None


def run_child(spec: Spec, timeout: float, results: dict[str, dict[int, dict[str, Any]]]) -> Child:
    """Run one group in a process (and process group) of its own, rows streamed back as it
    measures them; killed with everything it started at ``timeout``."""
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(asdict(spec))]
    begin = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    errors: deque[str] = deque(maxlen=30)

    def read_rows() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ROW "):
                row = json.loads(line[4:])
                results.setdefault(row["key"], {})[row["threads"]] = row
                print(f"  {row['key']:<14} {cell(row)}", flush=True)
            else:
                print("  | " + line.rstrip(), flush=True)

    def read_errors() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            errors.append(line.rstrip())
            print("  ! " + line.rstrip(), file=sys.stderr, flush=True)

    readers = [threading.Thread(target=f, daemon=True) for f in (read_rows, read_errors)]
    for reader in readers:
        reader.start()
    problem = None
    try:
        code = proc.wait(timeout=max(1.0, timeout))
        if code != 0:
            last = next((e for e in reversed(errors) if e.strip()), "?")
            problem = f"exited with {code}: {last[:120]}"
    except subprocess.TimeoutExpired:
        problem = f"timed out after {timeout:.0f} s"
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its loader workers and forkserver too
        proc.wait()
        for reader in readers:
            reader.join(timeout=5)
    return Child(spec.group, spec.threads, time.perf_counter() - begin, problem)


def probe() -> dict[str, Any]:
    """torch's version and the GPU, asked in a process of its own (this one stays free of
    CUDA, which its forkserver children would otherwise not share)."""
    code = (
        "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': "
        "torch.__version__, 'cuda': c, 'gpu': torch.cuda.get_device_name() if c else None}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    if done.returncode != 0:
        return {"torch": None, "cuda": False, "gpu": None}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def check_core() -> None:
    try:
        for name in ("_zrecord", "_sampler"):
            importlib.import_module(f"chute._native.{name}")
    except ImportError as error:
        sys.exit(
            f"chute's compiled core does not import for Python {platform.python_version()} "
            f"({error}): install chute (`pip install -e .`), or on the GPU machine run "
            "bench/gpu-run.sh with the wheels of `make gpu-wheels`"
        )


def write_data(root: Path, records: int, smoke: bool) -> tuple[str, int, list[str]]:
    """The stores, the .npy and the insitu archive; its URL (empty if none), batch, notes."""
    from store import structured  # the store benchmark's workload

    import chute

    notes = []
    images = structured(records)
    np.save(root / "images.npy", images)
    for codec in ("zstd", "raw"):
        chute.write_dataset(root / f"c-{codec}.zr", images, codec=codec, progress=False).close()
    try:
        import loaderx

        loaderx.write_dataset(str(root / "l-zstd.zr"), images, codec="zstd")
    except Exception as error:  # the loaderx row then says skipped
        notes.append(f"loaderx's store not written: {type(error).__name__}: {error}")
    try:
        import zarr
        from zarr.codecs import ZstdCodec
    except ImportError as error:
        notes.append(f"no insitu archive: {error}")
        return "", 0, notes
    steps, lat, lon = (160, 18, 36) if smoke else (800, 181, 360)
    url = str(root / "t2m.zarr")
    arr = zarr.open_group(url, mode="w").create_array(
        "t2m", shape=(steps, lat, lon), chunks=(8, lat, lon), dtype="f4",
        compressors=ZstdCodec(level=3),
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for start in range(0, steps, 200):
        rows = min(200, steps - start)
        arr[start : start + rows] = rng.standard_normal((rows, lat, lon), dtype=np.float32)
    return url, 8 if smoke else 32, notes


# -- the report ------------------------------------------------------------------------------


def median(row: dict[str, Any] | None) -> float | None:
    reps = (row or {}).get("reps")
    return statistics.median(reps) if reps else None


def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row.get("text"):
        return str(row["text"])
    reps = row["reps"]
    return f"{statistics.median(reps):.2f} ({min(reps):.2f}-{max(reps):.2f})"


def targets(results: dict[str, dict[int, dict[str, Any]]], threads: int) -> list[list[str]]:
    def at(key: str) -> dict[str, Any] | None:
        return results.get(key, {}).get(threads)

    dev = median(at("device-zstd"))
    out = []

    def check(name: str, want: str, value: float | None, ok: bool, unit: str = "x") -> None:
        if value is None:
            out.append([name, want, "n/a", "n/a (a row did not run)"])
        else:
            out.append([name, want, f"{value:.2f}{unit}", "yes" if ok else "**no**"])

    check("device loader (zstd)", ">= 15 GB/s", dev, dev is not None and dev >= 15, " GB/s")
    for key, name, want in (
        ("loaderx", 'device loader / loaderx + .to("cuda")', 3.0),
        ("loader-ring", "device loader / the loader alone into the pinned ring", 0.7),
    ):
        ref = median(at(key))
        ratio = dev / ref if dev is not None and ref else None
        check(name, f">= {want}x", ratio, ratio is not None and ratio >= want)
    compute = at("compute")
    over = None
    if compute and compute.get("reps") and compute.get("alone"):
        over = 100 * (statistics.median(compute["reps"]) / statistics.median(compute["alone"]) - 1)
    check("compute-bound step time over compute alone", "<= +5%", over,
          over is not None and over <= 5, "%")  # fmt: skip
    jax = median(at("jax"))
    ratio = jax / dev if jax is not None and dev else None
    check("JAX / torch, device loader (zstd)", ">= 0.8x", ratio, ratio is not None and ratio >= 0.8)
    return out


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])


def report(
    args: argparse.Namespace,
    info: dict[str, Any],
    results: dict[str, dict[int, dict[str, Any]]],
    children: list[Child],
    notes: list[str],
) -> str:
    smoke = args.cpu_smoke
    body = [[label, *(cell(results.get(key, {}).get(t)) for t in args.threads)]
            for key, label in ROWS.items()]  # fmt: skip
    title = " (CPU smoke run: tiny sizes, numbers mean nothing)" if smoke else ""
    gpu = info.get("gpu") or "none"
    ran = ", ".join(
        f"{c.group} at {c.threads}: {c.seconds:.0f} s" + (f" ({c.problem})" if c.problem else "")
        for c in children
    )
    t = args.timing
    text = (
        f"# GPU hand-off benchmark{title}\n\n"
        f"GPU: {gpu}; {os.cpu_count()} cores; Python {platform.python_version()}, torch "
        f"{info.get('torch') or 'not installed'}. Store workload: {args.records} records of "
        f"(3, 64, 64) uint8, batches of {args.batch} random indices; insitu: "
        f"{'(800, 181, 360)' if not smoke else '(160, 18, 36)'} float32 in 8-step zstd chunks, "
        f"batch {args.insitu_batch}. GB/s of batch data delivered: median (min-max) of "
        f"{t.reps} runs of {t.seconds:g} s or {t.batches} batches, whichever came first, "
        "after a warm-up, the device synchronized. A column's T threads: the loader's threads "
        "over stores opened with one, or a gather's store threads.\n\n"
        + table(["path", *(f"T = {n}" for n in args.threads)], body)
        + f"\n\nTargets (issue 26), at T = {args.threads[0]}:\n\n"
        + table(["target", "wanted", "measured", "met"], targets(results, args.threads[0]))
        + f"\n\nChildren (one process each, in this order): {ran}.\n"
        + "".join(f"\nNote: {n}\n" for n in notes)
    )  # fmt: skip
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny run on the CPU")
    parser.add_argument("--threads", type=int, nargs="+", default=None)
    parser.add_argument("--seconds", type=float, default=None, help="a run's time (2)")
    parser.add_argument("--batches", type=int, default=None, help="... or batches (2000)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for it all")
    parser.add_argument("--out", default=None, help="the markdown table's path")
    parser.add_argument("--json", default=None, help="also write every run's figures here")
    parser.add_argument("--workdir", default=None, help="where the data goes (a temp folder)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        raw = json.loads(args.child)
        child(Spec(**{**raw, "timing": Timing(**raw["timing"])}))
        return

    begin = time.perf_counter()
    smoke = args.cpu_smoke
    check_core()
    info = probe()
    if not smoke and not info["cuda"]:
        sys.exit(
            f"no CUDA device (torch {info['torch'] or 'not installed'}): run on a GPU host, "
            "or pass --cpu-smoke"
        )
    args.threads = args.threads or ([2, 1] if smoke else [16, 2])
    args.records = 600 if smoke else 20_000
    args.batch = 32 if smoke else 256
    args.timing = Timing(
        seconds=args.seconds or (0.2 if smoke else 2.0),
        batches=args.batches or (40 if smoke else 2000),
        reps=3,
        warmup=0.05 if smoke else 0.5,
        warm_batches=3 if smoke else 20,
    )
    budget = args.budget or (240.0 if smoke else 300.0)
    out = Path(args.out) if args.out else (
        Path(tempfile.gettempdir()) / "chute-gpu-smoke.md" if smoke else HERE / "results" / "gpu.md"
    )  # fmt: skip
    results: dict[str, dict[int, dict[str, Any]]] = {}
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="chute-gpu-", dir=args.workdir) as tmp:
        root = Path(tmp)
        print(f"writing the workload into {root}", flush=True)
        url, args.insitu_batch, notes = write_data(root, args.records, smoke)
        print(f"data ready after {time.perf_counter() - begin:.1f} s", flush=True)
        for threads, group in itertools.product(args.threads, GROUPS):
            first = threads == args.threads[0]
            left = budget - (time.perf_counter() - begin) - 5
            if left < 10:
                for key in GROUPS[group]:
                    if first or key not in FIRST_ONLY:
                        results.setdefault(key, {})[threads] = {
                            "text": f"skipped: out of time (budget {budget:.0f} s)"
                        }
                continue
            print(f"{group}, {threads} threads", flush=True)
            spec = Spec(group, threads, first, str(root), smoke, args.records, args.batch,
                        url, args.insitu_batch, args.timing)  # fmt: skip
            done = run_child(spec, min(CAP_S[group], left), results)
            children.append(done)
            for key in GROUPS[group]:  # rows the child never reported
                if (first or key not in FIRST_ONLY) and threads not in results.get(key, {}):
                    why = done.problem or "ended without reporting it"
                    kind = "skipped" if why.startswith("timed out") else "failed"
                    results.setdefault(key, {})[threads] = {"text": f"{kind}: its process {why}"}
            write(out, report(args, info, results, children, notes), args.json, results)
    text = report(args, info, results, children, notes)
    write(out, text, args.json, results)
    print(text)
    print(f"wrote {out} after {time.perf_counter() - begin:.0f} s")


def write(out: Path, text: str, path: str | None, results: dict[str, Any]) -> None:
    """The table so far (a run cut short still leaves one), and the figures as JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if path:
        Path(path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
