"""A sharded dataset past the single-store cap of 2**24 records reads correctly everywhere.

Tiny 4-byte records (each holds its own global index) keep it to a few hundred MiB, mostly
record tables, written by two worker processes.
"""

from __future__ import annotations

import numpy as np
import pytest

from chute import DataLoader, Dataset, write_dataset
from chute.datasets import read_manifest
from chute.store._format import MAX_RECORDS

N = MAX_RECORDS + 1000
SHARD = 3_000_000  # not a power of two: boundaries at odd places


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    path = tmp_path_factory.mktemp("big") / "d"
    source = np.arange(N, dtype=np.uint32)
    return write_dataset(path, source, codec="raw", shard_records=SHARD, workers=2)


def test_length_and_layout(big: Dataset) -> None:
    assert len(big) == N > 1 << 24 and big.shape == (N,)
    shards = read_manifest(big.path).shards
    assert [n for _, n in shards] == [SHARD] * 5 + [N - 5 * SHARD]


def test_both_ends_and_every_shard_boundary(big: Dataset) -> None:
    ends = [0, 1, N - 2, N - 1, -1, -N]
    assert big[ends].tolist() == [0, 1, N - 2, N - 1, N - 1, 0]
    for b in range(SHARD, N, SHARD):
        around = np.arange(b - 3, b + 3)
        assert big[around].tolist() == around.tolist()
        assert big[b - 2 : b + 2].tolist() == list(range(b - 2, b + 2))
    cross = np.array([N - 1, SHARD, 0, 5 * SHARD - 1, 5 * SHARD, 2 * SHARD + 7])
    assert big[cross].tolist() == cross.tolist()  # one batch over many shards, in order


def test_random_batches_and_the_loader(big: Dataset) -> None:
    idx = np.random.default_rng(0).integers(0, N, 200_000)
    assert (idx >= MAX_RECORDS).any()  # the batch reaches past the single-store cap
    assert np.array_equal(big[idx], idx.astype(np.uint32))
    with DataLoader({"i": big}, 4096, "cyclic", seed=1, start_step=4000) as dl:
        batch = next(dl)["i"]
        assert np.array_equal(batch, dl.sampler.indices(4000).astype(np.uint32))
    assert len(np.unique(batch)) == 4096
