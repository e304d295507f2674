"""The block cache of remote objects (`chute._objects.BlockCache`), through its interface and
the files on disk, with a real fetch over local bytes that counts its calls. Whatever can
hang or is killed runs in a child process with a timeout."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import random
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chute._objects import BlockCache
from chute._objects._cache import PAGE_BYTES, file_bytes
from chute.errors import CacheTooSmallError, RemoteChangedError, RemoteError, UnsafeFileError
from tests.store.isolate import run_isolated

SPAWN = multiprocessing.get_context("spawn")


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` bytes, the same in every process for the same seed."""
    return random.Random(seed).randbytes(size)


class Source:
    """An object's bytes and a fetch over them that records every call (and, with ``log``,
    appends each range fetched to that file, for counting across processes)."""

    def __init__(self, data: bytes, log: Path | None = None, stall: Path | None = None) -> None:
        self.data, self.log, self.stall = data, log, stall
        self.calls: list[list[tuple[int, int]]] = []

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        self.calls.append(list(ranges))
        if self.log is not None:
            with open(self.log, "a") as f:
                f.writelines(f"{start} {end}\n" for start, end in ranges)
        if self.stall is not None:  # hangs here, holding the blocks' locks, until killed
            self.stall.touch()
            while True:
                time.sleep(0.05)
        return [self.data[start:end] for start, end in ranges]

    @property
    def fetched(self) -> list[tuple[int, int]]:
        return [r for call in self.calls for r in call]


def folder_of(cache: BlockCache) -> Path:
    return Path(cache.root)


def on_disk(root: Path) -> int:
    """Bytes of the block files in ``root``, published or being written, counted under the
    folder's eviction lock, which every reservation, eviction and rename into place holds."""
    lock = os.open(root / "evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return sum(
            e.stat().st_size
            for e in os.scandir(root)
            if e.name.endswith(".blk") or ".tmp-" in e.name
        )
    finally:
        os.close(lock)


def block_files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.suffix == ".blk")


def file_of(root: Path, index: int) -> Path:
    (path,) = [p for p in block_files(root) if p.stem.endswith(f"-{index}")]
    return path


def whole_ranges(size: int, step: int) -> list[tuple[int, int]]:
    return [(start, min(start + step, size)) for start in range(0, size, step)]


