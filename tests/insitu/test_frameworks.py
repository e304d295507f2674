"""Framework surfaces of the in-place loader: torch IterableDataset, JAX batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chute.frameworks import as_torch, to_jax
from chute.insitu import InSituDataset, StandardScaler, open_geometries, split_by_chunk

from .conftest import x_values

torch = pytest.importorskip("torch")


def dataset(archive: Path, **kw: object) -> InSituDataset:
    return InSituDataset(archive, split_by_chunk(open_geometries(archive)["x"]), **kw)  # type: ignore[arg-type]


def test_as_torch_feeds_a_dataloader_with_tensors(archive: Path) -> None:
    from torch.utils.data import DataLoader

    with dataset(archive, batch_size=8) as ds:
        loader = DataLoader(as_torch(ds.train), batch_size=None, num_workers=0)
        assert len(loader) == len(ds.train)
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen = []
            for b in loader:
                assert isinstance(b["x"], torch.Tensor) and b["x"].dtype == torch.float32
                idx = b["sample_indices"].numpy()
                np.testing.assert_array_equal(b["x"].numpy(), x_values(idx))
                seen.extend(idx.tolist())
            assert sorted(seen) == ds.manifest.sample_indices("train").tolist()


def test_as_torch_refuses_worker_processes(archive: Path) -> None:
    from torch.utils.data import DataLoader

    with dataset(archive, batch_size=8) as ds:
        loader = DataLoader(as_torch(ds.val), batch_size=None, num_workers=1)
        with pytest.raises(RuntimeError, match="num_workers=0"):
            next(iter(loader))


def test_to_jax_converts_a_batch(archive: Path) -> None:
    jax = pytest.importorskip("jax")
    with dataset(archive, batch_size=8) as ds:
        b = next(iter(ds.val))
        out = to_jax(b)
    assert isinstance(out["x"], jax.Array)
    np.testing.assert_array_equal(np.asarray(out["x"]), x_values(b.sample_indices))


def test_batch_spec_follows_the_transforms(archive: Path) -> None:
    scaler = StandardScaler(mean={"y": 0.0}, std={"y": 2.0})  # int64 y becomes float32

    def add(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {**batch, "both": np.concatenate([batch["x"][:, 0, :2], batch["y"][:, None]], 1)}

    with dataset(archive, batch_size=8, chunk_transforms=[scaler], batch_transforms=[add]) as ds:
        spec = ds.batch_spec()
        b = next(iter(ds.val))
    assert spec == {
        "x": ((None, 3, 5), np.dtype("float32")),
        "y": ((None,), np.dtype("float32")),
        "sample_indices": ((None,), np.dtype("int64")),
        "both": ((None, 3), np.dtype("float32")),
    }
    assert {k: (v.shape[1:], v.dtype) for k, v in b.items()} == {
        k: (s[1:], d) for k, (s, d) in spec.items()
    }
