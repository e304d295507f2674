"""Windowed views: one array read at the anchor plus an offset (insitubatch's geometry)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chute.insitu import (
    ArrayGeometry,
    InSituDataset,
    open_geometries,
    split_by_chunk,
    valid_anchor_range,
)

from .conftest import N, x_values


def windowed(archive: Path) -> dict[str, ArrayGeometry]:
    g = open_geometries(archive, ["x"])["x"]
    return {"x_prev": g.shift(-2), "x": g, "x_next": g.shift(3)}


def test_valid_anchor_range() -> None:
    assert valid_anchor_range([0], 10) == (0, 10)
    assert valid_anchor_range([-2, 0, 3], 10) == (2, 7)
    assert valid_anchor_range([-6, 6], 10) == (6, 6)  # nothing can be drawn
    assert ArrayGeometry("a", (10,), (5,), "<f4").shift(2).shift(-1).offset == 1


@pytest.mark.parametrize("view", ["train", "all"])
def test_each_view_reads_the_anchor_plus_its_offset(archive: Path, view: str) -> None:
    geoms = windowed(archive)
    m = split_by_chunk(geoms["x"])
    lo, hi = valid_anchor_range([g.offset for g in geoms.values()], N)
    with InSituDataset(archive, m, geoms, batch_size=7, block_chunks=3) as ds:
        seen = []
        for b in getattr(ds, view):
            t = b.sample_indices
            np.testing.assert_array_equal(b["x"], x_values(t))
            np.testing.assert_array_equal(b["x_prev"], x_values(t - 2))
            np.testing.assert_array_equal(b["x_next"], x_values(t + 3))
            assert b.offsets == {"x_prev": -2, "x": 0, "x_next": 3}
            np.testing.assert_array_equal(b.read_indices("x_next"), t + 3)
            assert b.stack(["x_prev", "x", "x_next"]).shape == (len(t), 3, 3, 5)
            seen.extend(t.tolist())
    split = ds.manifest.sample_indices(view)
    assert sorted(seen) == [i for i in split.tolist() if lo <= i < hi]


def test_windowed_shards_stay_disjoint_and_equal(tmp_path: Path) -> None:
    path = tmp_path / "w.zarr"
    zarr.create_array(str(path), shape=(90,), chunks=(6,), dtype="i8")[:] = np.arange(90)
    (g,) = open_geometries(path).values()
    geoms = {"now": g, "next": g.shift(1)}
    m = split_by_chunk(g, (1.0, 0.0, 0.0))
    ranks = []
    for rank in range(3):
        with InSituDataset(path, m, geoms, batch_size=5, shard=(rank, 3), block_chunks=2) as ds:
            ds.set_epoch(2)
            batches = list(ds.train)
            for b in batches:
                np.testing.assert_array_equal(b["next"], b["now"] + 1)
            ranks.append(np.concatenate([b.sample_indices for b in batches]))
    assert len({len(r) for r in ranks}) == 1
    flat = np.concatenate(ranks)
    assert len(set(flat.tolist())) == len(flat) and flat.max() < 89  # 89 has no next sample


def test_the_state_records_the_offsets(archive: Path) -> None:
    geoms = windowed(archive)
    m = split_by_chunk(geoms["x"])
    with InSituDataset(archive, m, geoms, batch_size=8) as ds:
        state = ds.state_dict()
    plain = {"x": geoms["x"]}
    with (
        InSituDataset(archive, m, plain, batch_size=8) as other,
        pytest.raises(ValueError, match="offsets: saved"),
    ):
        other.load_state_dict(state)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shift=st.integers(-13, 13),
    batch=st.integers(1, 30),
    block=st.integers(1, 6),
    slack=st.integers(0, 20),
)
def test_windowed_passes_keep_any_accepted_budget(
    tmp_path_factory: object, shift: int, batch: int, block: int, slack: int
) -> None:
    path = Path(tmp_path_factory.mktemp("wbudget")) / "b.zarr"  # type: ignore[attr-defined]
    zarr.create_array(str(path), shape=(120,), chunks=(6,), dtype="i8")[:] = np.arange(120)
    (g,) = open_geometries(path).values()
    geoms = {"now": g, "later": g.shift(shift)}
    m = split_by_chunk(g, (0.7, 0.2, 0.1))
    budget = (slack + 1) * 2 * g.slab_nbytes
    try:
        ds = InSituDataset(
            path, m, geoms, batch_size=batch, block_chunks=block, cache_budget_bytes=budget
        )
    except ValueError as exc:
        assert "cache_budget_bytes" in str(exc)
        return
    lo, hi = valid_anchor_range([0, shift], 120)
    with ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            for view in ("train", "val"):
                seen = []
                for b in getattr(ds, view):
                    np.testing.assert_array_equal(b["now"], b.sample_indices)
                    np.testing.assert_array_equal(b["later"], b.sample_indices + shift)
                    seen.extend(b.sample_indices.tolist())
                expected = [i for i in m.sample_indices(view).tolist() if lo <= i < hi]
                assert sorted(seen) == expected
        assert ds.stats()["peak_bytes"] <= budget
