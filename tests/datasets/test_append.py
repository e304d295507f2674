"""Appending to sharded datasets: fill the last shard, start new ones, rewrite the manifest;
kill -9 at every step of an append that crosses shard boundaries loses nothing committed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import chute
from chute import (
    Dataset,
    IncompleteDatasetError,
    RecordStore,
    append_dataset,
    append_ragged,
    write_dataset,
)
from chute.cli import main as cli
from chute.datasets import read_manifest

OLD = np.arange(25 * 3, dtype=np.int64).reshape(25, 3)
NEW = -np.arange(27 * 3, dtype=np.int64).reshape(27, 3) - 1


def test_append_fills_the_last_shard_then_starts_new_ones(tmp_path: Path) -> None:
    write_dataset(tmp_path / "d", OLD, shard_records=10).close()
    ds = append_dataset(tmp_path / "d", NEW)
    assert [n for _, n in read_manifest(tmp_path / "d").shards] == [10, 10, 10, 10, 10, 2]
    assert np.array_equal(ds[:], np.concatenate([OLD, NEW]))
    ds = append_dataset(tmp_path / "d", NEW[:3].astype(np.int32), workers=2)  # same-kind cast
    assert len(ds) == 55 and np.array_equal(ds[52:], NEW[:3])
    assert cli(["verify", str(tmp_path / "d")]) == 0


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict", "raw"])
def test_append_ragged(tmp_path: Path, codec: str) -> None:
    seqs = [np.arange(i % 7, dtype=np.int16) for i in range(13)]
    chute.write_ragged(tmp_path / "r", seqs[:5], shard_records=4, codec=codec).close()
    ds = append_ragged(tmp_path / "r", iter(seqs[5:]))
    assert [n for _, n in read_manifest(tmp_path / "r").shards] == [4, 4, 4, 1]
    values, splits = ds[:]
    assert np.array_equal(values, np.concatenate(seqs)) and len(splits) == 14


def test_append_refuses_what_does_not_fit(tmp_path: Path) -> None:
    write_dataset(tmp_path / "d", OLD, shard_records=10).close()
    with pytest.raises(ValueError, match="do not match"):
        append_dataset(tmp_path / "d", np.zeros((2, 4), np.int64))
    with pytest.raises(TypeError, match="cannot join"):
        append_dataset(tmp_path / "d", np.zeros((2, 3), np.float32))
    with pytest.raises(chute.StoreError, match="fixed-shape"):
        append_ragged(tmp_path / "d", [np.zeros(3)])
    write_dataset(tmp_path / "single", OLD).close()
    with pytest.raises(chute.StoreNotFoundError, match="no sharded dataset"):
        append_dataset(tmp_path / "single", OLD)
    (tmp_path / "d" / "dataset.json").unlink()
    with pytest.raises(IncompleteDatasetError):
        append_dataset(tmp_path / "d", OLD)


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import chute, chute.datasets._sharded_write as w
    from chute.store import RecordStore

    path, target, k, new = sys.argv[1], sys.argv[2], int(sys.argv[3]), np.load(sys.argv[4])
    calls = 0

    def arm(owner, name, match=lambda *a: True):
        real = getattr(owner, name)

        def wrapper(*a, **kw):
            global calls
            if match(*a):
                calls += 1
                if calls == k:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **kw)

        setattr(owner, name, wrapper)

    if target == "append_packed":  # 1: before the fill, 2..4: inside each new shard
        arm(RecordStore, "append_packed")
    elif target == "fsync_shard":  # after new shard k was written, before it is durable
        arm(w, "_fsync_tree")
    elif target == "manifest":  # every shard written, the manifest not
        arm(w, "write_manifest")
    elif target == "rename":  # dataset.json.tmp written in full, not yet renamed
        arm(os, "replace", lambda src, dst, *r: str(dst).endswith("dataset.json"))
    if new.ndim == 1:  # ragged: record i is the first i % 5 values
        chute.append_ragged(path, (new[: i % 5] for i in range(len(new))))
    else:
        chute.append_dataset(path, new)
    """
)


