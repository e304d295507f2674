"""The first batch of a pass waits for its own chunks only; recycled batch arrays are safe."""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from chute.insitu import InSituDataset, open_geometries, split_by_chunk

from .conftest import CHUNK, N, x_values

GATE_TIMEOUT_S = 20  # a regression fails after this long instead of hanging the suite


class GateStore(WrapperStore[Store]):
    """Lets the first ``open_reads`` chunk reads through; the rest wait until ``release``."""

    def __init__(self, store: Store, open_reads: int) -> None:
        super().__init__(store)
        self.open_reads = open_reads
        self.chunk_reads = 0
        self.released = threading.Event()
        self.timed_out = False

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if "/c/" in key:
            self.chunk_reads += 1
            if self.chunk_reads > self.open_reads:
                waited = 0.0
                while not self.released.is_set():
                    if waited > GATE_TIMEOUT_S:
                        self.timed_out = True
                        self.released.set()
                    await asyncio.sleep(0.01)
                    waited += 0.01
        return await self._store.get(key, prototype, byte_range)


def even_archive(path: Path, n: int = 96, chunk: int = 4) -> Path:
    values = np.arange(n)[:, None] * 10 + np.arange(3)
    zarr.create_array(str(path), shape=(n, 3), chunks=(chunk, 3), dtype="i8")[:] = values
    return path


@pytest.mark.parametrize("batch", [4, 8, 12])
def test_first_batch_draws_from_the_fewest_chunks_and_windows_still_hold(
    tmp_path: Path, batch: int
) -> None:
    path = even_archive(tmp_path / "even.zarr")
    (geom,) = open_geometries(path).values()
    m = split_by_chunk(geom, (1.0, 0.0, 0.0))
    lead = math.ceil(batch / 4)
    firsts = []
    with InSituDataset(path, m, batch_size=batch, block_chunks=6) as ds:
        for epoch in range(8):
            ds.set_epoch(epoch)
            order = np.concatenate([b["sample_indices"] for b in ds.train])
            assert sorted(order.tolist()) == list(range(96))
            for start in range(0, len(order), 6 * 4):  # windows of block_chunks chunks
                assert len(set((order[start : start + 24] // 4).tolist())) <= 6
            first = order[:batch]
            assert len(set((first // 4).tolist())) == lead
            # the rest of the lead chunks follow before anything else of the window
            assert len(set((order[: lead * 4] // 4).tolist())) == lead
            firsts.append(first.tolist())
    assert any(f != sorted(f) for f in firsts)  # still shuffled within the lead chunks
    assert len({tuple(f) for f in firsts}) == len(firsts)  # and differently per epoch


def test_first_batch_does_not_wait_for_the_rest_of_its_window(archive: Path) -> None:
    gate = GateStore(LocalStore(str(archive), read_only=True), open_reads=2)
    geoms = open_geometries(gate, ["y"])
    m = split_by_chunk(geoms["y"])
    with InSituDataset(gate, m, geoms, batch_size=2 * CHUNK, block_chunks=6, max_inflight=2) as ds:
        it = iter(ds.train)
        first = next(it)
        arrived_while_gated = not gate.released.is_set()
        gate.released.set()
        rest = list(it)
    assert arrived_while_gated and not gate.timed_out
    assert len(set((first["sample_indices"] // CHUNK).tolist())) == 2
    seen = np.concatenate([first["sample_indices"], *(b["sample_indices"] for b in rest)])
    assert sorted(seen.tolist()) == m.sample_indices("train").tolist()
    for b in [first, *rest]:
        np.testing.assert_array_equal(b["y"], b["sample_indices"])


def test_batches_kept_by_the_caller_are_never_overwritten(archive: Path) -> None:
    geoms = open_geometries(archive, ["x", "y"])
    m = split_by_chunk(geoms["x"])
    with InSituDataset(archive, m, geoms, batch_size=8, block_chunks=2) as ds:
        kept, views, idx_of_views = [], [], []
        for epoch in range(3):
            ds.set_epoch(epoch)
            for i, b in enumerate(ds.train):
                if i % 3 == 0:
                    kept.append(b)  # the whole batch
                elif i % 3 == 1:
                    views.append(b["x"][1:])  # only a view keeps the array alive
                    idx_of_views.append(b["sample_indices"][1:])
                # every third batch is dropped at once, so its arrays can be reused
    for b in kept:
        np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
        np.testing.assert_array_equal(b["y"], b["sample_indices"])
    for view, idx in zip(views, idx_of_views, strict=True):
        np.testing.assert_array_equal(view, x_values(idx))


def test_dropped_batches_are_recycled_and_tensors_keep_theirs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from chute.frameworks import to_torch

    path = even_archive(tmp_path / "even.zarr", n=400)
    geoms = open_geometries(path)
    m = split_by_chunk(next(iter(geoms.values())), (1.0, 0.0, 0.0))
    with InSituDataset(path, m, geoms, batch_size=8, block_chunks=2) as ds:
        addresses = set()
        tensors = []
        for i, b in enumerate(ds.train):
            (name,) = (k for k in b if k != "sample_indices")
            addresses.add(b[name].ctypes.data)
            if i % 10 == 0:
                tensors.append((to_torch(b)[name], b["sample_indices"].copy()))
            del b
    # 50 batches, but only a few arrays: each dropped one is written again
    assert len(addresses) < 50 // 2
    for tensor, idx in tensors:
        assert isinstance(tensor, torch.Tensor)
        np.testing.assert_array_equal(tensor.numpy(), idx[:, None] * 10 + np.arange(3))


def test_values_are_right_across_epochs_with_recycled_arrays(archive: Path) -> None:
    geoms = open_geometries(archive, ["x"])
    m = split_by_chunk(geoms["x"])
    with InSituDataset(archive, m, geoms, batch_size=5, block_chunks=3) as ds:
        total = 0
        for epoch in range(3):
            ds.set_epoch(epoch)
            for b in ds.train:
                np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
                total += len(b["sample_indices"])
            for b in ds.all:
                np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
    assert total == 3 * len(m.sample_indices("train")) and N > 0


def test_threads_start_with_the_dataset_and_stop_with_it(archive: Path) -> None:
    before = set(threading.enumerate())
    geoms = open_geometries(archive, ["x"])
    with InSituDataset(archive, split_by_chunk(geoms["x"]), geoms, decode_threads=3) as ds:
        started = {t for t in threading.enumerate() if t.name.startswith("chute-insitu")}
        started -= before
        names = sorted(t.name.rstrip("0123456789") for t in started)
        assert names == ["chute-insitu-gather_", "chute-insitu-loop", *["chute-insitu_"] * 3]
        assert sum(len(b["x"]) for b in ds.val) == len(ds.manifest.sample_indices("val"))
        now = {t for t in threading.enumerate() if t.name.startswith("chute-insitu")}
        assert now - before == started  # a pass starts no threads of its own
    assert not any(t.is_alive() for t in started)
