"""Metadata that does not match the stored chunks, Zarr v2, and sample-axis mistakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from chute.errors import ChuteError
from chute.insitu import BadChunkError, InSituDataset, open_geometries, split_by_chunk

VALUES = np.arange(120, dtype=np.float32).reshape(40, 3)
CODECS: dict[str, dict[str, Any]] = {
    "zstd": {},
    "raw": {"compressors": None},
    "gzip": {"compressors": zarr.codecs.GzipCodec()},
}


def write(path: Path, codec: str) -> None:
    g = zarr.open_group(str(path), mode="w")
    g.create_array("v", shape=(40, 3), chunks=(8, 3), dtype="f4", **CODECS[codec])[:] = VALUES


def edit_metadata(path: Path, **change: Any) -> None:
    meta_path = path / "v" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    if "dtype" in change:
        meta["data_type"] = change["dtype"]
    if "chunk_shape" in change:
        meta["chunk_grid"]["configuration"]["chunk_shape"] = change["chunk_shape"]
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize(
    "change",
    [{"dtype": "float64"}, {"dtype": "int16"}, {"chunk_shape": [4, 3]}, {"chunk_shape": [16, 3]}],
    ids=["wider-dtype", "narrower-dtype", "smaller-chunks", "larger-chunks"],
)
def test_metadata_that_no_longer_matches_the_chunks_is_a_bad_chunk(
    tmp_path: Path, codec: str, change: dict[str, Any]
) -> None:
    path = tmp_path / "a.zarr"
    write(path, codec)
    edit_metadata(path, **change)
    geoms = open_geometries(path)
    with (
        InSituDataset(path, split_by_chunk(geoms["v"]), batch_size=4) as ds,
        pytest.raises(BadChunkError, match=r"v/c/\d+/0") as info,
    ):
        list(ds.all)
    assert isinstance(info.value, ChuteError) and isinstance(info.value, RuntimeError)


def test_a_zstd_frame_without_its_size_is_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chute.insitu import _decode

    monkeypatch.setattr(_decode, "zstd_content_size", lambda src: None)
    path = tmp_path / "a.zarr"
    write(path, "zstd")
    with InSituDataset(path, split_by_chunk(open_geometries(path)["v"]), batch_size=4) as ds:
        for b in ds.all:  # the right size passes through the spare-byte decode
            np.testing.assert_array_equal(b["v"], VALUES[b["sample_indices"]])
    edit_metadata(path, chunk_shape=[4, 3])
    ds = InSituDataset(path, split_by_chunk(open_geometries(path)["v"]), batch_size=4)
    with ds, pytest.raises(BadChunkError, match="more than"):
        list(ds.all)


@pytest.mark.parametrize("layout", ["group", "array"])
def test_zarr_v2_stores_are_read(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "v2.zarr"
    if layout == "group":
        g = zarr.open_group(str(path), mode="w", zarr_format=2)
        g.create_array("v", shape=(40, 3), chunks=(8, 3), dtype="f4")[:] = VALUES
        name = "v"
    else:
        zarr.create_array(str(path), shape=(40, 3), chunks=(8, 3), dtype="f4", zarr_format=2)[:] = (
            VALUES
        )
        name = "v2"
    geoms = open_geometries(path)
    assert list(geoms) == [name]
    with InSituDataset(path, split_by_chunk(geoms[name]), batch_size=6) as ds:
        seen = []
        for b in ds.train:
            np.testing.assert_array_equal(b[name], VALUES[b["sample_indices"]])
            seen.extend(b["sample_indices"].tolist())
        assert sorted(seen) == ds.manifest.sample_indices("train").tolist()


def test_a_damaged_v2_chunk_is_a_bad_chunk(tmp_path: Path) -> None:
    path = tmp_path / "v2.zarr"
    g = zarr.open_group(str(path), mode="w", zarr_format=2)
    g.create_array("v", shape=(40, 3), chunks=(8, 3), dtype="f4")[:] = VALUES
    (path / "v" / "1.0").write_bytes(b"garbage")
    geoms = open_geometries(path)
    ds = InSituDataset(path, split_by_chunk(geoms["v"]), batch_size=8)
    with ds, pytest.raises(BadChunkError, match=r"v/1\.0"):
        list(ds.all)


def test_sample_axis_out_of_range_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    write(path, "zstd")
    with pytest.raises(ValueError, match="no array has a sample_axis=2"):
        open_geometries(path, sample_axis=2)
    with pytest.raises(ValueError, match=r"sample_axis=2 is outside the axes of \{'v': 2\}"):
        open_geometries(path, ["v"], sample_axis=2)
    with pytest.raises(ValueError, match="non-negative"):
        open_geometries(path, sample_axis=-1)


def test_a_requested_variable_with_another_sample_axis_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.zarr"
    g = zarr.open_group(str(path), mode="w")
    g.create_array("v", shape=(40, 3), chunks=(8, 3), dtype="f4")[:] = VALUES
    g.create_array("w", shape=(3, 40), chunks=(3, 8), dtype="f4")[:] = VALUES.T
    geoms = open_geometries(path, ["v", "w"])  # w's samples are on axis 1, not 0
    m = split_by_chunk(geoms["v"])
    with pytest.raises(ValueError, match=r"'w': '3 samples on axis 0'"):
        InSituDataset(path, m, geoms)
    geoms["w"] = open_geometries(path, ["w"], sample_axis=1)["w"]
    with InSituDataset(path, m, geoms, batch_size=8) as ds:
        for b in ds.all:
            np.testing.assert_array_equal(b["w"], b["v"])