@pytest.mark.parametrize(
    ("target", "k"),
    [
        ("append_packed", 1), ("append_packed", 2), ("append_packed", 3), ("append_packed", 4),
        ("fsync_shard", 1), ("fsync_shard", 3), ("manifest", 1), ("rename", 1),
    ],
)  # fmt: skip
def test_kill_9_during_an_append_across_shards(tmp_path: Path, target: str, k: int) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=10).close()
    np.save(tmp_path / "new.npy", NEW)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), target, str(k), str(tmp_path / "new.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    with Dataset(path) as ds:  # the committed dataset, whole, and nothing of the append
        assert len(ds) == 25 and np.array_equal(ds[:], OLD)
    ds = append_dataset(path, NEW)  # the next append cleans up and lands exactly once
    assert np.array_equal(ds[:], np.concatenate([OLD, NEW]))
    assert sorted(p.name for p in path.glob("part-*")) == [f"part-{i:05d}.zr" for i in range(6)]
    assert cli(["verify", str(path)]) == 0


def test_compact_clears_what_a_killed_append_left(tmp_path: Path) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, shard_records=10).close()
    np.save(tmp_path / "new.npy", NEW)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), "manifest", "1", str(tmp_path / "new.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    assert len(list(path.glob("part-*"))) == 6  # three shards no manifest names
    assert cli(["compact", str(path)]) == 0
    assert sorted(p.name for p in path.glob("part-*")) == [f"part-{i:05d}.zr" for i in range(3)]
    with RecordStore(path / "part-00002.zr") as last:
        assert len(last) == 5
    assert np.array_equal(Dataset(path)[:], OLD)


def _seqs(n: int, offset: int) -> list[np.ndarray]:
    return [np.arange(offset, offset + i % 5, dtype=np.int32) for i in range(n)]


@pytest.mark.parametrize(("target", "k"), [("append_packed", 2), ("fsync_shard", 2), ("rename", 1)])
def test_kill_9_during_a_ragged_append(tmp_path: Path, target: str, k: int) -> None:
    path = tmp_path / "r"
    old = _seqs(25, 100)
    chute.write_ragged(path, old, shard_records=10).close()
    new = np.arange(7, dtype=np.int32)  # the child appends new[: i % 5] for i < 7, ...
    np.save(tmp_path / "new.npy", np.resize(new, 27))
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), target, str(k), str(tmp_path / "new.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    values, splits = chute.RaggedDataset(path)[:]
    assert len(splits) == 26 and np.array_equal(values, np.concatenate(old))
    added = [np.resize(new, 27)[: i % 5] for i in range(27)]
    ds = append_ragged(path, added)
    values, _ = ds[:]
    assert len(ds) == 52 and np.array_equal(values, np.concatenate(old + added))
    assert cli(["verify", str(path)]) == 0


def test_write_with_mode_a_appends_to_a_sharded_dataset(tmp_path: Path) -> None:
    path = tmp_path / "d"
    write_dataset(path, OLD, mode="a", shard_records=10).close()  # creates it
    ds = write_dataset(path, NEW, mode="a")  # shards found: an append
    assert [n for _, n in read_manifest(path).shards] == [10, 10, 10, 10, 10, 2]
    assert np.array_equal(ds[:], np.concatenate([OLD, NEW]))
    with pytest.raises(ValueError, match="shard_records=10"):
        write_dataset(path, NEW, mode="a", shard_records=20)
    with pytest.raises(ValueError, match="codec"):
        write_dataset(path, NEW, mode="a", codec="raw")
    with pytest.raises(ValueError, match="pick one"):
        write_dataset(path, NEW, mode="a", overwrite=True)
    with pytest.raises(FileExistsError, match="mode='a'"):
        write_dataset(path, NEW, shard_records=10)
    write_dataset(tmp_path / "single", OLD).close()
    with pytest.raises(chute.StoreError, match="single store"):
        write_dataset(tmp_path / "single", NEW, mode="a", shard_records=10)
    seqs = [np.arange(i % 4, dtype=np.int16) for i in range(9)]
    chute.write_ragged(tmp_path / "r", seqs[:5], shard_records=3).close()
    r = chute.write_ragged(tmp_path / "r", seqs[5:], mode="a")
    assert [n for _, n in read_manifest(tmp_path / "r").shards] == [3, 3, 3]
    assert np.array_equal(r[:][0], np.concatenate(seqs))


def test_a_reader_keeps_the_manifest_it_opened_with(tmp_path: Path) -> None:
    rows = np.arange(40, dtype=np.int32).reshape(20, 2)
    chute.write_dataset(tmp_path / "d", rows[:10], shard_records=4).close()
    with chute.Dataset(tmp_path / "d") as before:
        chute.append_dataset(tmp_path / "d", rows[10:]).close()
        assert len(before) == 10  # the append committed a newer manifest
        np.testing.assert_array_equal(before[:], rows[:10])
        with pytest.raises(IndexError):
            before[10]
    with chute.Dataset(tmp_path / "d") as after:
        np.testing.assert_array_equal(after[:], rows)


class _OverwrittenOnFirstLook:
    """Float rows whose first ``shape`` look (after the append read the manifest, before it
    takes the lock) has another writer replace the dataset with int32 records."""

    def __init__(self, path: Path) -> None:
        self.path, self.rows, self.looked = path, np.array([1.5, 2.5], np.float32), False
        self.dtype = self.rows.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        if not self.looked:
            self.looked = True
            write_dataset(self.path, np.arange(3, dtype=np.int32), overwrite=True,
                          shard_records=1000).close()  # fmt: skip
        return self.rows.shape

    def __getitem__(self, key: object) -> np.ndarray:
        return self.rows[key]  # type: ignore[index]


def test_an_append_refuses_a_dataset_replaced_before_it_took_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "d"
    write_dataset(path, np.zeros(4, np.float32), shard_records=1000).close()
    with pytest.raises(chute.StoreChangedError, match="nothing was appended"):
        append_dataset(path, _OverwrittenOnFirstLook(path))
    with Dataset(path) as ds:  # the other writer's dataset, untouched
        assert ds.dtype == np.int32 and ds[:].tolist() == [0, 1, 2]
    assert [p.name for p in path.glob("part-*")] == ["part-00000.zr"]
