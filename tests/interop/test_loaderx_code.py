"""loaderx-style code on chute: the same calls against loaderx 0.7.3 and chute, side by side.

Where loaderx raises a built-in class for a condition, chute's exception is an instance of it
(while also being a `ChuteError`, and an `IndexError` for an index out of range).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute

loaderx = pytest.importorskip("loaderx")

ROWS = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)


def _raised(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except Exception as exc:  # the point is to compare whatever is raised
        return exc
    raise AssertionError("nothing was raised")


def _builtin_bases(exc: BaseException) -> list[type]:
    """The built-in exception classes of ``exc`` (loaderx's own classes left out)."""
    return [c for c in type(exc).__mro__ if c.__module__ == "builtins" and c is not object]


def _same_family(theirs: BaseException, ours: BaseException) -> None:
    assert isinstance(ours, chute.ChuteError), ours
    for base in _builtin_bases(theirs):
        assert isinstance(ours, base), (type(theirs), type(ours))


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, Path]:
    paths = {"lx": tmp_path / "lx.zr", "ch": tmp_path / "ch.zr"}
    loaderx.write_dataset(str(paths["lx"]), ROWS)
    chute.write_dataset(paths["ch"], ROWS).close()
    paths["lx_r"], paths["ch_r"] = tmp_path / "lx_r.zr", tmp_path / "ch_r.zr"
    seqs = [np.arange(n, dtype=np.int32) for n in (2, 5, 1)]
    loaderx.write_ragged(str(paths["lx_r"]), seqs)
    chute.write_ragged(paths["ch_r"], seqs).close()
    return paths


@pytest.mark.parametrize(
    "read",
    [
        lambda ds: ds[10],
        lambda ds: ds[[1, 10]],
        lambda ds: ds[np.array([12])],
        lambda ds: ds.__getitems__(np.array([10], np.uint64)),
    ],
)
def test_an_index_out_of_range(stores: dict[str, Path], read: Callable[[Any], Any]) -> None:
    theirs = _raised(lambda: read(loaderx.Dataset(str(stores["lx"]))))
    ours = _raised(lambda: read(chute.Dataset(stores["lx"])))
    _same_family(theirs, ours)
    assert isinstance(ours, IndexError) and isinstance(ours, chute.RecordIndexError)
    assert "out of range for a dataset of 10 records" in str(ours)


def test_an_index_out_of_range_in_a_ragged_store(stores: dict[str, Path]) -> None:
    theirs = _raised(lambda: loaderx.RaggedDataset(str(stores["lx_r"]))[3])
    ours = _raised(lambda: chute.RaggedDataset(stores["lx_r"])[3])
    _same_family(theirs, ours)
    assert isinstance(ours, IndexError)


@pytest.mark.parametrize(
    "bad",
    [ROWS.astype(np.float64), ROWS.reshape(10, 3, 1), ROWS[:, :2].copy(), ROWS[:, 0].copy()],
)
def test_appending_rows_of_another_dtype_or_shape(stores: dict[str, Path], bad: Any) -> None:
    theirs = _raised(lambda: loaderx.write_dataset(str(stores["lx"]), bad))
    ours = _raised(lambda: chute.write_dataset(stores["ch"], bad, mode="a"))
    _same_family(theirs, ours)
    assert isinstance(ours, chute.SchemaMismatchError)
    assert "cannot append" in str(ours)


def test_appending_a_mismatching_ragged_record(stores: dict[str, Path]) -> None:
    bad = [np.zeros((2, 2), np.int32)]
    theirs = _raised(lambda: loaderx.write_ragged(str(stores["lx_r"]), bad))
    ours = _raised(lambda: chute.write_ragged(stores["ch_r"], bad, mode="a"))
    _same_family(theirs, ours)


