"""Geometry from Zarr metadata, and chunk-aligned split manifests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

from chute.insitu import ArrayGeometry, SplitManifest, open_geometries, split_by_chunk

from .conftest import CHUNK, N


def test_geometries_of_a_group(archive: Path) -> None:
    geoms = open_geometries(archive)
    assert set(geoms) == {"lat", "x", "y", "z"}
    x = geoms["x"]
    assert (x.shape, x.chunks, x.dtype, x.shards) == ((N, 3, 5), (CHUNK, 3, 5), "<f4", None)
    assert (x.n_samples, x.sample_chunk_size, x.n_chunks) == (N, CHUNK, 26)
    assert x.sample_nbytes == 60 and x.slab_nbytes == 480


def test_geometries_variables_axis_and_urls(archive: Path) -> None:
    geoms = open_geometries(f"file://{archive}", ["z"], sample_axis=1)
    assert geoms["z"].n_samples == N and geoms["z"].sample_shape == (2,)
    single = open_geometries(archive / "x")
    assert next(iter(single.values())).shape == (N, 3, 5)
    with pytest.raises(KeyError, match="nope"):
        open_geometries(archive, ["x", "nope"])
    with pytest.raises(FileNotFoundError):
        open_geometries(archive / "missing")
    with pytest.raises(ValueError, match="scheme"):
        open_geometries("ftp://host/x.zarr")
    with pytest.raises(ValueError, match="sample_axis"):
        open_geometries(archive, ["y"], sample_axis=1)


def test_sharded_geometry(tmp_path: Path) -> None:
    arr = zarr.create_array(
        str(tmp_path / "s.zarr"), shape=(40, 6), chunks=(4, 6), shards=(16, 6), dtype="f4"
    )
    arr[:] = 1
    (geom,) = open_geometries(tmp_path / "s.zarr").values()
    assert geom.chunks == (4, 6) and geom.shards == (16, 6)
    assert geom.stored_chunks == (16, 6) and geom.sample_chunk_size == 16 and geom.n_chunks == 3


def _geom(n: int, chunk: int) -> ArrayGeometry:
    return ArrayGeometry("v", (n, 2), (chunk, 2), "<f4")


def test_split_is_chunk_aligned_and_json(tmp_path: Path) -> None:
    m = split_by_chunk(_geom(N, CHUNK))
    assert {k: len(v) for k, v in m.chunks.items()} == {"train": 21, "val": 3, "test": 2}
    assert m.ranges("train") == [(0, 168)] and m.ranges("test") == [(192, 203)]
    assert all(start % CHUNK == 0 for s in ("train", "val", "test") for start, _ in m.ranges(s))
    m.to_json(tmp_path / "m.json")
    assert SplitManifest.from_json(tmp_path / "m.json") == m
    assert json.loads(json.dumps(m.to_dict())) == m.to_dict()


def test_reads_the_reference_manifest_format() -> None:
    # written by insitubatch 0.2.0's split_by_chunk for 100 samples in chunks of 8
    ref = {
        "n_chunks": 13,
        "sample_chunk_size": 8,
        "n_samples": 100,
        "chunks": {"train": list(range(10)), "val": [10], "test": [11, 12]},
        "seed": 0,
    }
    m = SplitManifest.from_dict(ref)
    assert m.to_dict() == ref
    assert split_by_chunk(_geom(100, 8)).to_dict() == ref  # same counts as the reference
    assert m.sample_indices("val").tolist() == list(range(80, 88))
    assert m.sample_indices("test").tolist() == list(range(88, 100))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"n_chunks": 3, "sample_chunk_size": 8, "n_samples": 100, "chunks": {}}, "13"),
        (
            {"n_chunks": 2, "sample_chunk_size": 8, "n_samples": 16, "chunks": {"train": [0, 2]}},
            "out of range",
        ),
        (
            {
                "n_chunks": 2,
                "sample_chunk_size": 8,
                "n_samples": 16,
                "chunks": {"train": [0], "val": [0]},
            },
            "two splits",
        ),
        (
            {"n_chunks": 2, "sample_chunk_size": 8, "n_samples": 16, "chunks": {"dev": [0]}},
            "unknown",
        ),
        ({"n_chunks": 2}, "not a split manifest"),
    ],
)
def test_bad_manifests_are_refused(data: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SplitManifest.from_dict(data)


@pytest.mark.parametrize(
    "fractions", [(0.5, 0.5), (0.8, 0.3, 0.1), (-0.1, 0.6, 0.5), (float("nan"), 0.5, 0.5)]
)
def test_bad_fractions(fractions: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="fractions"):
        split_by_chunk(_geom(100, 8), fractions=fractions)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 500),
    chunk=st.integers(1, 40),
    train=st.floats(0.05, 1.0),
    val_share=st.floats(0.0, 1.0),
    contiguous=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_splits_partition_whole_chunks(
    n: int, chunk: int, train: float, val_share: float, contiguous: bool, seed: int
) -> None:
    val = (1 - train) * val_share
    fractions = (train, val, 1 - train - val)
    geom = _geom(n, chunk)
    try:
        m = split_by_chunk(geom, fractions, seed=seed, contiguous=contiguous)
    except ValueError as exc:
        assert "too few" in str(exc)
        return
    ids = np.concatenate([m.chunk_ids(s) for s in ("train", "val", "test")])
    assert sorted(ids.tolist()) == list(range(geom.n_chunks))
    samples = np.concatenate([m.sample_indices(s) for s in ("train", "val", "test")])
    assert sorted(samples.tolist()) == list(range(n))
    if contiguous:
        assert all(len(m.ranges(s)) <= 1 for s in ("train", "val", "test"))


def test_manifest_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.json"
    old = split_by_chunk(_geom(N, CHUNK))
    old.to_json(path)
    new = split_by_chunk(_geom(N, CHUNK), contiguous=False, seed=3)

    def crash(src: object, dst: object) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr("os.replace", crash)
    with pytest.raises(OSError, match="simulated"):
        new.to_json(path)
    assert SplitManifest.from_json(path) == old  # the committed manifest still opens
