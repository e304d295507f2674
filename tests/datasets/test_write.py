"""Writing over a dataset: the writer lock comes before any removal, and readers opened
before an overwrite raise `StoreChangedError` instead of mixing the old and the new."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import chute
from chute import (
    Dataset,
    RaggedDataset,
    RecordStore,
    StoreChangedError,
    StoreKindError,
    StoreLockedError,
    UnsafeFileError,
    append_dataset,
    write_dataset,
    write_ragged,
)

OLD = np.arange(30 * 2, dtype=np.int64).reshape(30, 2)
NEW = -OLD - 100


class _Held:
    """Rows whose reading waits for ``release``: the append that reads them holds its lock."""

    def __init__(self, rows: npt.NDArray[Any]) -> None:
        self.rows, self.shape, self.dtype = rows, rows.shape, rows.dtype
        self.reading, self.release = threading.Event(), threading.Event()

    def __getitem__(self, key: Any) -> npt.NDArray[Any]:
        self.reading.set()
        assert self.release.wait(30)
        return np.asarray(self.rows[key])


_WRITES: dict[str, Callable[[Path], Any]] = {
    "sharded": lambda p: write_dataset(p, NEW, shard_records=4, overwrite=True),
    "single": lambda p: write_dataset(p, NEW, overwrite=True),
    "ragged sharded": lambda p: write_ragged(p, list(NEW), shard_records=4, overwrite=True),
    "ragged single": lambda p: write_ragged(p, list(NEW), overwrite=True),
}


@pytest.mark.parametrize("write", list(_WRITES))
def test_an_overwrite_refused_by_a_live_append_leaves_the_dataset_whole(
    tmp_path: Path, write: str
) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=10).close()
    more = _Held(OLD[:3])
    appender = threading.Thread(target=lambda: append_dataset(path, more).close())
    appender.start()
    try:
        assert more.reading.wait(30)  # the append holds dataset.lock now
        with pytest.raises(StoreLockedError):
            _WRITES[write](path)
        with Dataset(path) as ds:  # nothing was removed: every shard, every record
            assert np.array_equal(ds[:], OLD)
    finally:
        more.release.set()
        appender.join()
    with Dataset(path) as ds:  # and the append it waited on landed whole
        assert np.array_equal(ds[:], np.concatenate([OLD, OLD[:3]]))


def test_a_sharded_overwrite_refused_by_a_single_stores_writer_removes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.zr"
    write_dataset(path, OLD).close()
    before = sorted(p.name for p in path.iterdir())
    with RecordStore(path, mode="a"):
        with pytest.raises(StoreLockedError):
            write_dataset(path, NEW, shard_records=4, overwrite=True)
        assert sorted(p.name for p in path.iterdir() if p.name != "dataset.lock") == before
    with Dataset(path) as ds:
        assert np.array_equal(ds[:], OLD)


_OVERWRITE = """
import sys, numpy as np, chute
shards = int(sys.argv[2]) or None
chute.write_dataset(sys.argv[1], -np.arange(60).reshape(30, 2) - 100, shard_records=shards,
                    overwrite=True).close()