# -- correctness -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    shape=st.one_of(  # (size, block_bytes): small blocks, and blocks of several pages
        st.tuples(st.integers(0, 2000), st.sampled_from([13, 64, 500])),
        st.tuples(st.integers(0, 5 * PAGE_BYTES), st.sampled_from([3 * PAGE_BYTES + 5])),
    ),
    blocks_kept=st.integers(1, 6),
    picks=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), max_size=8),
    seed=st.integers(0, 3),
)
def test_random_ranges_read_the_right_bytes(
    shape: tuple[int, int], blocks_kept: int, picks: list[tuple[float, float]], seed: int
) -> None:
    size, block = shape
    data = payload(size, seed)
    ranges = [(min(a, b), max(a, b)) for a, b in ((int(x * size), int(y * size)) for x, y in picks)]
    needed = sorted(
        {i for a, b in ranges if a < b for i in range(a // block, (b - 1) // block + 1)}
    )
    budget = blocks_kept * file_bytes(block)
    source = Source(data)
    with tempfile.TemporaryDirectory() as tmp:
        with BlockCache(tmp, budget, block_bytes=block) as c:
            for _ in range(2):  # the second time from the cache, as far as the budget kept it
                got = c.read_ranges(f"obj {seed} {size}", size, ranges, source.fetch)
                assert got == [data[a:b] for a, b in ranges]
                assert on_disk(folder_of(c)) <= budget
            if needed:  # the first read: one call, each block once, aligned, cut at the end
                assert source.calls[0] == [(i * block, min((i + 1) * block, size)) for i in needed]
            if len(needed) <= blocks_kept:  # all of them stay cached: the second read hits
                assert len(source.calls) <= 1
            assert len(source.calls) <= 2
            assert c.stats()["misses"] == len(source.fetched)
            assert c.stats()["hits"] + c.stats()["misses"] == 2 * len(needed)
        assert os.listdir(tmp) == []


def test_a_read_larger_than_the_budget_returns_the_right_bytes(tmp_path: Path) -> None:
    """Ten blocks in one read through a budget of two: one fetch, every byte right, the
    disk within the budget (the blocks are served from memory, never waited for)."""
    data = payload(10 * 100 + 37)
    source = Source(data)
    budget = 2 * file_bytes(100)
    with BlockCache(tmp_path, budget, block_bytes=100) as c:
        got = c.read_ranges("big", len(data), [(0, len(data)), (150, 950)], source.fetch)
        assert got == [data, data[150:950]]
        assert len(source.calls) == 1 and len(source.fetched) == 11
        assert on_disk(folder_of(c)) <= budget
        assert c.stats()["published"] >= 1


def test_a_fetch_that_returns_other_lengths_is_refused_and_not_cached(tmp_path: Path) -> None:
    data = payload(300)
    with BlockCache(tmp_path, 10_000, block_bytes=100) as c:
        with pytest.raises(RemoteChangedError, match="obj-short"):
            c.read_ranges("obj-short", 300, [(0, 300)], lambda rs: [data[a : b - 1] for a, b in rs])
        assert block_files(folder_of(c)) == []
        source = Source(data)
        assert c.read_ranges("obj-short", 300, [(0, 300)], source.fetch) == [data]
        assert len(source.fetched) == 3


def test_a_fetch_that_fails_leaves_nothing_held(tmp_path: Path) -> None:
    """The error reaches the caller, and the blocks' locks are released: the next read
    fetches them (rather than waiting for ever on its own process)."""
    data = payload(300)

    def fail(ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        raise RemoteError(f"s3://b/obj: 503 Slow Down ({len(ranges)} ranges)")

    def check() -> int:
        with BlockCache(tmp_path, 10_000, block_bytes=100) as c:
            with pytest.raises(RemoteError, match="503"):
                c.read_ranges("obj", 300, [(0, 300)], fail)
            source = Source(data)
            assert c.read_ranges("obj", 300, [(50, 250)], source.fetch) == [data[50:250]]
            assert source.fetched == [(0, 100), (100, 200), (200, 300)]
        return 0

    assert run_isolated(check, timeout=60) == 0


def test_a_bad_range_is_refused(tmp_path: Path) -> None:
    with BlockCache(tmp_path, 10_000, block_bytes=100) as c:
        for bad in [(5, 4), (-1, 3), (0, 301)]:
            with pytest.raises(ValueError, match="not within the 300 bytes of k"):
                c.read_ranges("k", 300, [bad], Source(b"").fetch)


# -- sizes -------------------------------------------------------------------------------


def test_a_cache_smaller_than_a_block_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CacheTooSmallError, match=r"cache_bytes=4096 .*block_bytes=4096"):
        BlockCache(tmp_path, 4096, block_bytes=4096)
    assert os.listdir(tmp_path) == []
    with BlockCache(tmp_path, file_bytes(4096), block_bytes=4096) as c:
        c.check_working_set(4096)
        with pytest.raises(CacheTooSmallError, match=rf"4097 bytes.*cache_bytes={4096 + 68}"):
            c.check_working_set(4097)


# -- many processes ----------------------------------------------------------------------


def reader(cache_dir: str, log: str, seed: int, barrier: Any, out: str) -> None:
    """A process reading every block of one object, in its own order and in pieces, after
    all readers are ready; writes its counts to ``out``."""
    data = payload(40 * 1000 + 123)
    source = Source(data, Path(log))
    with BlockCache(cache_dir, 10**6, block_bytes=1000) as c:
        barrier.wait(timeout=60)
        ranges = whole_ranges(len(data), 1700)
        random.Random(seed).shuffle(ranges)
        for k in range(0, len(ranges), 5):
            part = ranges[k : k + 5]
            assert c.read_ranges("shared", len(data), part, source.fetch) == [
                data[a:b] for a, b in part
            ]
        barrier.wait(timeout=60)  # nobody leaves before all have read
        Path(out).write_text(json.dumps(c.stats()))


def run_all(procs: list[Any], timeout: float = 120) -> None:
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout)
            assert p.exitcode == 0, f"a reader exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def test_processes_fetch_each_block_once_per_host(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    barrier = SPAWN.Barrier(3)
    logs = [tmp_path / f"log{k}" for k in range(3)]
    outs = [tmp_path / f"out{k}.json" for k in range(3)]
    run_all(
        [
            SPAWN.Process(target=reader, args=(str(cache), str(logs[k]), k, barrier, str(outs[k])))
            for k in range(3)
        ]
    )
    fetched = [line for log in logs if log.exists() for line in log.read_text().splitlines()]
    assert sorted(fetched) == sorted(set(fetched)) and len(fetched) == 41  # once per block
    stats = [json.loads(o.read_text()) for o in outs]
    assert sum(s["misses"] for s in stats) == 41
    assert all(s["hits"] + s["misses"] >= 41 for s in stats)
    assert os.listdir(cache) == []  # the last to leave removed the folder


def stalled_fetcher(cache_dir: str, stall: str) -> None:
    """Holds the locks of an object's blocks in a fetch that never returns."""
    data = payload(8 * 1000)
    with BlockCache(cache_dir, 10**6, block_bytes=1000) as c:
        c.read_ranges("obj", len(data), [(0, len(data))], Source(data, stall=Path(stall)).fetch)


def waiting_reader(cache_dir: str, log: str, out: str) -> None:
    data = payload(8 * 1000)
    with BlockCache(cache_dir, 10**6, block_bytes=1000) as c:
        Path(out + ".ready").touch()
        got = c.read_ranges(
            "obj", len(data), whole_ranges(len(data), 300), Source(data, Path(log)).fetch
        )
        assert got == [data[a:b] for a, b in whole_ranges(len(data), 300)]
        Path(out).write_text(json.dumps(c.stats()))


def test_a_reader_takes_over_the_blocks_of_a_fetcher_that_dies(tmp_path: Path) -> None:
    cache, stall, log, out = (
        tmp_path / "cache",
        tmp_path / "stall",
        tmp_path / "log",
        tmp_path / "out",
    )
    cache.mkdir()
    fetcher = SPAWN.Process(target=stalled_fetcher, args=(str(cache), str(stall)))
    fetcher.start()
    waiter = None
    try:
        deadline = time.monotonic() + 60
        while not stall.exists():
            assert time.monotonic() < deadline and fetcher.is_alive()
            time.sleep(0.01)
        waiter = SPAWN.Process(target=waiting_reader, args=(str(cache), str(log), str(out)))
        waiter.start()
        while not Path(f"{out}.ready").exists():
            assert time.monotonic() < deadline and waiter.is_alive()
            time.sleep(0.01)
        time.sleep(0.3)  # the waiter now polls the blocks the fetcher holds
        assert not log.exists() and waiter.is_alive()  # it fetched nothing the fetcher holds
        assert fetcher.pid is not None
        os.kill(fetcher.pid, signal.SIGKILL)
        fetcher.join(30)
        waiter.join(60)
        assert waiter.exitcode == 0
    finally:
        for p in (fetcher, waiter):
            if p is not None and p.is_alive():
                p.kill()
                p.join()
    assert len(log.read_text().splitlines()) == 8  # every block, fetched once, by the waiter
    assert json.loads(out.read_text())["misses"] == 8
    assert os.listdir(cache) == []


def publisher(cache_dir: str, seed: int, ready: Any, go: Any) -> None:
    """Reads (so fetches and publishes) every block of object ``seed`` once told to."""
    data = payload(32 * (256 << 10), seed)
    with BlockCache(cache_dir, 64 << 20, block_bytes=256 << 10) as c:
        ready.set()
        go.wait(60)
        c.read_ranges(f"obj{seed}", len(data), [(0, len(data))], Source(data).fetch)


def test_a_fetcher_killed_mid_write_leaves_nothing_torn(tmp_path: Path) -> None:
    """A process killed while it writes a block leaves a reservation nobody serves; the
    blocks it published are whole, and a live member and a later reader get every byte."""
    step = 256 << 10
    with BlockCache(tmp_path, 64 << 20, block_bytes=step) as member:  # keeps the folder
        root = folder_of(member)
        for seed in range(20):  # until a kill lands while a block is being written
            ready, go = SPAWN.Event(), SPAWN.Event()
            child = SPAWN.Process(target=publisher, args=(str(tmp_path), seed, ready, go))
            child.start()
            try:
                assert ready.wait(60)
                go.set()
                deadline = time.monotonic() + 60
                while child.is_alive() and not any(".tmp-" in n for n in os.listdir(root)):
                    assert time.monotonic() < deadline
                assert child.pid is not None
                with contextlib.suppress(ProcessLookupError):  # it may have finished first
                    os.kill(child.pid, signal.SIGKILL)
            finally:
                child.join(30)
            if any(".tmp-" in n for n in os.listdir(root)):
                break
        else:
            pytest.fail("no kill landed mid-write in 20 tries")
        data = payload(32 * step, seed)
        for path in block_files(root):  # what was published is whole
            assert path.stat().st_size == file_bytes(step)
        prefix = hashlib.sha256(f"obj{seed}".encode()).hexdigest()[:32]
        published = sum(p.name.startswith(prefix) for p in block_files(root))
        source = Source(data)
        ranges = whole_ranges(len(data), 5000)
        got = member.read_ranges(f"obj{seed}", len(data), ranges, source.fetch)
        assert b"".join(got) == data
        assert len(source.fetched) == 32 - published  # the rest came from the cache
        with BlockCache(tmp_path, 64 << 20, block_bytes=step) as later:
            again = Source(data)
            assert later.read_ranges(f"obj{seed}", len(data), [(0, len(data))], again.fetch) == [
                data
            ]
            assert again.calls == []
    assert os.listdir(tmp_path) == []  # the dead writer's reservation went with the folder


# -- damage ------------------------------------------------------------------------------


def damage(root: Path, kind: str) -> None:
    """Damage block 1's file as a crash, a disk or a stray hand could."""
    path = file_of(root, 1)
    raw = bytearray(path.read_bytes())
    if kind == "a data byte flipped":
        raw[len(raw) - 1000 + 17] ^= 0x40  # the block's bytes end the file
        path.write_bytes(raw)  # in place
    elif kind == "its index changed":
        raw[48] ^= 0x03  # the index field, after magic, CRC, pad and the key's SHA-256
        path.write_bytes(raw)
    elif kind == "cut short":
        path.write_bytes(raw[:-10])
    elif kind == "another block's file":
        path.write_bytes(file_of(root, 2).read_bytes())
    elif kind == "a FIFO":
        path.unlink()
        os.mkfifo(path)
    elif kind == "a link to /dev/zero":
        path.unlink()
        path.symlink_to("/dev/zero")
    elif kind == "a folder":
        path.unlink()
        (path / "inner").mkdir(parents=True)


@pytest.mark.parametrize(
    "kind",
    [
        "a data byte flipped",
        "its index changed",
        "cut short",
        "another block's file",
        "a FIFO",
        "a link to /dev/zero",
        "a folder",
    ],
)
def test_a_damaged_block_file_is_fetched_again_never_served(tmp_path: Path, kind: str) -> None:
    data = payload(4 * 1000)

    def check() -> int:
        with BlockCache(tmp_path, 10**6, block_bytes=1000) as c:
            c.read_ranges("obj", len(data), [(0, len(data))], Source(data).fetch)
            damage(folder_of(c), kind)
            source = Source(data)
            got = c.read_ranges("obj", len(data), whole_ranges(len(data), 300), source.fetch)
            assert b"".join(got) == data
            assert source.fetched == [(1000, 2000)]  # that block only, fetched again
            assert c.stats()["discarded"] == 1
            fresh = Source(data)  # published again, whole
            assert c.read_ranges("obj", len(data), [(0, len(data))], fresh.fetch) == [data]
            assert fresh.calls == []
        return 0

    assert run_isolated(check, timeout=60) == 0


def test_a_read_checks_the_pages_it_serves(tmp_path: Path) -> None:
    """A damaged page is never served: a read of other pages of the block is served from
    the cache, checked; the first read that needs the damaged page fetches the block again."""
    block = 4 * PAGE_BYTES
    data = payload(2 * block)
    with BlockCache(tmp_path, 10**7, block_bytes=block) as c:
        c.read_ranges("obj", len(data), [(0, len(data))], Source(data).fetch)
        path = file_of(folder_of(c), 0)
        raw = bytearray(path.read_bytes())
        raw[len(raw) - block + 3 * PAGE_BYTES + 5] ^= 0x01  # in the block's last page
        path.write_bytes(raw)
        source = Source(data)
        ranges = [(10, 20), (PAGE_BYTES + 1, 2 * PAGE_BYTES + 9), (block + 7, block + 3000)]
        assert c.read_ranges("obj", len(data), ranges, source.fetch) == [
            data[a:b] for a, b in ranges
        ]
        assert source.calls == []  # pages 0-2 of block 0 and block 1 are whole
        ranges = [(3 * PAGE_BYTES, 3 * PAGE_BYTES + 10)]
        assert c.read_ranges("obj", len(data), ranges, source.fetch) == [
            data[a:b] for a, b in ranges
        ]
        assert source.fetched == [(0, block)] and c.stats()["discarded"] == 1
        assert c.read_ranges("obj", len(data), ranges, source.fetch) == [
            data[a:b] for a, b in ranges
        ]
        assert len(source.calls) == 1  # published again, whole


# -- the budget ----------------------------------------------------------------------------


def tick(probe: Path) -> None:
    """Wait until the file system stamps a change later than its last (its clock is coarse),
    so the files used before and after have different times."""
    probe.write_bytes(b"")
    before = probe.stat().st_mtime_ns
    while probe.stat().st_mtime_ns == before:
        probe.write_bytes(b"")


def test_the_least_recently_used_blocks_are_evicted_first(tmp_path: Path) -> None:
    cache, probe = tmp_path / "cache", tmp_path / "probe"
    cache.mkdir()
    data = payload(8 * 100)
    budget = 4 * file_bytes(100)
    source = Source(data)
    with BlockCache(cache, budget, block_bytes=100) as c:
        root = folder_of(c)

        def read(i: int) -> None:
            assert c.read_ranges("obj", len(data), [(i * 100, i * 100 + 50)], source.fetch) == [
                data[i * 100 : i * 100 + 50]
            ]
            assert on_disk(root) <= budget
            tick(probe)

        for i in range(4):
            read(i)
        read(0)  # used again: now the most recent
        read(4)  # no room: the least recently used go (1, then 2: an eighth is kept free)
        assert sorted(int(p.stem.split("-")[1]) for p in block_files(root)) == [0, 3, 4]
        assert c.stats()["evictions"] == 2
        fetched = len(source.fetched)
        read(0)
        read(3)
        assert len(source.fetched) == fetched  # still cached
        read(1)
        assert len(source.fetched) == fetched + 1  # evicted, fetched again


def test_processes_sharing_a_tight_budget_stay_within_it(tmp_path: Path) -> None:
    """Two processes reading different objects through a budget of five blocks: every byte
    right, the disk never above the budget (checked by the processes after each read)."""
    run_all([SPAWN.Process(target=tight_reader, args=(str(tmp_path), k)) for k in range(2)])
    assert os.listdir(tmp_path) == []


def tight_reader(cache_dir: str, seed: int) -> None:
    data = payload(30 * 200, seed)
    budget = 5 * file_bytes(200)
    rng = random.Random(seed)
    with BlockCache(cache_dir, budget, block_bytes=200) as c:
        for _ in range(40):
            a = rng.randrange(len(data))
            b = min(len(data), a + rng.randrange(1, 700))
            assert c.read_ranges(f"obj{seed}", len(data), [(a, b)], Source(data).fetch) == [
                data[a:b]
            ]
            assert on_disk(folder_of(c)) <= budget


def test_threads_of_one_process_fetch_each_block_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    data = payload(20 * 500)
    source = Source(data)

    def check() -> int:
        with BlockCache(tmp_path, 10**6, block_bytes=500) as c, ThreadPoolExecutor(4) as pool:
            ranges = whole_ranges(len(data), 700)
            futures = [
                pool.submit(c.read_ranges, "obj", len(data), ranges[k:] + ranges[:k], source.fetch)
                for k in (0, 3, 7, 11)
            ]
            for k, f in zip((0, 3, 7, 11), futures, strict=True):
                assert f.result() == [data[a:b] for a, b in ranges[k:] + ranges[:k]]
        assert sorted(source.fetched) == whole_ranges(len(data), 500)
        return 0

    assert run_isolated(check, timeout=60) == 0


# -- the folder ------------------------------------------------------------------------------


def test_the_last_member_to_leave_removes_the_folder_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "only-copy.zr").write_bytes(b"precious")  # cache_dir holds the user's data
    data = payload(500)
    first = BlockCache(tmp_path, 10**6, block_bytes=100)
    second = BlockCache(tmp_path, 10**6, block_bytes=100)
    first.read_ranges("obj", 500, [(0, 500)], Source(data).fetch)
    first.close()
    assert len(block_files(folder_of(second))) == 5  # a member is left: kept
    source = Source(data)
    assert second.read_ranges("obj", 500, [(0, 500)], source.fetch) == [data]
    assert source.calls == []
    second.close()
    assert os.listdir(tmp_path) == ["only-copy.zr"]
    assert (tmp_path / "only-copy.zr").read_bytes() == b"precious"


