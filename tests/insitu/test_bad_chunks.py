"""on_bad_chunk="nan" (insitubatch 0.2.0's policy), bad_chunks reporting, and arrays with an
axis of length 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from chute.errors import BadChunkError
from chute.insitu import InSituDataset, open_geometries, split_by_chunk


def archive(path: Path, dtype: str = "f4", inner_chunk: int = 4, fill: float = 0) -> Path:
    a = zarr.open_group(str(path), mode="w").create_array(
        "x", shape=(24, 4), chunks=(8, inner_chunk), dtype=dtype, fill_value=fill
    )
    a[:] = np.arange(96).reshape(24, 4).astype(dtype) + 1
    return path


def read_all(path: Path, **kw: object) -> tuple[np.ndarray, list[str]]:
    g = open_geometries(path)
    m = split_by_chunk(g["x"], (1.0, 0.0, 0.0))
    with InSituDataset(path, m, g, batch_size=24, num_threads=1, **kw) as ds:  # type: ignore[arg-type]
        (b,) = list(ds.all)
        return b["x"], ds.bad_chunks


def test_nan_fills_a_bad_float_chunk_and_reports_it(tmp_path: Path) -> None:
    path = archive(tmp_path / "a.zarr")
    (path / "x" / "c" / "1" / "0").write_bytes(b"garbage")
    x, bad = read_all(path, on_bad_chunk="nan")
    assert np.isnan(x[8:16]).all()
    np.testing.assert_array_equal(x[:8], np.arange(32).reshape(8, 4) + 1)
    assert bad == ["x/c/1/0"]


def test_nan_fills_only_the_bad_tile_of_a_slab(tmp_path: Path) -> None:
    path = archive(tmp_path / "a.zarr", inner_chunk=2)  # slab 1 is chunks x/c/1/0 and x/c/1/1
    (path / "x" / "c" / "1" / "1").write_bytes(b"garbage")
    x, bad = read_all(path, on_bad_chunk="nan")
    assert np.isnan(x[8:16, 2:]).all()
    np.testing.assert_array_equal(x[8:16, :2], (np.arange(96).reshape(24, 4) + 1)[8:16, :2])
    assert bad == ["x/c/1/1"]


def test_nan_fills_an_integer_chunk_with_the_fill_value(tmp_path: Path) -> None:
    path = archive(tmp_path / "a.zarr", dtype="i4", fill=-5)
    (path / "x" / "c" / "2" / "0").write_bytes(b"garbage")  # also goes through zarr: edge-free
    x, bad = read_all(path, on_bad_chunk="nan")
    assert (x[16:] == -5).all() and x.dtype == np.int32
    assert bad == ["x/c/2/0"]


def test_a_nan_filled_slab_is_not_shared_with_other_processes(tmp_path: Path) -> None:
    """The on-disk pool holds only slabs that read cleanly: a dataset raising on bad chunks
    must not be served another's NaN-filled copy."""
    path = archive(tmp_path / "a.zarr")
    (path / "x" / "c" / "1" / "0").write_bytes(b"garbage")
    cache = tmp_path / "cache"
    cache.mkdir()
    g = open_geometries(path)
    m = split_by_chunk(g["x"], (1.0, 0.0, 0.0))
    kw: dict[str, Any] = {"batch_size": 8, "cache_dir": cache, "cache_budget_bytes": 1 << 20}
    with InSituDataset(path, m, g, on_bad_chunk="nan", **kw) as a:
        list(a.all)
        with InSituDataset(path, m, g, **kw) as b:
            it = iter(b.all)
            next(it)  # slab 0 read cleanly: mapped from the first dataset's decode
            assert b.stats()["shared_hits"] >= 1
            with pytest.raises(BadChunkError, match="x/c/1/0"):
                next(it)


def test_a_chunk_two_views_read_is_listed_once(tmp_path: Path) -> None:
    path = archive(tmp_path / "a.zarr")
    (path / "x" / "c" / "1" / "0").write_bytes(b"garbage")
    g = open_geometries(path)
    g["x_next"] = g["x"].shift(3)
    m = split_by_chunk(g["x"], (1.0, 0.0, 0.0))
    for policy in ("skip", "nan"):
        with InSituDataset(path, m, g, batch_size=5, on_bad_chunk=policy) as ds:
            for epoch in range(2):
                ds.set_epoch(epoch)
                list(ds.train)
            assert ds.bad_chunks == ["x/c/1/0"]


def test_an_axis_of_length_zero_reads_empty_samples(tmp_path: Path) -> None:
    """As zarr reads it: batches with the empty axis, not an IndexError."""
    path = tmp_path / "e.zarr"
    zarr.open_group(str(path), mode="w").create_array("x", shape=(10, 0), chunks=(4, 1), dtype="f4")
    g = open_geometries(path)
    with InSituDataset(path, split_by_chunk(g["x"], (1.0, 0.0, 0.0)), g, batch_size=4) as ds:
        shapes = [b["x"].shape for b in ds.all]
        idx = [i for b in ds.all for i in b.sample_indices.tolist()]
    assert shapes == [(4, 0), (4, 0), (2, 0)] and idx == list(range(10))
