"""The on-disk chunk pool (``cache_dir=``) shared by processes: one decode per chunk per host."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chute.insitu import InSituDataset, open_geometries, split_by_chunk

from .conftest import N, x_values

# a reader process: opens the dataset, waits for its peers, reads every view checking the
# values, waits again (so no member leaves before all have read), prints its counters
READER = """
import json, sys, time
from pathlib import Path
import numpy as np
from chute.insitu import InSituDataset, open_geometries, split_by_chunk

archive, cache, sync, me, peers, budget = sys.argv[1:7]

def wait_for(kind):
    deadline = time.monotonic() + 120
    while len(list(Path(sync).glob(kind + "-*"))) < int(peers):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.01)

m = split_by_chunk(open_geometries(archive)["x"])
kw = {} if cache == "-" else {"cache_dir": cache}
ds = InSituDataset(archive, m, batch_size=8, cache_budget_bytes=int(budget), **kw)
Path(sync, "ready-" + me).touch()
wait_for("ready")
seen = []
for view in (ds.all, ds.train):
    for b in view:
        idx = b["sample_indices"]
        want = (idx[:, None, None] * 100 + np.arange(15).reshape(3, 5)).astype(np.float32)
        assert (b["x"] == want).all() and (b["y"] == idx).all()
        seen.extend(idx.tolist())
Path(sync, "done-" + me).touch()
wait_for("done")
stats = ds.stats()
ds.close()
print(json.dumps({"decodes": stats["decodes"], "shared_hits": stats["shared_hits"],
                  "samples": len(seen)}))
"""


def tear(path: Path, keep: int) -> None:
    """Put a torn copy (its first ``keep`` bytes) in place of ``path`` as a new file, as a
    crash could leave one; the old file stays whole for whoever maps it (no SIGBUS)."""
    torn = path.with_name(path.name + ".torn")
    torn.write_bytes(path.read_bytes()[:keep])
    os.replace(torn, path)


def run_readers(
    archive: Path, cache: Path | None, tmp_path: Path, count: int, budget: int = 10**6
) -> list[dict[str, Any]]:
    sync = tmp_path / "sync"
    sync.mkdir()
    args = [str(archive), str(cache or "-"), str(sync)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, *args, str(k), str(count), str(budget)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(count)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def slab_count(archive: Path) -> int:
    geoms = open_geometries(archive)
    return geoms["x"].n_chunks + geoms["y"].n_chunks  # the variables of the manifest's length


def test_two_processes_decode_each_chunk_once_between_them(archive: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    results = run_readers(archive, cache, tmp_path, 2)
    slabs = slab_count(archive)
    assert sum(r["decodes"] for r in results) == slabs  # once per host
    for r in results:
        assert r["decodes"] + r["shared_hits"] == slabs  # each process read every slab once
        assert r["samples"] > N
    assert os.listdir(cache) == []  # the last process to leave removed the pool


def test_without_cache_dir_each_process_decodes_everything(archive: Path, tmp_path: Path) -> None:
    results = run_readers(archive, None, tmp_path, 2)
    assert [r["decodes"] for r in results] == [slab_count(archive)] * 2


@dataclass(frozen=True)
class StallOn:
    """A chunk transform that hangs on one chunk of ``x`` while ``marker`` exists (the
    same repr in every process, so the processes share one pool)."""

    marker: str
    sample: int

    def __call__(self, variable: str, chunk: np.ndarray) -> np.ndarray:
        while variable == "x" and int(chunk[0, 0, 0]) // 100 == self.sample:
            if not os.path.exists(self.marker):
                break
            time.sleep(0.01)
        return chunk


STALLER = """
import sys
from chute.insitu import InSituDataset, open_geometries, split_by_chunk
from tests.insitu.test_shared_pool import StallOn

archive, cache, marker = sys.argv[1:4]
m = split_by_chunk(open_geometries(archive)["x"])
ds = InSituDataset(archive, m, batch_size=8, cache_dir=cache, cache_budget_bytes=10**6,
                   chunk_transforms=[StallOn(marker, 16)])
