"""Dataset indexing and write_dataset, checked against numpy on the same array, over a single
store and a sharded dataset alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import chute
from chute import CorruptStoreError, Dataset, StoreNotFoundError, write_dataset
from tests.objects.remote import Serve

ARRAY = np.arange(40 * 2 * 3, dtype=np.float32).reshape(40, 2, 3) / 7
#: How each kind of dataset is written: one store, or shards of 7 records (6 shards for 40).
KINDS: dict[str, dict[str, Any]] = {"single": {}, "sharded": {"shard_records": 7}}


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> dict[str, Any]:
    return KINDS[request.param]


@pytest.fixture(
    scope="module", params=[(k, where) for k in KINDS for where in ("local", "s3")], ids=str
)
def ds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """The dataset of each kind, read from its folder or through s3:// (the moto server)."""
    kind, where = request.param
    written = write_dataset(tmp_path_factory.mktemp("ds") / "a.zr", ARRAY, **KINDS[kind])
    if where == "local":
        return written
    return Serve(request.getfixturevalue("s3_server"))(written)


def test_metadata(ds: Dataset) -> None:
    assert len(ds) == 40
    assert ds.shape == (40, 2, 3) and ds.item_shape == (2, 3)
    assert ds.dtype == np.float32


@pytest.mark.parametrize(
    "key",
    [
        0, 39, -1, -40, np.int64(7),
        slice(None), slice(3, 17, 4), slice(None, None, -3), slice(50, 60),
        [3, 1, 3], [], np.array([[1, 2], [3, 39]]), np.arange(40) % 2 == 0,
        (5, 1), (slice(0, 4), 0, 2), ([1, 2], slice(None), 1),
    ],
)  # fmt: skip
def test_indexing_matches_numpy(ds: Dataset, key: object) -> None:
    got, want = ds[key], ARRAY[key]  # type: ignore[index]
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.array_equal(got, want)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    idx=hnp.arrays(
        np.int64, hnp.array_shapes(max_dims=3, max_side=5), elements=st.integers(-40, 39)
    )
)
def test_index_arrays_keep_their_shape(ds: Dataset, idx: np.ndarray) -> None:
    assert np.array_equal(ds[idx], ARRAY[idx])


def test_getitems_is_a_batch(ds: Dataset) -> None:
    assert np.array_equal(ds.__getitems__([5, 2, 5]), ARRAY[[5, 2, 5]])
    assert np.array_equal(ds.__getitems__(np.array([9], np.uint32)), ARRAY[[9]])


@pytest.mark.parametrize("key", [1.0, [0.5], np.array([1.0, 2.0]), "a", True])
def test_bad_index_types(ds: Dataset, key: object) -> None:
    with pytest.raises((TypeError, IndexError)):
        ds[key]  # type: ignore[index]


@pytest.mark.parametrize("key", [40, -41, [0, 40], np.array([-41]), np.ones(39, bool)])
def test_out_of_range(ds: Dataset, key: object) -> None:
    with pytest.raises(IndexError):
        ds[key]  # type: ignore[index]


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_write_from_mmapped_npy(
    tmp_path: Path, codec: str, kind: dict[str, Any], serve: Serve
) -> None:
    src = (np.random.default_rng(0).random((300, 16, 16)) * 30).astype(np.uint8)
    np.save(tmp_path / "x.npy", src)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    written = write_dataset(tmp_path / "x.zr", mm, codec=codec, chunk_bytes=1000, **kind)
    ds = serve(written)  # many steps, many chunks
    assert np.array_equal(ds[:], src)
    schema = json.loads(sorted((tmp_path / "x.zr").glob("**/schema.json"))[-1].read_text())
    assert schema == {
        "format": "loaderx-zrecord",
        "version": 1,
        "dtype": "|u1",
        "shape": [16, 16],
        "codec": codec,
    }


def test_scalars_and_other_dtypes(tmp_path: Path, kind: dict[str, Any], serve: Serve) -> None:
    labels = np.arange(100, dtype=np.int64) * -3
    ds = serve(write_dataset(tmp_path / "l.zr", labels, **kind))
    assert ds.shape == (100,) and ds[4] == -12 and ds[[1, 2]].tolist() == [-3, -6]
    big = np.arange(12, dtype=">i4").reshape(3, 4)
    assert np.array_equal(serve(write_dataset(tmp_path / "b.zr", big, **kind))[:], big)
    listed = serve(write_dataset(tmp_path / "lst.zr", [[1, 2], [3, 4]], **kind))
    assert listed[1].tolist() == [3, 4]
    empty = serve(write_dataset(tmp_path / "e.zr", np.zeros((0, 3), np.int8), **kind))
    assert empty.shape == (0, 3) and empty[:].shape == (0, 3)