def test_appending_gives_the_same_store_as_loaderx(stores: dict[str, Path]) -> None:
    more = ROWS + 100
    loaderx.write_dataset(str(stores["lx"]), more)  # loaderx appends by default
    chute.write_dataset(stores["ch"], more, mode="a").close()
    expected = np.concatenate([ROWS, more])
    for path in (stores["lx"], stores["ch"]):
        assert np.array_equal(loaderx.Dataset(str(path))[np.arange(20)], expected)
        assert np.array_equal(chute.Dataset(path)[:], expected)
    chute.write_dataset(stores["lx"], more, mode="a").close()  # chute appends to loaderx's store
    assert len(loaderx.Dataset(str(stores["lx"]))) == 30


def test_opening_the_other_kind_of_store(stores: dict[str, Path]) -> None:
    for opener, path in [("Dataset", "lx_r"), ("RaggedDataset", "lx")]:
        theirs = _raised(lambda o=opener, p=path: getattr(loaderx, o)(str(stores[p])))
        ours = _raised(lambda o=opener, p=path: getattr(chute, o)(stores[p]))
        _same_family(theirs, ours)
        assert isinstance(ours, chute.StoreKindError)


@pytest.mark.parametrize("what", ["missing", "npy file", "empty folder"])
def test_opening_something_that_is_not_a_store(tmp_path: Path, what: str) -> None:
    path = tmp_path / "x.npy"
    if what == "npy file":
        np.save(path, ROWS)
    elif what == "empty folder":
        path.mkdir()
    theirs = _raised(lambda: loaderx.Dataset(str(path)))
    ours = _raised(lambda: chute.Dataset(path))
    _same_family(theirs, ours)


def test_a_damaged_store(tmp_path: Path) -> None:
    path = tmp_path / "z.zr"
    loaderx.write_dataset(str(path), np.random.default_rng(0).integers(0, 5, (100, 64)))
    chunk = path / "0.zr"
    data = bytearray(chunk.read_bytes())
    for i in range(20, len(data), 7):  # zstd frames that no longer decode
        data[i] ^= 0xFF
    chunk.write_bytes(bytes(data))
    theirs = _raised(lambda: loaderx.Dataset(str(path))[[1, 50]])
    ours = _raised(lambda: chute.Dataset(path)[[1, 50]])
    assert isinstance(theirs, RuntimeError)  # loaderx.ZrecordError
    _same_family(theirs, ours)
    assert isinstance(ours, chute.CorruptStoreError) and "record 1" in str(ours)


def test_loaderx_dataloader_code_runs_unchanged(stores: dict[str, Path]) -> None:
    """A loaderx call with its keyword names: same batches as chute's spelling, with warnings."""
    streams = {"data": chute.Dataset(stores["lx"]), "label": np.arange(10)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = chute.DataLoader(
            streams, num_workers=2, batch_size=4, prefetch_size=2, mode=1, seed=42
        )
    messages = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
    assert messages == [
        "mode=1 is loaderx's mode code; chute spells it sampler='iid'",
        "num_workers= is loaderx's name; chute spells it num_threads=",
        "prefetch_size= is loaderx's name; chute spells it prefetch=",
    ]
    assert all(w.filename == __file__ for w in caught)  # the warning points at the caller
    new = chute.DataLoader(streams, batch_size=4, sampler="iid", seed=42, num_threads=2, prefetch=2)
    with old, new:
        for _ in range(5):
            a, b = next(old), next(new)
            np.testing.assert_array_equal(a["data"], b["data"])
            np.testing.assert_array_equal(a["data"][:, 0] / 3, a["label"])
    lx = loaderx.DataLoader({"data": loaderx.Dataset(str(stores["lx"]))}, num_workers=1,
                            batch_size=4, prefetch_size=2, mode=1, seed=42)  # fmt: skip
    with chute.DataLoader(streams, 4) as ours:
        try:
            assert next(lx)["data"].shape == next(ours)["data"].shape == (4, 3)
        finally:
            lx.close()
    with pytest.raises(TypeError):  # neither has a length: both are endless
        len(old)  # type: ignore[arg-type]