def test_a_folder_left_by_dead_members_is_cleared_on_joining(tmp_path: Path) -> None:
    data = payload(500)
    run_all([SPAWN.Process(target=leave_without_closing, args=(str(tmp_path),))])
    (name,) = os.listdir(tmp_path)
    assert len(block_files(tmp_path / name)) == 5
    with BlockCache(tmp_path, 10**6, block_bytes=100) as c:
        assert block_files(folder_of(c)) == []  # nobody was left to vouch for them
        assert c.read_ranges("obj", 500, [(0, 500)], Source(data).fetch) == [data]
    assert os.listdir(tmp_path) == []


def leave_without_closing(cache_dir: str) -> None:
    c = BlockCache(cache_dir, 10**6, block_bytes=100)
    c.read_ranges("obj", 500, [(0, 500)], Source(payload(500)).fetch)
    os._exit(0)  # as a crash would: no close


@pytest.mark.parametrize("how", ["a link out", "foreign files", "another identity", "a file"])
def test_a_cache_folder_that_is_not_ours_is_refused_and_left_alone(
    tmp_path: Path, how: str
) -> None:
    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir()
    elsewhere.mkdir()
    (elsewhere / "data.bin").write_bytes(b"not a cache")
    folder = cache / "chute-blocks-100"
    if how == "a link out":
        folder.symlink_to(elsewhere)
    elif how == "foreign files":
        folder.mkdir()
        (folder / "data.bin").write_bytes(b"not a cache")
    elif how == "another identity":
        folder.mkdir()
        (folder / "identity").write_bytes(b"0" * 64)
        (folder / "x.blk").write_bytes(b"whatever")
    else:
        folder.write_bytes(b"not a cache")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(UnsafeFileError, match="chute-blocks-100"):
        BlockCache(cache, 10**6, block_bytes=100)
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # nothing removed, nothing left behind


def test_cache_dir_must_exist(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cache_dir"):
        BlockCache(tmp_path / "absent", 10**8)


def test_a_closed_cache_refuses_reads(tmp_path: Path) -> None:
    c = BlockCache(tmp_path, 10**6, block_bytes=100)
    c.close()
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.read_ranges("obj", 10, [(0, 10)], Source(bytes(10)).fetch)