def test_write_refuses_bad_input(tmp_path: Path, kind: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="1 MiB"):
        write_dataset(tmp_path / "big.zr", np.zeros((2, 1 << 21), np.uint8), **kind)
    assert not (tmp_path / "big.zr").exists()
    with pytest.raises(TypeError, match="objects"):
        write_dataset(tmp_path / "o.zr", np.array([[1, "a"]], dtype=object), **kind)
    with pytest.raises(ValueError, match="axis"):
        write_dataset(tmp_path / "s.zr", np.float32(3), **kind)
    write_dataset(tmp_path / "x.zr", np.zeros((3, 2)), **kind)
    with pytest.raises(FileExistsError):
        write_dataset(tmp_path / "x.zr", np.ones((3, 2)), **kind)
    assert write_dataset(tmp_path / "x.zr", np.ones((4, 2)), overwrite=True, **kind)[:].sum() == 8


def test_schema_mismatch_is_an_error(tmp_path: Path) -> None:
    write_dataset(tmp_path / "x.zr", np.zeros((5, 4), np.int32))
    schema = tmp_path / "x.zr" / "schema.json"
    doc = json.loads(schema.read_text())
    doc["shape"] = [5]
    schema.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="schema"):
        Dataset(tmp_path / "x.zr")[0]
    schema.write_text("{not json")
    with pytest.raises(CorruptStoreError, match="JSON"):
        Dataset(tmp_path / "x.zr")
    with pytest.raises(StoreNotFoundError):
        Dataset(tmp_path / "missing.zr")


def test_verify_flag_reads_clean_data(tmp_path: Path, kind: dict[str, Any], serve: Serve) -> None:
    ds = write_dataset(tmp_path / "v.zr", ARRAY, **kind)
    with serve.open(chute.Dataset, tmp_path / "v.zr", verify=True, threads=2) as v:
        assert np.array_equal(v[[3, 4, 20, 39]], ARRAY[[3, 4, 20, 39]])
    ds.close()


def test_array_properties_match_numpy(ds: Dataset) -> None:
    assert (ds.ndim, ds.size, ds.nbytes) == (ARRAY.ndim, ARRAY.size, ARRAY.nbytes)


