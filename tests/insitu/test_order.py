"""Properties of the epoch order over many geometries, through the public dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chute.insitu import InSituDataset, open_geometries, split_by_chunk


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 120),
    chunk=st.integers(1, 12),
    batch=st.integers(1, 20),
    block=st.integers(1, 6),
    count=st.integers(1, 4),
    epoch=st.integers(0, 1000),
)
def test_sharded_shuffled_epochs_partition_by_chunk(
    tmp_path_factory: object, n: int, chunk: int, batch: int, block: int, count: int, epoch: int
) -> None:
    path = Path(tmp_path_factory.mktemp("order")) / "a.zarr"  # type: ignore[attr-defined]
    zarr.create_array(str(path), shape=(n,), chunks=(chunk,), dtype="i4")[:] = np.arange(n)
    (geom,) = open_geometries(path).values()
    m = split_by_chunk(geom, (1.0, 0.0, 0.0))
    if -(-n // chunk) < count:  # a rank without a chunk: every rank's pass would be empty
        with pytest.raises(ValueError, match="'train' split cannot be sharded"):
            InSituDataset(path, m, batch_size=batch, block_chunks=block, shard=(0, count))
        return
    ranks = []
    for rank in range(count):
        with InSituDataset(
            path, m, batch_size=batch, block_chunks=block, shard=(rank, count)
        ) as ds:
            ds.set_epoch(epoch)
            batches = list(ds.train)
            for b in batches:
                vals = next(v for k, v in b.items() if k != "sample_indices")
                np.testing.assert_array_equal(vals, b["sample_indices"])
            ranks.append(batches)
    assert len({len(r) for r in ranks}) == 1  # equal batch counts
    seen = [
        np.concatenate([b["sample_indices"] for b in r]) if r else np.zeros(0, int) for r in ranks
    ]
    flat = np.concatenate(seen)
    assert len(set(flat.tolist())) == len(flat)  # nothing twice
    chunk_sets = [set((s // chunk).tolist()) for s in seen]
    assert sum(len(c) for c in chunk_sets) == len(set().union(*chunk_sets))  # disjoint chunks
    if count == 1:
        assert sorted(flat.tolist()) == list(range(n))
    else:  # to equalise ranks, each other rank drops less than two chunks' worth
        assert n - len(flat) < 2 * (count - 1) * chunk


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch=st.integers(1, 40),
    block=st.integers(1, 8),
    slack=st.integers(0, 30),
    epochs=st.integers(1, 3),
)
def test_any_budget_that_is_accepted_is_never_exceeded(
    tmp_path_factory: object, batch: int, block: int, slack: int, epochs: int
) -> None:
    path = Path(tmp_path_factory.mktemp("budget")) / "b.zarr"  # type: ignore[attr-defined]
    g = zarr.open_group(str(path), mode="w")
    g.create_array("v", shape=(150, 4), chunks=(6, 4), dtype="i8")[:] = np.arange(600).reshape(
        150, 4
    )
    g.create_array("w", shape=(150,), chunks=(10,), dtype="f4")[:] = np.arange(150)
    geoms = open_geometries(path)
    m = split_by_chunk(geoms["v"], (0.7, 0.2, 0.1))
    slab = geoms["v"].slab_nbytes + 2 * geoms["w"].slab_nbytes
    budget = (slack + 1) * slab
    try:
        ds = InSituDataset(
            path, m, geoms, batch_size=batch, block_chunks=block, cache_budget_bytes=budget
        )
    except ValueError as exc:
        assert "cache_budget_bytes" in str(exc)
        return
    with ds:
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            for view in ("train", "val"):
                seen = []
                for b in getattr(ds, view):
                    np.testing.assert_array_equal(b["v"][:, 0], b["sample_indices"] * 4)
                    np.testing.assert_array_equal(b["w"], b["sample_indices"])
                    seen.extend(b["sample_indices"].tolist())
                assert sorted(seen) == m.sample_indices(view).tolist()
        assert ds.stats()["peak_bytes"] <= budget
