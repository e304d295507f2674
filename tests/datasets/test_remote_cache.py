"""A remote dataset read through the local block cache (``cache_dir=``, ``cache_bytes=``):
the same records, each block fetched once per host while it is cached, a cache smaller than
the data still correct, the options checked like every other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import DataLoader, Dataset
from chute.errors import CacheTooSmallError, ChecksumError
from tests.objects.fault_proxy import FaultProxy
from tests.objects.remote import to_s3

ROWS = np.arange(3000 * 48, dtype=np.int32).reshape(3000, 48)  # 192 bytes a record


def _chunk_gets(proxy: FaultProxy) -> int:
    """GETs of chunk files (``part-N.zr/K.zr``): the record bytes, not the small files."""
    return sum(1 for m, p in proxy.seen if m == "GET" and re.search(r"/\d+\.zr$", p))


def _cache_of(ds: Dataset) -> Any:
    store = ds.store  # a sharded dataset's folder holds the reader, a single store its own
    return (store._dir.reader if hasattr(store, "_dir") else store._reader).cache


@pytest.fixture
def remote(tmp_path: Path, s3_server: str) -> tuple[str, dict[str, object]]:
    chute.write_dataset(tmp_path / "d", ROWS, shard_records=1000, codec="zstd").close()
    return to_s3(tmp_path / "d", s3_server)


def test_a_second_pass_and_a_second_reader_fetch_nothing(
    remote: tuple[str, dict[str, object]], tmp_path: Path, s3_server: str
) -> None:
    url, options = remote
    cache = tmp_path / "cache"
    order = np.random.default_rng(0).permutation(len(ROWS))
    with FaultProxy(s3_server) as proxy:
        opts = {**options, "endpoint": proxy.endpoint, "cache_dir": cache, "cache_bytes": 64 << 20}
        with Dataset(url, **opts) as first, Dataset(url, **opts) as second:
            for batch in np.array_split(order, 30):
                assert np.array_equal(first[batch], ROWS[batch])
            fetched = _chunk_gets(proxy)
            assert fetched == 3  # one block of each shard's chunk, not a GET a record
            for batch in np.array_split(order[::-1], 30):
                assert np.array_equal(first[batch], ROWS[batch])
                assert np.array_equal(second[batch], ROWS[batch])
            assert _chunk_gets(proxy) == fetched  # both served from the host's cache
            assert _cache_of(second).stats()["misses"] == 0


def test_a_cache_smaller_than_the_data_still_reads_it_right(tmp_path: Path, s3_server: str) -> None:
    rows = np.random.default_rng(2).integers(0, 1 << 30, (3000, 768), np.int32)  # 9 MiB raw
    chute.write_dataset(tmp_path / "big", rows, shard_records=1000, codec="raw").close()
    url, options = to_s3(tmp_path / "big", s3_server)
    small = {**options, "cache_dir": tmp_path / "c", "cache_bytes": 5 << 20}  # one block
    with Dataset(url, **small) as ds:
        order = np.random.default_rng(1).permutation(len(rows))
        for batch in np.array_split(order, 10):
            assert np.array_equal(ds[batch], rows[batch])
        with DataLoader({"x": ds}, batch_size=256, sampler="window", window=1, seed=3) as loader:
            seen = []
            for _ in range(11):
                seen.append(next(loader)["x"])
        stats = _cache_of(ds).stats()
    local = Dataset(tmp_path / "big")
    with local, DataLoader({"x": local}, batch_size=256, sampler="window", window=1, seed=3) as ref:
        for got in seen:
            assert np.array_equal(got, next(ref)["x"])
    assert stats["evictions"] > 0  # the data did not fit: blocks were evicted and refetched
    assert not any((tmp_path / "c").iterdir())  # the last reader removed the cache's folder


def test_cache_options_are_checked_before_any_request(
    remote: tuple[str, dict[str, object]], tmp_path: Path
) -> None:
    url, options = remote
    with pytest.raises(TypeError, match="did you mean 'cache_bytes'"):
        Dataset(url, **options, cache_dir=tmp_path, cache_byts=1 << 20)
    with pytest.raises(TypeError, match="cache_bytes= needs cache_dir="):
        Dataset(url, **options, cache_bytes=1 << 20)
    with pytest.raises(CacheTooSmallError):
        Dataset(url, **options, cache_dir=tmp_path, cache_bytes=1024)
    with pytest.raises(ValueError, match="cache_bytes must be"):
        Dataset(url, **options, cache_dir=tmp_path, cache_bytes=-1)


def test_records_across_a_block_edge_read_right_cold_and_warm(
    tmp_path: Path, s3_server: str
) -> None:
    # one store of 8.4 MB raw: its chunk object spans three 4 MiB blocks of the cache, and
    # records 59 and 119 run over a block's edge (served joined from two blocks)
    rows = np.random.default_rng(4).integers(0, 256, (120, 70_001), np.uint8)
    chute.write_dataset(tmp_path / "edge", rows, codec="raw").close()
    url, options = to_s3(tmp_path / "edge", s3_server)
    cache = {"cache_dir": tmp_path / "c", "cache_bytes": 64 << 20}
    with Dataset(url, **options, **cache, verify=True) as ds:
        for order in (np.arange(len(rows))[::-1], [59, 58, 60, 3], [59], np.arange(50, 70)):
            for _ in ("cold", "warm"):
                assert np.array_equal(ds[order], rows[order])
        assert _cache_of(ds).stats()["misses"] == 3  # each block fetched once


def test_damage_on_a_block_edge_is_reported_through_the_cache(
    tmp_path: Path, s3_server: str
) -> None:
    rows = np.random.default_rng(5).integers(0, 256, (120, 70_001), np.uint8)
    chute.write_dataset(tmp_path / "edge", rows, codec="raw").close()
    chunk = tmp_path / "edge" / "0.zr"
    data = bytearray(chunk.read_bytes())
    data[4 << 20] ^= 0xFF  # inside record 59, just past the first block's edge
    chunk.write_bytes(bytes(data))
    url, options = to_s3(tmp_path / "edge", s3_server)
    with Dataset(url, **options, cache_dir=tmp_path / "c", verify=True) as ds:
        assert np.array_equal(ds[[58, 60]], rows[[58, 60]])
        for _ in ("cold", "warm"):
            with pytest.raises(ChecksumError, match=r"record 59 \(chunk 0, offset 4130059\)"):
                ds[[1, 59]]
