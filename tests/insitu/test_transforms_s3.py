"""Chunk and batch transforms, and reading through s3:// from a local moto server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chute.insitu import InSituDataset, StandardScaler, open_geometries, split_by_chunk

from .conftest import N, x_values


def test_standard_scaler_fit_on_train_and_applied_once_per_chunk(archive: Path) -> None:
    geoms = open_geometries(archive, ["x", "y"])
    m = split_by_chunk(geoms["x"])
    scaler = StandardScaler.fit(archive, m, ["x"], n_chunks=100)
    train = x_values(m.sample_indices("train")).astype(np.float64)
    assert scaler.mean["x"] == pytest.approx(train.mean())
    assert scaler.std["x"] == pytest.approx(train.std())
    calls = []

    def counted(variable: str, chunk: np.ndarray) -> np.ndarray:
        calls.append(variable)
        return chunk

    def add_sum(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {**batch, "x_sum": batch["x"].sum(axis=(1, 2))}

    with InSituDataset(
        archive,
        m,
        geoms,
        batch_size=16,
        cache_budget_bytes=10**6,
        chunk_transforms=[scaler, counted],
        batch_transforms=[add_sum],
    ) as ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            for b in ds.train:
                idx = b["sample_indices"]
                expect = (x_values(idx) - np.float32(scaler.mean["x"])) / np.float32(
                    scaler.std["x"]
                )
                np.testing.assert_allclose(b["x"], expect, rtol=1e-6)
                np.testing.assert_array_equal(b["y"], idx)  # no statistics: passed through
                np.testing.assert_allclose(b["x_sum"], b["x"].sum(axis=(1, 2)))
    assert len(calls) == 2 * len(m.chunk_ids("train"))  # cached: once per chunk, not per epoch


def test_shape_changing_chunk_transform_is_refused(archive: Path) -> None:
    geoms = open_geometries(archive, ["y"])
    with (
        InSituDataset(
            archive, split_by_chunk(geoms["y"]), geoms, chunk_transforms=[lambda v, c: c[:1]]
        ) as ds,
        pytest.raises(ValueError, match="changed the shape"),
    ):
        list(ds.train)


def test_scaler_validates_statistics() -> None:
    with pytest.raises(ValueError, match="std"):
        StandardScaler(mean={"x": 0.0}, std={"x": 0.0})
    with pytest.raises(ValueError, match="different variables"):
        StandardScaler(mean={"x": 0.0}, std={"y": 1.0})


def test_s3_geometry_and_epoch_through_moto(s3_archive: tuple[str, dict[str, Any]]) -> None:
    url, options = s3_archive
    geoms = open_geometries(url, ["x", "y"], **options)
    assert geoms["x"].shape == (N, 3, 5)
    m = split_by_chunk(geoms["x"])
    with InSituDataset(url, m, geoms, batch_size=12, **options) as ds:
        seen = []
        for b in ds.train:
            np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
            np.testing.assert_array_equal(b["y"], b["sample_indices"])
            seen.extend(b["sample_indices"].tolist())
        assert sorted(seen) == m.sample_indices("train").tolist()
        reads = ds.stats()["store_reads"]
        assert reads >= 2 * len(m.chunk_ids("train"))
        assert ds.config.max_inflight >= 4


def test_s3_missing_bucket_is_a_clear_error(s3_server: str) -> None:
    from .conftest import S3_OPTIONS

    with pytest.raises(Exception, match=r"(?i)bucket|not ?found|404"):
        open_geometries("s3://no-such-bucket/data.zarr", **S3_OPTIONS, endpoint=s3_server)


def test_batches_hand_off_to_torch_without_copying(archive: Path) -> None:
    torch = pytest.importorskip("torch")
    from chute.frameworks import to_torch

    geoms = open_geometries(archive, ["x", "y"])
    with InSituDataset(archive, split_by_chunk(geoms["x"]), geoms, batch_size=8) as ds:
        batch = next(iter(ds.train))
        tensors = to_torch(batch)
    assert isinstance(tensors["x"], torch.Tensor)
    np.testing.assert_array_equal(tensors["x"].numpy(), x_values(batch["sample_indices"]))
    assert tensors["x"].data_ptr() == batch["x"].ctypes.data  # same memory
