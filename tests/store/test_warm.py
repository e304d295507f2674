"""Warm stores (`chute.store._warm`): a store in object storage whose chunk objects are all in
the block cache reads from a snapshot over the cached blocks, as a local store reads its
files. The same records, checksums and errors as the reads through the cache; a block
evicted is fetched again; a process keeps a bounded number of blocks warm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
from obstore.store import MemoryStore

import chute
from chute import Dataset, RaggedDataset
from chute._objects import BlockCache, Location, ObjectReader
from chute._objects import _cache as block_cache
from chute.datasets import ShardedStore
from chute.errors import ChecksumError
from chute.store import RemoteStore, _warm
from tests.objects.remote import to_memory

ROWS = np.random.default_rng(7).integers(0, 1 << 30, (600, 300), np.int32)  # 1200 B a record


@pytest.fixture(autouse=True)
def look_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read looks at the cache (not once a second), so a test sees a store turn warm."""
    monkeypatch.setattr(_warm, "RECHECK_S", 0.0)


def _cache(tmp_path: Path) -> dict[str, Any]:
    return {"cache_dir": tmp_path / "cache", "cache_bytes": 64 << 20}


def _shards(ds: Dataset) -> list[RemoteStore]:
    store = ds.store
    assert isinstance(store, ShardedStore)
    return [s for s in (store._stores) if isinstance(s, RemoteStore)]


def _blocks(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").rglob("*.blk"))


def test_a_dataset_read_warm_reads_what_it_read_cold(tmp_path: Path) -> None:
    chute.write_dataset(tmp_path / "d", ROWS, shard_records=200, codec="zstd").close()
    with Dataset(to_memory(tmp_path / "d"), **_cache(tmp_path), verify=True) as ds:
        order = np.random.default_rng(0).permutation(len(ROWS))
        for batch in np.array_split(order, 7):
            assert np.array_equal(ds[batch], ROWS[batch])
        shards = _shards(ds)
        assert len(shards) == 3 and all(s.is_warm() for s in shards)
        misses = shards[0]._reader.cache.stats()["misses"]  # type: ignore[union-attr]
        for batch in np.array_split(order[::-1], 5):
            assert np.array_equal(ds[batch], ROWS[batch])
        assert shards[0]._reader.cache.stats()["misses"] == misses  # type: ignore[union-attr]
        with chute.DataLoader({"x": ds}, batch_size=64, seed=2) as warm:
            got = [next(warm)["x"] for _ in range(12)]
    with (
        Dataset(tmp_path / "d") as local,
        chute.DataLoader({"x": local}, batch_size=64, seed=2) as ref,
    ):
        for batch in got:
            assert np.array_equal(batch, next(ref)["x"])


def test_a_batch_of_warm_and_cold_shards(tmp_path: Path) -> None:
    chute.write_dataset(tmp_path / "d", ROWS, shard_records=200, codec="raw").close()
    with Dataset(to_memory(tmp_path / "d"), **_cache(tmp_path)) as ds:
        assert np.array_equal(ds[np.arange(200)], ROWS[:200])  # shard 0 cached whole
        store = ds.store
        assert isinstance(store, ShardedStore)
        store._open_shards(range(3))
        assert [s.is_warm() for s in _shards(ds)] == [True, False, False]
        batch = np.array([599, 3, 250, 0, 401, 199])  # shards 2, 0, 1: one warm, two cold
        assert np.array_equal(ds[batch], ROWS[batch])
        assert [s.is_warm() for s in _shards(ds)] == [True, True, True]  # one block a shard


def test_records_over_block_edges_read_warm(tmp_path: Path) -> None:
    # one chunk object of 8.4 MB over three 4 MiB blocks: records 59 and 119 run over a
    # block's edge (copied once into the warm snapshot), checksums moved along
    rows = np.random.default_rng(3).integers(0, 256, (120, 70_001), np.uint8)
    chute.write_dataset(tmp_path / "s", rows, codec="raw").close()
    with Dataset(to_memory(tmp_path / "s"), **_cache(tmp_path), verify=True) as ds:
        everything = np.arange(len(rows))
        assert np.array_equal(ds[everything], rows)
        store = ds.store
        assert isinstance(store, RemoteStore) and store.is_warm()
        for order in (everything[::-1], [59, 58, 60, 3], [119], np.arange(50, 70)):
            assert np.array_equal(ds[order], rows[order])
        assert store._reader.cache.stats()["misses"] == 3  # type: ignore[union-attr]


def test_damage_reads_the_same_warm_and_cold(tmp_path: Path) -> None:
    rows = np.random.default_rng(5).integers(0, 256, (50, 4000), np.uint8)
    chute.write_dataset(tmp_path / "s", rows, codec="raw").close()
    chunk = tmp_path / "s" / "0.zr"
    data = bytearray(chunk.read_bytes())
    data[17 * 4000 + 5] ^= 0xFF  # inside record 17
    chunk.write_bytes(bytes(data))
    with Dataset(to_memory(tmp_path / "s"), **_cache(tmp_path), verify=True) as ds:
        messages = []
        for state in ("cold", "warm"):
            assert np.array_equal(ds[[16, 18]], rows[[16, 18]])
            if state == "warm":
                ds[np.arange(17)], ds[np.arange(18, 50)]
                assert isinstance(ds.store, RemoteStore) and ds.store.is_warm()
            with pytest.raises(ChecksumError, match="record 17") as caught:
                ds[[1, 17]]
            messages.append(str(caught.value))
        assert messages[0] == messages[1]


def _same(got: tuple[np.ndarray, np.ndarray], want: list[np.ndarray]) -> bool:
    """Whether a ragged batch (values, offsets) holds the records ``want``."""
    values, offsets = got
    rows = np.split(values, offsets[1:-1].astype(np.int64))
    return len(rows) == len(want) and all(
        np.array_equal(a, b) for a, b in zip(rows, want, strict=False)
    )


def test_an_evicted_block_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_cache, "_TOUCH_S", 0.0)  # the cache looks at the files each read too
    chute.write_ragged(
        tmp_path / "r", [np.arange(i % 97, dtype=np.int64) for i in range(500)], shard_records=250
    ).close()
    want = [np.arange(i % 97, dtype=np.int64) for i in range(500)]
    with RaggedDataset(to_memory(tmp_path / "r"), **_cache(tmp_path)) as ds:
        assert _same(ds[np.arange(500)], want)
        shards = _shards(ds)
        assert all(s.is_warm() for s in shards)
        misses = shards[0]._reader.cache.stats()["misses"]  # type: ignore[union-attr]
        for block in _blocks(tmp_path):  # as another process's eviction would
            block.unlink()
        assert not any(s.is_warm() for s in shards)
        assert _same(ds[[499, 3, 260]], [want[499], want[3], want[260]])
        assert shards[0]._reader.cache.stats()["misses"] == misses + 2  # both shards again


