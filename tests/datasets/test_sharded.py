"""Sharded datasets: the manifest on disk, gathers per shard, damage, parallel writes, CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import (
    CorruptStoreError,
    Dataset,
    IncompleteDatasetError,
    RaggedDataset,
    RecordStore,
    StoreChangedError,
    StoreClosedError,
    write_dataset,
    write_ragged,
)
from chute.cli import main as cli
from chute.datasets import ShardedStore, is_sharded, read_manifest
from tests.objects.remote import Serve

ROWS = (np.arange(103 * 4, dtype=np.int32).reshape(103, 4) * 7) % 1000


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    write_dataset(tmp_path / "d", ROWS, shard_records=10).close()
    return tmp_path / "d"


def test_layout_and_manifest_bytes(sharded: Path) -> None:
    names = sorted(p.name for p in sharded.iterdir())
    assert names == ["dataset.json", "dataset.lock", "gen.chute"] + [
        f"part-{i:05d}.zr" for i in range(11)
    ]
    doc = json.loads((sharded / "dataset.json").read_text())
    fields = {k: v for k, v in doc.items() if k != "checksum"}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert doc["checksum"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert doc["format"] == "chute-sharded" and doc["version"] == 1
    assert doc["schema"] == {"dtype": "<i4", "shape": [4], "codec": "zstd"}
    assert doc["shard_records"] == 10 and doc["records"] == 103
    assert doc["shards"] == [{"name": f"part-{i:05d}.zr", "records": 10} for i in range(10)] + [
        {"name": "part-00010.zr", "records": 3}
    ]
    for i in range(11):  # each shard is a whole store of its own, with its checksum sidecar
        part = sharded / f"part-{i:05d}.zr"
        assert (part / "crc32c.chute").stat().st_size > 0
        assert np.array_equal(Dataset(part)[:], ROWS[10 * i : 10 * i + 10])


def test_batch_spanning_shards_is_one_gather_per_touched_shard(sharded: Path, serve: Serve) -> None:
    ds = serve.open(Dataset, sharded)
    store = ds.store
    assert isinstance(store, ShardedStore) and store.opened_shards == ()
    idx = [95, 3, 102, 11, 3, 19, 20, 9, 10]
    assert np.array_equal(ds[idx], ROWS[idx])
    assert store.opened_shards == (0, 1, 2, 9, 10)
    assert store.gathers == (1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1)
    assert np.array_equal(ds[25:45:3], ROWS[25:45:3])
    assert store.gathers[2:5] == (2, 1, 1)
    assert np.array_equal(ds[::-1], ROWS[::-1]) and ds[-1].tolist() == ROWS[-1].tolist()


def test_ragged_sharded_packs_in_caller_order(tmp_path: Path, serve: Serve) -> None:
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 99, (int(rng.integers(0, 9)), 2)).astype(np.int16) for _ in range(57)]
    ds = serve(write_ragged(tmp_path / "r", seqs, shard_records=8))
    idx = [56, 0, 8, 7, 33, 33, 16]
    values, splits = ds[idx]
    for k, i in enumerate(idx):
        assert np.array_equal(values[splits[k] : splits[k + 1]], seqs[i])
    assert ds.lengths(idx).tolist() == [len(seqs[i]) for i in idx]
    padded, lengths = ds.getitems_padded(idx, pad_value=-1)
    assert lengths.tolist() == [len(seqs[i]) for i in idx]
    assert np.array_equal(padded[0, : lengths[0]], seqs[56])


def test_parallel_write_matches_serial(tmp_path: Path) -> None:
    a = write_dataset(tmp_path / "a", ROWS, shard_records=16)
    b = write_dataset(tmp_path / "b", ROWS, shard_records=16, workers=2)
    assert read_manifest(tmp_path / "a") == read_manifest(tmp_path / "b")
    assert np.array_equal(a[:], b[:])
    seqs = [np.arange(i % 13, dtype=np.float64) for i in range(70)]
    r = write_ragged(tmp_path / "r", seqs, shard_records=9, workers=2, codec="zstd_dict")
    values, splits = r[:]
    assert np.array_equal(values, np.concatenate(seqs)) and len(splits) == 71


def test_failed_parallel_write_leaves_nothing_not_a_shorter_dataset(tmp_path: Path) -> None:
    seqs = [np.zeros(4, np.uint8)] * 30 + [np.zeros(2_000_000, np.uint8)]
    with pytest.raises(ValueError, match="record 30 is 2000000 bytes"):
        write_ragged(tmp_path / "r", iter(seqs), shard_records=10, workers=2)
    assert not (tmp_path / "r").exists()  # the shards before the bad record went with it
    write_ragged(tmp_path / "r", iter(seqs[:30]), shard_records=10, workers=2).close()


def test_missing_manifest_is_incomplete(sharded: Path) -> None:
    (sharded / "dataset.json").unlink()
    with pytest.raises(IncompleteDatasetError, match=r"no dataset\.json"):
        Dataset(sharded)
    assert cli(["info", str(sharded)]) == 2
    assert cli(["verify", str(sharded)]) == 2


def test_interrupted_write_is_incomplete(tmp_path: Path) -> None:
    def source() -> Any:
        for i in range(40):
            if i == 25:
                raise KeyboardInterrupt("stopped mid-write")
            yield np.arange(i % 5)

    with pytest.raises(KeyboardInterrupt):
        write_ragged(tmp_path / "r", source(), shard_records=10)
    with pytest.raises(IncompleteDatasetError):
        RaggedDataset(tmp_path / "r")


def test_shard_shorter_than_manifest_is_damage(sharded: Path, serve: Serve) -> None:
    with RecordStore(sharded / "part-00004.zr", mode="a") as store:
        store.delete([9])
    ds = serve.open(Dataset, sharded)
    assert len(ds) == 103 and np.array_equal(ds[:40], ROWS[:40])  # other shards still read
    with pytest.raises(CorruptStoreError, match="holds 9 records, the manifest says 10"):
        ds[45]
    assert cli(["verify", str(sharded)]) == 1


def test_longer_inner_shard_is_damage_longer_last_shard_is_an_unfinished_append(
    sharded: Path, serve: Serve
) -> None:
    with RecordStore(sharded / "part-00010.zr", mode="a") as store:
        store.append(np.zeros((2, 16), np.uint8))
    ds = serve.open(Dataset, sharded)
    assert len(ds) == 103 and np.array_equal(ds[95:], ROWS[95:])
    with pytest.raises(IndexError):
        ds[103]
    with RecordStore(sharded / "part-00003.zr", mode="a") as store:
        store.append(np.zeros((1, 16), np.uint8))
    with pytest.raises(CorruptStoreError, match="holds 11 records"):
        serve.open(Dataset, sharded)[30]


def test_missing_shard_and_tampered_manifest(sharded: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    shutil.rmtree(sharded / "part-00002.zr")
    with pytest.raises(CorruptStoreError, match="missing"):
        Dataset(sharded)
    manifest = copy / "dataset.json"
    doc = json.loads(manifest.read_text())
    doc["shards"][0]["records"] = 9
    doc["records"] = 102
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError, match="checksum"):
        Dataset(copy)
    manifest.write_text("[")
    with pytest.raises(CorruptStoreError, match="JSON"):
        Dataset(copy)


def test_overwrite_between_single_and_sharded(tmp_path: Path) -> None:
    path = tmp_path / "x"
    write_dataset(path, ROWS).close()
    ds = write_dataset(path, ROWS[:30], shard_records=7, overwrite=True)
    assert isinstance(ds.store, ShardedStore) and len(ds) == 30
    assert not (path / "meta.zr").exists()
    ds.close()
    ds = write_dataset(path, ROWS[:5], overwrite=True)
    assert isinstance(ds.store, RecordStore) and np.array_equal(ds[:], ROWS[:5])
    assert not is_sharded(path)


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_a_bad_mode_leaves_a_sharded_dataset_that_overwrite_would_replace(
    sharded: Path, kind: str
) -> None:
    write: Any = write_dataset if kind == "fixed" else write_ragged
    data: Any = ROWS[:5] if kind == "fixed" else [ROWS[:2], ROWS[:3]]
    with pytest.raises(ValueError, match="mode must be 'w'"):
        write(sharded, data, mode="append", overwrite=True)
    with Dataset(sharded) as ds:  # checked before anything was removed
        assert np.array_equal(ds[:], ROWS)


def test_bad_sharding_options(tmp_path: Path) -> None:
    for kwargs, err in (
        ({"shard_records": 0}, ValueError),
        ({"shard_records": 1 << 25}, ValueError),
        ({"shard_records": 2.5}, TypeError),
        ({"workers": 2}, ValueError),
        ({"shard_records": 4, "workers": 0}, ValueError),
    ):
        with pytest.raises(err):
            write_dataset(tmp_path / "bad", ROWS, **kwargs)
    assert not (tmp_path / "bad").exists()


def test_wrong_kind_and_closed(sharded: Path) -> None:
    with pytest.raises(chute.StoreError, match="open it with Dataset"):
        RaggedDataset(sharded)
    ds = Dataset(sharded)
    ds.close()
    with pytest.raises(chute.StoreClosedError):
        ds[0]


def test_cli_info_verify_compact(sharded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["info", str(sharded)]) == 0
    out = capsys.readouterr().out
    assert "11 shards of at most 10 records" in out and "records:   103" in out
    assert "part-00010.zr" in out
    assert cli(["verify", str(sharded)]) == 0
    assert "ok: 11 shards, 103 records: 103 matched their checksum" in capsys.readouterr().out
    with RecordStore(sharded / "part-00001.zr", mode="a") as store:
        store.delete([0])  # a damaged dataset now, yet compact must still work per shard
    assert cli(["compact", str(sharded)]) == 0
    assert "over 11 shards" in capsys.readouterr().out
    # flip a byte inside shard 6's data: verify names the global record
    chunk = sharded / "part-00006.zr" / "0.zr"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0xFF
    chunk.write_bytes(bytes(data))
    assert cli(["verify", str(sharded)]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED record 60 (part-00006.zr record 0)" in out
    assert "DAMAGED shard part-00001.zr" in out


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_threads_give_the_same_batches_and_errors_wait_for_every_shard(
    sharded: Path, threads: int, serve: Serve
) -> None:
    idx = np.random.default_rng(threads).integers(0, 103, 500)
    with serve.open(Dataset, sharded, threads=threads) as ds:
        assert np.array_equal(ds[idx], ROWS[idx])
    chunk = sharded / "part-00006.zr" / "0.zr"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with serve.open(Dataset, sharded, threads=threads, verify=True) as ds:
        with pytest.raises(CorruptStoreError, match="part-00006"):
            ds[idx]
        assert np.array_equal(ds[idx[idx < 60]], ROWS[idx[idx < 60]])  # the others still read


def test_a_forked_child_gathers_across_shards(sharded: Path) -> None:
    """A child forked after the parent gathered (as torch DataLoader workers are) must not
    wait on the parent's threads."""
    import multiprocessing

    ds = Dataset(sharded, threads=2)
    idx = np.arange(0, 103, 7)
    assert np.array_equal(ds[idx], ROWS[idx])  # the parent's shard threads now exist
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=lambda: queue.put(ds.__getitems__(idx)))  # fork: not pickled
    child.start()
    try:
        got = queue.get(timeout=60)
        child.join(timeout=60)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0 and np.array_equal(got, ROWS[idx])
    ds.close()


