"""The step loader over sharded datasets: the same batches as over one store, exact resume,
and a host with ``shard=`` opening only the shards its slice of the batch lies in."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import chute
from chute import DataLoader, Dataset, EvalPass, RaggedDataset, write_dataset, write_ragged
from chute.datasets import ShardedStore
from tests.objects.remote import Serve

N = 800
IMAGES = np.random.default_rng(0).integers(0, 255, (N, 3, 4), dtype=np.uint8)


@pytest.fixture(scope="module", params=["local", "s3"])
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Dataset, Dataset]:
    """One store and a sharded dataset of the same images, read from their folders or through
    s3:// (the moto server)."""
    root = tmp_path_factory.mktemp("pair")
    serve = Serve(None if request.param == "local" else request.getfixturevalue("s3_server"))
    return serve(write_dataset(root / "one", IMAGES)), serve(
        write_dataset(root / "many", IMAGES, shard_records=100)
    )


def _batches(ds: Dataset, mode: str, start: int, n: int, **kw: object) -> list[np.ndarray]:
    with DataLoader({"x": ds}, 64, mode, seed=3, start_step=start, **kw) as dl:  # type: ignore[arg-type]
        return [next(dl)["x"] for _ in range(n)]


@pytest.mark.parametrize("mode", ["sequential", "iid", "cyclic"])
def test_same_batches_as_one_store_and_exact_resume(
    pair: tuple[Dataset, Dataset], mode: str
) -> None:
    one, many = pair
    want = _batches(one, mode, 0, 20)
    got = _batches(many, mode, 0, 7, num_threads=3) + _batches(many, mode, 7, 13, num_threads=1)
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)
    with DataLoader({"x": many}, 64, mode, seed=3) as dl:
        for _ in range(5):
            next(dl)
        state = dl.state_dict()
    with DataLoader({"x": many}, 64, mode, seed=3) as dl:
        dl.load_state_dict(state)
        assert np.array_equal(next(dl)["x"], want[5])


@pytest.mark.parametrize("count", [2, 4])
def test_shards_partition_the_global_batch(pair: tuple[Dataset, Dataset], count: int) -> None:
    one, many = pair
    whole = _batches(one, "cyclic", 2, 3)
    parts = [_batches(many, "cyclic", 2, 3, shard=(i, count)) for i in range(count)]
    for step in range(3):
        assert np.array_equal(np.concatenate([p[step] for p in parts]), whole[step])


def test_a_host_opens_only_the_shards_of_its_slice(tmp_path: Path, serve: Serve) -> None:
    # 8 shards of 100; a sequential global batch of 400 split over 4 hosts: host h reads
    # records [400 s + 100 h, 400 s + 100 h + 100) at step s, so one shard per step
    write_dataset(tmp_path / "d", IMAGES, shard_records=100).close()
    write_ragged(tmp_path / "l", [np.arange(i % 3) for i in range(N)], shard_records=100).close()
    for host in range(4):
        streams = {
            "x": serve.open(Dataset, tmp_path / "d"),
            "y": serve.open(RaggedDataset, tmp_path / "l"),
        }
        with DataLoader(streams, 400, "sequential", shard=(host, 4), prefetch=1) as dl:
            batches = [next(dl) for _ in range(3)]  # steps 0, 1, 2
        assert np.array_equal(batches[1]["x"], IMAGES[400 + 100 * host : 500 + 100 * host])
        for stream in streams.values():
            store = stream.store
            assert isinstance(store, ShardedStore)
            assert store.opened_shards == (host, host + 4)
            want = [0] * 8
            want[host], want[host + 4] = 2, 1
            assert list(store.gathers) == want


def test_an_evaluation_pass_and_its_host_slices_read_every_record_once(
    tmp_path: Path, serve: Serve
) -> None:
    rows = np.arange(230 * 3, dtype=np.int32).reshape(230, 3)
    ds = serve(chute.write_dataset(tmp_path / "e", rows, shard_records=50))
    with ds, EvalPass({"x": ds}, batch_size=32) as whole:
        got = np.concatenate([b["x"] for b in whole])
        assert np.array_equal(got, rows)  # in order, partial last batch
        hosts = []
        for host in range(2):
            with EvalPass({"x": ds}, batch_size=32, last="pad", shard=(host, 2)) as part:
                hosts.append(np.concatenate([b["x"][b["mask"]] for b in part]))
        together = np.concatenate(hosts)
        assert sorted(together[:, 0].tolist()) == rows[:, 0].tolist()


def test_the_loader_opens_the_shards_of_queued_steps_ahead(tmp_path: Path, serve: Serve) -> None:
    write_dataset(tmp_path / "d", IMAGES, shard_records=50).close()  # 16 shards
    ds = serve.open(Dataset, tmp_path / "d")
    store = ds.store
    assert isinstance(store, ShardedStore)
    with DataLoader({"x": ds}, batch_size=50, sampler="sequential", prefetch=6) as dl:
        assert np.array_equal(next(dl)["x"], IMAGES[:50])
        if serve.remote:  # steps 0-5 are queued: their shards open in the background
            deadline = time.monotonic() + 30
            while set(store.opened_shards) < set(range(6)) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert set(range(6)) <= set(store.opened_shards)
            assert dl._ahead == [ds]
        else:  # local shards gain nothing: the loader stops asking after the first step
            assert dl._ahead == []
        for step in range(1, 16):
            assert np.array_equal(next(dl)["x"], IMAGES[50 * step : 50 * step + 50])
    assert ds.readahead(np.arange(N)) is serve.remote
    ds.close()
    assert ds.readahead(np.arange(N)) is serve.remote  # closed: nothing started, no error