def test_a_process_keeps_a_bounded_number_of_blocks_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_warm, "MOST_BLOCKS", 1)
    chute.write_dataset(tmp_path / "d", ROWS, shard_records=200).close()
    with Dataset(to_memory(tmp_path / "d"), **_cache(tmp_path)) as ds:
        for _ in range(2):
            assert np.array_equal(ds[np.arange(600)], ROWS)
        assert sum(s.is_warm() for s in _shards(ds)) == 1  # the others read through the cache
        assert _warm._held == 1
    assert _warm._held == 0  # closing let go of it


def test_two_stores_passed_in_never_share_cache_entries(tmp_path: Path) -> None:
    # two obstore stores may be named alike (a repr with an address a later one reuses) and
    # give their objects the same ETags: neither may be served the other's cached bytes
    first, second = MemoryStore(), MemoryStore()
    obstore.put(first, "x", b"first's bytes")
    obstore.put(second, "x", b"other's bytes")
    with BlockCache(tmp_path, 1 << 20, block_bytes=4096) as cache:
        readers = [
            ObjectReader(Location("<the same name>", "memory", store, None, True), cache=cache)
            for store in (first, second)
        ]
        infos = [reader.head("x") for reader in readers]
        assert infos[0].etag == infos[1].etag and infos[0].size == infos[1].size
        got = [bytes(r.read_ranges(i, [(0, 13)])[0]) for r, i in zip(readers, infos, strict=True)]
        assert got == [b"first's bytes", b"other's bytes"]
        assert readers[1].cached([infos[1]]) is not None and cache.stats()["misses"] == 2