def test_workers_map_a_memory_mapped_npy_by_name(tmp_path: Path) -> None:
    import pickle

    from chute.datasets._sharded_write import Rows

    src = np.random.default_rng(3).integers(0, 255, (300, 16, 16), dtype=np.uint8)
    np.save(tmp_path / "x.npy", src)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    window = pickle.loads(pickle.dumps(Rows(mm, 120, 170)))
    assert len(pickle.dumps(Rows(mm, 120, 170))) < 1000  # a file name, not 12 KiB of rows
    assert np.array_equal(window[:], src[120:170]) and np.array_equal(
        window[[0, 49]], src[[120, 169]]
    )
    ds = write_dataset(tmp_path / "d", mm, shard_records=64, workers=2, codec="zstd_dict")
    assert np.array_equal(ds[:], src)
    rows = pickle.loads(pickle.dumps(Rows(src, 10, 20, np.dtype(np.int16))))  # not mapped
    assert rows.dtype == np.int16 and np.array_equal(rows[:], src[10:20])


def test_a_sharded_view_pickles_by_path(sharded: Path) -> None:
    import pickle

    ds = Dataset(sharded, threads=2)
    copy = pickle.loads(pickle.dumps(ds))
    assert isinstance(copy.store, ShardedStore) and copy.store.opened_shards == ()
    assert np.array_equal(copy[[102, 0, 55]], ROWS[[102, 0, 55]])
    assert copy.ndim == 2 and copy.nbytes == ROWS.nbytes