print("open", flush=True)
list(ds.all)
"""


def test_a_process_killed_mid_decode_leaves_nothing_torn(archive: Path, tmp_path: Path) -> None:
    """A member dies holding a slab's lock, leaving a half-written file and a torn slab:
    a live member waiting for that slab decodes it itself, and serves nothing torn."""
    from concurrent.futures import ThreadPoolExecutor

    cache = tmp_path / "cache"
    cache.mkdir()
    marker = tmp_path / "stall"
    marker.touch()
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", STALLER, str(archive), str(cache), str(marker)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])},
    )
    m = split_by_chunk(open_geometries(archive)["x"])
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "open"
        (pool,) = os.listdir(cache)
        deadline = time.monotonic() + 60
        while not any(f.endswith(".slab") for f in os.listdir(cache / pool)):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
        (cache / pool / "leftover.tmp-dead").write_bytes(b"CHUTESLB half")
        torn = next(f for f in os.listdir(cache / pool) if f.endswith(".slab"))
        tear(cache / pool / torn, len((cache / pool / torn).read_bytes()) - 5)
        ds = InSituDataset(
            archive,
            m,
            batch_size=8,
            cache_dir=cache,
            cache_budget_bytes=10**6,
            chunk_transforms=[StallOn(str(marker), 16)],  # the same repr: the same pool
        )
        with ds, ThreadPoolExecutor(1) as reader:
            pending = reader.submit(lambda: [dict(b) for b in ds.all])
            time.sleep(0.3)  # the reader now polls the slab the child holds
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            marker.unlink()  # lets the reader's own decode of that slab through
            batches = pending.result(timeout=120)
            assert (cache / pool / "leftover.tmp-dead").exists()  # a member was alive
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    seen = []
    for b in batches:
        np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
        np.testing.assert_array_equal(b["y"], b["sample_indices"])
        seen.extend(b["sample_indices"].tolist())
    assert sorted(seen) == list(range(N))
    assert os.listdir(cache) == []  # the last member left: everything removed


def test_a_torn_slab_left_by_a_live_member_is_decoded_again(archive: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    m = split_by_chunk(open_geometries(archive)["x"])
    first = InSituDataset(archive, m, batch_size=8, cache_dir=cache, cache_budget_bytes=10**6)
    with first:
        list(first.all)
        (pool,) = os.listdir(cache)
        for f in sorted(os.listdir(cache / pool)):
            if f.endswith(".slab"):
                tear(cache / pool / f, len((cache / pool / f).read_bytes()) // 2)
        with InSituDataset(
            archive, m, batch_size=8, cache_dir=cache, cache_budget_bytes=10**6
        ) as second:
            for b in second.all:
                np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
            assert second.stats()["decodes"] == slab_count(archive)
            assert second.stats()["shared_hits"] == 0


def on_disk(pool: Path) -> int:
    """Bytes of the slabs in ``pool``, published or being written, counted under the pool's
    eviction lock, which every reservation, eviction and rename into place holds."""
    lock = os.open(pool / "evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        total = 0
        for entry in os.scandir(pool):
            if entry.name.endswith(".slab") or ".tmp-" in entry.name:
                total += entry.stat().st_size
        return total
    finally:
        os.close(lock)


def tight_member(archive: Path, cache: Path) -> tuple[InSituDataset, int]:
    """A member of ``cache``'s pool whose budget holds 12 slabs of both variables (so a
    pass evicts), and that budget."""
    geoms = open_geometries(archive)
    budget = 12 * (geoms["x"].slab_nbytes + geoms["y"].slab_nbytes)
    ds = InSituDataset(
        archive,
        split_by_chunk(geoms["x"]),
        batch_size=4,
        block_chunks=2,
        cache_dir=cache,
        cache_budget_bytes=budget,
    )
    return ds, budget


def test_the_files_on_disk_stay_within_the_budget(archive: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    ds, budget = tight_member(archive, cache)
    with ds:
        (pool,) = os.listdir(cache)
        for view in (ds.all, ds.train):
            for b in view:
                np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
                assert on_disk(cache / pool) <= budget


def test_cache_dir_must_exist(archive: Path, tmp_path: Path) -> None:
    m = split_by_chunk(open_geometries(archive)["x"])
    with pytest.raises(FileNotFoundError, match="cache_dir"):
        InSituDataset(archive, m, cache_dir=tmp_path / "absent")


@pytest.mark.parametrize("junk", [b"", b"\x00" * 7, b"not a count at all"])
def test_a_torn_usage_count_is_recounted_within_the_budget(
    archive: Path, tmp_path: Path, junk: bytes
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    ds, budget = tight_member(archive, cache)
    with ds:
        (pool,) = os.listdir(cache)
        list(ds.all)
        usage = cache / pool / "usage"
        assert usage.exists()
        usage.write_bytes(junk)  # as a crash mid-write could leave it
        second, _ = tight_member(archive, cache)
        with second:
            second.set_epoch(1)  # another order: slabs that were evicted are published again
            for b in second.train:
                np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
                assert on_disk(cache / pool) <= budget
            assert second.stats()["decodes"] > 0
        assert any(f.endswith(".slab") for f in os.listdir(cache / pool))
