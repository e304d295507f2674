"""Files move both ways between chute and loaderx 0.7.3 (installed as a test dependency)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import chute
from chute import RecordStore
from chute.store import _format

loaderx = pytest.importorskip("loaderx")
CODECS = ["raw", "zstd", "zstd_dict"]


def images(n: int = 120) -> np.ndarray:
    rng = np.random.default_rng(3)
    t = np.linspace(0, 1, 3 * 16 * 16)
    wave = np.sin(2 * np.pi * (t * (1 + 4 * rng.random((n, 1))) + rng.random((n, 1))))
    noisy = wave * 0.5 + 0.5 + rng.random((n, t.size)) * 0.06
    return (noisy * 20).astype(np.uint8).reshape(n, 3, 16, 16)  # coarse, so zstd shrinks it


@pytest.mark.parametrize("codec", CODECS)
def test_loaderx_reads_chute(tmp_path: Path, codec: str) -> None:
    a = images()
    chute.write_dataset(tmp_path / "c.zr", a, codec=codec)
    lds = loaderx.Dataset(str(tmp_path / "c.zr"))
    assert len(lds) == len(a)
    idx = np.array([5, 0, 119, 5])
    assert np.array_equal(lds[idx], a[idx])
    assert np.array_equal(lds[np.arange(len(a))], a)


@pytest.mark.parametrize("codec", CODECS)
def test_chute_reads_loaderx(tmp_path: Path, codec: str) -> None:
    a = images()
    loaderx.write_dataset(str(tmp_path / "l.zr"), a, codec=codec)
    ds = chute.Dataset(tmp_path / "l.zr")
    assert ds.shape == a.shape and ds.dtype == a.dtype
    assert np.array_equal(ds[:], a)
    assert np.array_equal(ds[[7, 3, -1]], a[[7, 3, -1]])
    assert ds.store.stats()["codecs"][codec] > 0


@pytest.mark.parametrize("dtype", ["M8[D]", "m8[ns]"])
def test_dates_and_durations_move_both_ways(tmp_path: Path, dtype: str) -> None:
    """numpy's datetime64 and timedelta64 hold no buffer of their own: chute reads them as
    the 8-byte integers they are stored as, whoever wrote the store."""
    a = (np.arange(24, dtype=np.int64).reshape(6, 4) * 86_400).astype(dtype)
    chute.write_dataset(tmp_path / "c.zr", a)
    loaderx.write_dataset(str(tmp_path / "l.zr"), a)
    assert np.array_equal(loaderx.Dataset(str(tmp_path / "c.zr"))[np.arange(6)], a)
    for name in ("c.zr", "l.zr"):
        with chute.Dataset(tmp_path / name) as ds:
            assert ds.dtype == a.dtype
            assert np.array_equal(ds[[5, 0, 3]], a[[5, 0, 3]]) and ds[2].tolist() == a[2].tolist()
            out = np.empty((2, 4), a.dtype)
            assert np.array_equal(ds.gather_into([1, 4], out), a[[1, 4]])


@pytest.mark.parametrize("codec", CODECS)
def test_chute_appends_deletes_compacts_a_loaderx_store(tmp_path: Path, codec: str) -> None:
    a = images(200)
    loaderx.write_dataset(str(tmp_path / "l.zr"), a[:100], codec=codec)
    with RecordStore(tmp_path / "l.zr", mode="a") as s:
        s.append(a[100:].reshape(100, -1), codec=codec)
        s.delete(range(0, 200, 3))
        s.compact()
        expected = s.gather(np.arange(len(s)))
        report = s.verify()
        assert report["damaged"] == []
    lds = loaderx.Dataset(str(tmp_path / "l.zr"))
    assert np.array_equal(lds[np.arange(len(lds))].reshape(len(lds), -1), expected)
    survivors = {r.tobytes() for r in a.reshape(200, -1)[[i for i in range(200) if i % 3]]}
    assert {r.tobytes() for r in expected} == survivors


def test_loaderx_reads_multi_chunk_chute_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_format, "CHUNK_LIMIT", 5000)  # force many chunk files
    a = images(60)
    chute.write_dataset(tmp_path / "m.zr", a, codec="raw")
    assert (tmp_path / "m.zr" / "9.zr").exists()
    lds = loaderx.Dataset(str(tmp_path / "m.zr"))
    assert np.array_equal(lds[np.arange(60)], a)


def test_loaderx_edits_do_not_look_like_damage(tmp_path: Path) -> None:
    a = images(50)
    chute.write_dataset(tmp_path / "c.zr", a, codec="zstd")
    z = loaderx.Zrecord(str(tmp_path / "c.zr"))
    z.delete(np.array([0, 10, 20]))
    z.close()
    with RecordStore(tmp_path / "c.zr") as s:
        report = s.verify()
    assert report["damaged"] == [] and report["records"] == 47
    assert 0 < report["unchecked"] <= 3  # records loaderx moved have no checksum to match


def test_verify_on_a_loaderx_store_says_it_cannot_check(tmp_path: Path) -> None:
    loaderx.write_dataset(str(tmp_path / "l.zr"), images(10))
    with pytest.warns(UserWarning, match="no checksums"):
        ds = chute.Dataset(tmp_path / "l.zr", verify=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(ds[:], images(10))
    report = ds.store.verify()
    assert report["unchecked"] == 10 and report["damaged"] == []