def test_local_shards_are_read_in_one_native_call_like_shard_by_shard(
    sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch over local shards is one call of the compiled core across their stores; it
    reads what the shard-by-shard path reads, into rows and into byte offsets alike."""
    import chute.datasets._sharded_store as module

    calls: list[int] = []
    real = module.gather_many
    monkeypatch.setattr(module, "gather_many", lambda s, *a: calls.append(len(s)) or real(s, *a))
    rng = np.random.default_rng(4)
    with Dataset(sharded) as ds:
        for _ in range(20):
            idx = rng.integers(0, 103, int(rng.integers(2, 60)))
            assert np.array_equal(ds[idx], ROWS[idx])
        assert len(calls) == 20 and max(calls) > 3  # one call a batch, many stores in it
        values, offsets = ds.store.gather_packed([100, 5, 57, 5])
        assert bytes(values) == ROWS[[100, 5, 57, 5]].tobytes()
        assert offsets.tolist() == [0, 16, 32, 48, 64]


def test_a_record_of_another_size_in_a_shard_is_refused_in_a_batch(tmp_path: Path) -> None:
    """Shards of a dataset of (4,) int32 rows, one record replaced by one of another size:
    a batch touching it says which record and sizes; batches around it read as before."""
    write_dataset(tmp_path / "d", ROWS, shard_records=10).close()
    with RecordStore(tmp_path / "d" / "part-00003.zr", mode="a") as store:
        store.delete([4])  # the shard's last record moves into slot 4
        store.append([np.zeros(3, np.int32).tobytes()])  # and a short one at its end
    with Dataset(tmp_path / "d") as ds:
        assert np.array_equal(ds[[0, 15, 34, 50]], ROWS[[0, 15, 39, 50]])
        with pytest.raises(ValueError, match="record 39 holds 12 bytes"):
            ds[[0, 15, 39, 50]]


_HOSTILE_MANY = """
import numpy as np, sys
from chute import Dataset
from chute._native import first_moved, gather_many, shard_split
ds = Dataset(sys.argv[1])
store = ds.store
store._open_shards(range(3))
w = [store.shard(s).in_place().where for s in range(3)]
i8 = lambda *v: np.array(v, np.int64)
i4 = lambda *v: np.array(v, np.int32)
out = np.empty((4, 16), np.uint8)
assert gather_many(w, i4(0, 1), i8(0, 1), out, 16, None, 1)[0] == 0  # the control
calls = [
    lambda: gather_many(w, i4(0, 3), i8(0, 1), out, 16, None, 1),         # no store 3
    lambda: gather_many(w, i4(0, -1), i8(0, 1), out, 16, None, 1),        # negative
    lambda: gather_many(w, i8(0, 1), i8(0, 1), out, 16, None, 1),         # int64 which
    lambda: gather_many(w, i4(0), i8(0, 1), out, 16, None, 1),            # which short
    lambda: gather_many(w, i4(0, 1), i8(0, 10**6), out, 16, None, 1),     # no record
    lambda: gather_many(w, i4(0, 1), i8(0, 1), out[:1], 16, None, 1),     # out short
    lambda: gather_many(w, i4(0, 1), i8(0, 1), out, 0, np.array([0], np.uint64), 1),
    lambda: gather_many(w, i4(0, 1), i8(0, 1), out, 0, np.array([0, 10**9], np.uint64), 1),
    lambda: gather_many(w, i4(0, 1), i8(0, 1), np.empty(4, object), 16, None, 1),
    lambda: gather_many([w[0][:3]], i4(0, 0), i8(0, 1), out, 16, None, 1),  # not a store
    lambda: gather_many([5], i4(0, 0), i8(0, 1), out, 16, None, 1),          # not a tuple
    lambda: gather_many([(w[0][0][:1], *w[0][1:])], i4(0, 0), i8(0, 5), out, 16, None, 1),
    lambda: gather_many(w, i4(0, 1), i8(0, 1), out, 12, None, 1),         # wrong size
]
stamp = store.shard(0).in_place().stamp
assert first_moved([stamp, stamp]) == -1 and first_moved([]) == -1  # the control
assert first_moved([stamp, (stamp[0], stamp[1] + 1)]) == 1
for bad in ([(stamp[0][:8], 0)], [(b"x" * 16, 0)], [(stamp[0], -1)], [(stamp[0],)], [stamp[0]],
            [(None, 0)], [(np.empty(16, object), 0)], 5, [(stamp[0], 2**64)]):
    calls.append(lambda bad=bad: first_moved(bad))
for k, call in enumerate(calls):
    try:
        got = call()
    except (ValueError, TypeError, IndexError):
        continue
    assert got[0] != 0 if isinstance(got, tuple) else got >= 0, (k, got)
starts, w4, l8 = i8(0, 10, 20), np.empty(2, np.int32), np.empty(2, np.int64)
ro = np.zeros(2, np.int32)
ro.setflags(write=False)
assert shard_split(starts, i8(15, 3), w4, l8) == [0, 1] and w4.tolist() == [1, 0]  # the control
for bad in [
    (i8(0, 10, 20), i8(15, 20), w4, l8),                         # past the last shard
    (i8(0, 10, 20), i8(-1, 3), w4, l8),                          # negative
    (i8(5, 10, 20), i8(3, 6), w4, l8),                           # before the first
    (i8(0), i8(0), w4, l8),                                      # no shard
    (np.array([0, 10, 20], np.int32), i8(1, 3), w4, l8),         # int32 starts
    (starts, i8(1, 3), w4[:1], l8),                              # which short
    (starts, i8(1, 3), np.empty(2, np.int64), l8),               # int64 which
    (starts, i8(1, 3), w4, np.empty(2, np.int32)),               # int32 local
    (starts, i8(1, 3), w4, np.zeros(4, np.int64)[::2]),          # strided
    (starts, i8(1, 3), ro, l8),                                  # read-only
    (starts, np.array([1.0, 3.0]), w4, l8),                      # float indices
    (starts, i8(1, 3), np.empty(2, object), l8),                 # objects
]:
    try:
        shard_split(*bad)
    except (ValueError, TypeError, IndexError):
        calls.append(None)
        continue
    raise AssertionError(bad)
print("refused", len(calls))
"""


def test_hostile_arguments_to_the_many_store_gather_are_refused_in_a_child(
    sharded: Path,
) -> None:
    import subprocess
    import sys
    import textwrap

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_HOSTILE_MANY), str(sharded)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused" in done.stdout


def test_a_shard_changed_after_a_batch_read_it_in_place_is_refused(sharded: Path) -> None:
    """The shards a batch reads where they lie are kept as the core reads them; what keeps a
    shard compacted (or reset) since from being read is the check of its generation after
    every read, one call for all the batch's shards."""
    with Dataset(sharded) as ds:
        assert np.array_equal(ds[[3, 15, 27]], ROWS[[3, 15, 27]])  # shards 0, 1, 2 kept
        with RecordStore(sharded / "part-00001.zr", mode="a") as shard:
            shard.compact()  # the same records, a new generation
        assert np.array_equal(ds[[3, 27, 33]], ROWS[[3, 27, 33]])  # shard 1 untouched
        for idx in ([3, 15, 27], [15, 16]):  # with others, and in place only
            with pytest.raises(StoreChangedError, match="reopen"):
                ds[idx]
    with Dataset(sharded) as ds:  # reopened: read as before
        assert np.array_equal(ds[[3, 15, 27]], ROWS[[3, 15, 27]])
        ds.store.shard(1).close()  # a kept view of a shard whose own store is closed
        with pytest.raises(StoreClosedError):
            ds[[3, 15, 27]]
        assert np.array_equal(ds[[3, 27, 33]], ROWS[[3, 27, 33]])  # the others read on


def test_each_index_finds_its_shard_as_a_search_of_the_starts_would() -> None:
    from chute._native import shard_split

    rng = np.random.default_rng(7)
    for _ in range(200):
        sizes = rng.integers(0, 5, int(rng.integers(1, 12)))  # empty shards too
        if sizes.sum() == 0:
            continue
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        idx = rng.integers(0, int(starts[-1]), int(rng.integers(0, 40))).astype(np.int64)
        which, local = np.empty(idx.size, np.int32), np.empty(idx.size, np.int64)
        touched = shard_split(starts, idx, which, local)
        shard = np.searchsorted(starts, idx, side="right") - 1
        assert touched == sorted(set(shard.tolist()))
        assert np.array_equal(np.asarray(touched, np.int64)[which], shard)
        assert np.array_equal(local, idx - starts[shard])