"""


@pytest.mark.parametrize(("before", "after"), [(10, 10), (10, 0), (0, 10)])
def test_a_reader_opened_before_an_overwrite_raises_instead_of_mixing(
    tmp_path: Path, before: int, after: int
) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=before or None).close()
    reader = Dataset(path)
    assert np.array_equal(reader[[0, 1]], OLD[[0, 1]])  # shard 0 is open
    subprocess.run(
        [sys.executable, "-c", _OVERWRITE, str(path), str(after)], check=True, timeout=120
    )
    for key in ([25, 26], [0, 1], slice(None)):  # a shard opened now, one opened before
        with pytest.raises(StoreChangedError):
            reader[key]
    with pytest.raises(StoreChangedError):
        len(reader)
    reader.close()
    with Dataset(path) as ds:  # reopened: the new dataset, whole
        assert np.array_equal(ds[:], NEW)


def test_a_ragged_reader_opened_before_an_overwrite_raises(tmp_path: Path) -> None:
    path = tmp_path / "r"
    write_ragged(path, list(OLD), shard_records=10).close()
    reader = RaggedDataset(path)
    assert np.array_equal(reader[1], OLD[1])
    write_ragged(path, list(NEW), shard_records=10, overwrite=True).close()
    with pytest.raises(StoreChangedError):
        reader[[21, 1]]
    with pytest.raises(StoreChangedError):
        reader.getitems_padded([2])
    reader.close()


def test_appends_change_no_generation(tmp_path: Path) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=10).close()
    with Dataset(path) as reader:
        append_dataset(path, NEW).close()
        assert np.array_equal(reader[:], OLD)  # the manifest it opened with, no error


@pytest.mark.filterwarnings("error")
def test_a_store_over_a_sharded_dataset_keeps_its_checksums_and_back(tmp_path: Path) -> None:
    """The folder's gen.chute outlives the sharded dataset (its old readers must see the
    bump), yet the single store written over it is a whole chute store: sidecar and all, so
    ``verify=True`` checks it instead of calling it damaged."""
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=10).close()
    write_dataset(path, NEW, overwrite=True).close()
    with Dataset(path, verify=True) as ds:
        np.testing.assert_array_equal(ds[np.arange(len(NEW))], NEW)
    with RecordStore(path, verify=True) as store:
        assert store.verify()["checked"] == len(NEW)
    write_dataset(path, OLD, shard_records=7, overwrite=True).close()
    with Dataset(path, verify=True) as ds:
        np.testing.assert_array_equal(ds[np.arange(len(OLD))], OLD)


def test_a_sharded_overwrite_leaves_none_of_the_single_stores_files(tmp_path: Path) -> None:
    """Every file of the store goes (the dictionary and its record too), except gen.chute,
    which its readers check."""
    path = tmp_path / "d"
    rows = np.tile(np.arange(64, dtype=np.uint8), (200, 1))
    write_dataset(path, rows, codec="zstd_dict").close()
    assert {"dict.zr", "dict.chute"} <= {p.name for p in path.iterdir()}
    write_dataset(path, OLD, shard_records=10, overwrite=True).close()
    left = {p.name for p in path.iterdir() if p.is_file()}
    assert left == {"dataset.json", "dataset.lock", "gen.chute"}


@pytest.mark.parametrize("mode", ["w", "a"])
def test_a_store_is_not_opened_for_writing_inside_a_sharded_dataset(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=10).close()
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(StoreKindError, match="sharded dataset"):
        RecordStore(path, mode=mode)  # type: ignore[arg-type]
    assert sorted(p.name for p in path.iterdir()) == before
    with Dataset(path) as ds:
        np.testing.assert_array_equal(ds[np.arange(len(OLD))], OLD)


@pytest.mark.parametrize("how", ["append", "overwrite"])
def test_a_lock_file_linked_out_is_refused_and_nothing_is_made_outside(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=10).close()
    (path / "dataset.lock").unlink()
    (path / "dataset.lock").symlink_to(tmp_path / "created_outside")
    with pytest.raises(UnsafeFileError, match=r"dataset\.lock"):
        if how == "append":
            append_dataset(path, OLD[:2])
        else:
            write_dataset(path, NEW, shard_records=10, overwrite=True)
    assert not (tmp_path / "created_outside").exists()
    with Dataset(path) as ds:
        np.testing.assert_array_equal(ds[np.arange(len(OLD))], OLD)


def test_a_reader_raises_when_another_dataset_is_renamed_over_its_folder(tmp_path: Path) -> None:
    """Write beside it, then swap the names: the common way to replace a dataset without
    chute's overwrite. Shards opened later would belong to the new dataset."""
    path, beside = tmp_path / "d", tmp_path / "d.new"
    write_dataset(path, OLD, shard_records=10).close()
    with Dataset(path) as old:
        assert old[[0]].tolist() == OLD[[0]].tolist()  # opens the first shard only
        write_dataset(beside, NEW, shard_records=10).close()
        path.rename(tmp_path / "d.old")
        beside.rename(path)
        with pytest.raises(StoreChangedError, match="renamed over"):
            old[np.arange(len(OLD))]


def test_an_overwrite_over_a_folder_named_as_the_manifest_names_it(tmp_path: Path) -> None:
    path = tmp_path / "d"
    (path / "dataset.json").mkdir(parents=True)
    with pytest.raises(UnsafeFileError, match=r"dataset\.json is a folder"):
        write_dataset(path, OLD, shard_records=10, overwrite=True)
    assert (path / "dataset.json").is_dir()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"mode": "a", "overwrite": True}, ValueError),
        ({"mode": "x"}, ValueError),
        ({}, FileExistsError),
    ],
)
def test_one_store_and_sharded_writers_refuse_a_write_mode_in_the_same_words(
    tmp_path: Path, args: dict[str, Any], error: type[Exception]
) -> None:
    messages = []
    for sharding in ({}, {"shard_records": 2}):
        path = tmp_path / f"d{len(messages)}"
        chute.write_dataset(path, np.zeros((3, 2)), **sharding).close()
        with pytest.raises(error) as caught:
            chute.write_dataset(path, np.zeros((3, 2)), **args, **sharding)  # type: ignore[arg-type]
        messages.append(str(caught.value).replace(str(path), "PATH"))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("shard_records", [None, 2])
@pytest.mark.parametrize("folder_was_there", [False, True])
def test_a_new_write_that_fails_leaves_nothing_behind(
    tmp_path: Path, shard_records: int | None, folder_was_there: bool
) -> None:
    path = tmp_path / "tokens"
    if folder_was_there:
        path.mkdir()
    docs = iter([np.arange(10, dtype=np.uint16)] * 3 + [np.zeros(800_000, np.uint16)])
    with pytest.raises(ValueError, match="caps a record at 1 MiB"):
        chute.write_ragged(path, docs, shard_records=shard_records)
    assert (list(path.iterdir()) == []) if folder_was_there else not path.exists()
    with chute.write_ragged(
        path, [np.arange(3, dtype=np.uint16)], shard_records=shard_records
    ) as ds:
        assert len(ds) == 1  # the rerun needs no overwrite=True


def test_a_failed_write_never_touches_what_was_there(tmp_path: Path) -> None:
    path = tmp_path / "r"
    chute.write_ragged(path, [np.arange(4, dtype=np.uint16)]).close()
    with pytest.raises(FileExistsError):
        chute.write_ragged(path, [np.arange(3, dtype=np.uint16)])
    docs = [np.arange(2, dtype=np.uint16), np.zeros(800_000, np.uint16)]
    with pytest.raises(ValueError, match="caps a record"):
        chute.write_ragged(path, iter(docs), mode="a")  # an append keeps its own guarantees
    with chute.RaggedDataset(path) as ds:
        assert ds[0].tolist() == [0, 1, 2, 3]