def test_a_file_is_not_a_store(tmp_path: Path) -> None:
    np.save(tmp_path / "images.npy", ARRAY)
    with pytest.raises(StoreNotFoundError, match=r"images\.npy is a file, not a chute store"):
        Dataset(tmp_path / "images.npy")
    with pytest.raises(FileNotFoundError):  # what loaderx raises for it too
        chute.RaggedDataset(tmp_path / "images.npy")


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_append_mode_adds_rows_and_keeps_the_codec(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "a.zr"
    write_dataset(path, ARRAY[:25], codec=codec).close()
    before = (path / "schema.json").read_bytes()
    with write_dataset(path, ARRAY[25:], mode="a") as ds:
        assert np.array_equal(ds[:], ARRAY)
        counts = ds.store.stats()["codecs"]
        assert {k for k, v in counts.items() if v} <= {codec, "raw"}
    assert (path / "schema.json").read_bytes() == before
    with write_dataset(tmp_path / "new.zr", ARRAY, mode="a") as fresh:  # creates when missing
        assert len(fresh) == 40


def test_append_mode_checks_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "a.zr"
    write_dataset(path, ARRAY).close()
    with pytest.raises(
        chute.SchemaMismatchError, match=r"float32 records of shape \(2, 3\); cannot append float64"
    ):
        write_dataset(path, ARRAY.astype(np.float64), mode="a")
    with pytest.raises(
        chute.SchemaMismatchError, match=r"cannot append float32 records of shape \(3, 2\)"
    ):
        write_dataset(path, ARRAY.reshape(40, 3, 2), mode="a")
    with pytest.raises(ValueError, match="written with codec 'zstd'; appending keeps it"):
        write_dataset(path, ARRAY, codec="raw", mode="a")
    with pytest.raises(ValueError, match="pick one"):
        write_dataset(path, ARRAY, mode="a", overwrite=True)
    with pytest.raises(ValueError, match="mode must be 'w'"):
        write_dataset(path, ARRAY, mode="x")  # type: ignore[arg-type]
    with pytest.raises(FileExistsError, match="mode='a' to append to it or overwrite=True"):
        write_dataset(path, ARRAY)
    assert len(Dataset(path)) == 40  # every refusal left the store as it was
    chute.write_ragged(tmp_path / "r.zr", [np.arange(3)]).close()
    with pytest.raises(chute.StoreKindError, match="append with write_ragged"):
        write_dataset(tmp_path / "r.zr", np.zeros((2, 3)), mode="a")


def test_ragged_append_mode(tmp_path: Path) -> None:
    path = tmp_path / "r.zr"
    seqs = [np.arange(n, dtype=np.int32) for n in (3, 0, 5, 2)]
    chute.write_ragged(path, seqs[:2]).close()
    with chute.write_ragged(path, seqs[2:], mode="a") as r:
        assert len(r) == 4 and all(np.array_equal(r[i], s) for i, s in enumerate(seqs))
    with pytest.raises(chute.SchemaMismatchError, match="cannot append variable-length int64"):
        chute.write_ragged(path, [np.arange(3, dtype=np.int64)], mode="a")
    with pytest.raises(chute.StoreKindError, match="append with write_dataset"):
        chute.write_ragged(tmp_path / "f.zr" if write_dataset(tmp_path / "f.zr", ARRAY) else path,
                           seqs, mode="a")  # fmt: skip


@pytest.mark.parametrize("size", [1, 3])
def test_batch_reads_see_records_appended_after_the_view_opened(tmp_path: Path, size: int) -> None:
    # a single store (a sharded dataset's view keeps the manifest it opened)
    path = tmp_path / "grow"
    write_dataset(path, ARRAY[:10]).close()
    with Dataset(path) as ds:
        np.testing.assert_array_equal(ds.__getitems__(list(range(size))), ARRAY[:size])
        write_dataset(path, ARRAY[10:20], mode="a").close()  # the view keeps its handle
        for idx in ([9] * size, [19] * size, list(range(19, 19 - size, -1)), [-1] * size):
            want = ARRAY[:20][idx]
            np.testing.assert_array_equal(ds.__getitems__(idx), want)
        with pytest.raises(chute.RecordIndexError, match="of 20 records"):
            ds.__getitems__([20] * size)
        with pytest.raises(chute.RecordIndexError, match="-21 is out of range"):
            ds.__getitems__([0] * (size - 1) + [-21])
        np.testing.assert_array_equal(ds.__getitems__(np.array([], np.int64)), ARRAY[:0])


BLOBS = [b"ab\x00", b"c", b"\x00\x00", b"", bytes(range(256)) * 3]


def test_a_list_of_bytes_is_stored_byte_for_byte(tmp_path: Path, kind: dict[str, Any]) -> None:
    path = tmp_path / "blobs"
    with write_dataset(path, BLOBS, **kind) as ds:  # variable-length records, NULs kept
        assert isinstance(ds, chute.RaggedDataset) and ds.dtype == np.uint8
        assert [ds[i].tobytes() for i in range(len(ds))] == BLOBS
    with chute.RaggedDataset(path) as ds:
        values, splits = ds[[2, 0]]
        assert values.tobytes() == b"\x00\x00ab\x00" and splits.tolist() == [0, 2, 5]
    mixed = (bytearray(b"x\x00"), memoryview(b"\x00y"))
    with write_dataset(tmp_path / "mixed", mixed) as ds:
        assert [ds[i].tobytes() for i in range(len(ds))] == [b"x\x00", b"\x00y"]


def test_a_fixed_width_bytes_array_is_numpys_nul_padded_type(tmp_path: Path) -> None:
    array = np.array(BLOBS[:3])  # what the caller asked for: |S3, trailing NULs not kept
    with write_dataset(tmp_path / "s3", array) as ds:
        assert isinstance(ds, Dataset) and ds.dtype == np.dtype("S3")
        assert ds[:].tolist() == [b"ab", b"c", b""]
