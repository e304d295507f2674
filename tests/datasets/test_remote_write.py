"""Writing datasets to object storage: on a real S3 API (moto) and obstore's MemoryStore.

What a URL write leaves is read back by downloading the prefix into a local folder and
opening it with chute as any local sharded dataset. Writers that must die or race run as
child processes behind a gate (a proxy holding one chosen request), so the point where they
stop is known."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
from obstore.store import MemoryStore

import chute
from chute.errors import (
    RemoteChangedError,
    RemoteError,
    RemoteNotFoundError,
    StoreError,
    StoreKindError,
    StoreLockedError,
)

from .remote_helpers import Gate, child_env, download, folders, new_bucket, options, store_of

ROWS = np.arange(30 * 4, dtype=np.int32).reshape(30, 4)
NEW_ROWS = np.arange(60 * 4, dtype=np.int32).reshape(60, 4) + 1000
SEQS = [np.arange(i % 5 + 1, dtype=np.int16) * i for i in range(23)]


@pytest.fixture
def url(s3_server: str) -> str:
    return f"s3://{new_bucket(s3_server)}/data/images"


@pytest.fixture
def gate(s3_server: str) -> Iterator[Gate]:
    g = Gate(s3_server)
    try:
        yield g
    finally:
        g.close()


def _local(store: Any, tmp_path: Path, endpoint: str = "", name: str = "down") -> Path:
    return download(store, tmp_path / name, endpoint)


def _ragged_rows(ds: chute.RaggedDataset) -> list[list[int]]:
    return [ds[i].tolist() for i in range(len(ds))]


# --- round trips -------------------------------------------------------------------------


def test_memory_store_round_trip_of_each_writer(tmp_path: Path) -> None:
    fixed, ragged, blobs, empty = MemoryStore(), MemoryStore(), MemoryStore(), MemoryStore()
    returned = chute.write_dataset(fixed, ROWS, shard_records=8)
    assert np.array_equal(returned[:], ROWS)  # the writer returns the dataset, read remotely
    chute.write_ragged(ragged, SEQS, shard_records=5, codec="raw")
    chute.write_dataset(blobs, [b"ab\x00", b"", b"\x00\x00c"])
    chute.write_dataset(empty, np.zeros((0, 3), np.float32))
    ds = chute.Dataset(_local(fixed, tmp_path, name="f"))
    assert np.array_equal(ds[:], ROWS) and len(ds.store.manifest.shards) == 4
    rs = chute.RaggedDataset(_local(ragged, tmp_path, name="r"))
    assert _ragged_rows(rs) == [s.tolist() for s in SEQS] and rs.dtype == np.int16
    bs = chute.RaggedDataset(_local(blobs, tmp_path, name="b"))
    assert [bs[i].tobytes() for i in range(3)] == [b"ab\x00", b"", b"\x00\x00c"]
    es = chute.Dataset(_local(empty, tmp_path, name="e"))
    assert len(es) == 0 and es.dtype == np.float32 and es.shape == (0, 3)
    assert folders(fixed) == {"dataset.json", *(f"part-{i:05d}.zr" for i in range(4))}


def test_a_write_to_a_url_returns_the_dataset_opened_by_that_url(s3_server: str) -> None:
    """As the docstrings now say (they said the writers to a URL return None)."""
    import pickle

    url, opts = f"s3://{new_bucket(s3_server)}/d", options(s3_server)
    ds = chute.write_dataset(url, ROWS, shard_records=8, **opts)
    assert isinstance(ds, chute.Dataset) and np.array_equal(pickle.loads(pickle.dumps(ds))[:], ROWS)
    rs = chute.write_ragged(f"{url}-r", SEQS, shard_records=5, **opts)
    assert isinstance(rs, chute.RaggedDataset) and _ragged_rows(rs) == [s.tolist() for s in SEQS]
    grown = chute.append_dataset(url, ROWS[:2], **opts)
    assert isinstance(grown, chute.Dataset) and len(grown) == len(ROWS) + 2


def test_s3_write_is_the_local_layout_byte_for_byte(
    url: str, s3_server: str, tmp_path: Path
) -> None:
    opts = options(s3_server)
    chute.write_dataset(url, NEW_ROWS, shard_records=7, workers=2, codec="zstd", **opts)
    local = tmp_path / "local"
    chute.write_dataset(local, NEW_ROWS, shard_records=7, codec="zstd").close()
    down = _local(url, tmp_path, s3_server)
    remote_files = {p.relative_to(down).as_posix() for p in down.rglob("*") if p.is_file()}
    local_files = {
        p.relative_to(local).as_posix()
        for p in local.rglob("*")
        if (p.is_file() and p.parent != local) or p.name == "dataset.json"
    }
    assert remote_files == local_files  # no lock object, nothing staged, left behind
    for name in remote_files:
        assert (down / name).read_bytes() == (local / name).read_bytes(), name
    assert np.array_equal(chute.Dataset(down)[:], NEW_ROWS)


def test_append_adds_shards_and_never_rewrites_one(
    url: str, s3_server: str, tmp_path: Path
) -> None:
    opts = options(s3_server)
    chute.write_dataset(url, ROWS[:25], shard_records=10, **opts)
    store = store_of(url, s3_server)
    before = {m["path"]: m["e_tag"] for batch in obstore.list(store) for m in batch}
    chute.append_dataset(url, ROWS[25:], **opts)
    chute.write_dataset(url, NEW_ROWS[:12], mode="a", **opts)  # the same, through mode="a"
    after = {m["path"]: m["e_tag"] for batch in obstore.list(store) for m in batch}
    assert all(after[k] == tag for k, tag in before.items() if k != "dataset.json")
    ds = chute.Dataset(_local(url, tmp_path, s3_server))
    assert np.array_equal(ds[:], np.concatenate([ROWS, NEW_ROWS[:12]]))
    assert ds.store.manifest.shards == (
        ("part-00000.zr", 10), ("part-00001.zr", 10), ("part-00002.zr", 5),
        ("part-00003.zr", 5), ("part-00004.zr", 10), ("part-00005.zr", 2),
    )  # fmt: skip
    # the downloaded copy is a local dataset like any: a local append goes on from it
    grown = chute.append_dataset(ds.store.path, NEW_ROWS[12:20])
    assert np.array_equal(grown[-8:], NEW_ROWS[12:20])


def test_append_ragged_and_its_refusals(s3_server: str, tmp_path: Path) -> None:
    store = MemoryStore()
    chute.write_ragged(store, SEQS[:10], shard_records=4)
    chute.append_ragged(store, SEQS[10:])
    assert _ragged_rows(chute.RaggedDataset(_local(store, tmp_path))) == [s.tolist() for s in SEQS]
    with pytest.raises(StoreKindError, match="variable-length"):
        chute.append_dataset(store, ROWS)
    with pytest.raises(ValueError, match="shard_records=4"):
        chute.write_ragged(store, SEQS, mode="a", shard_records=5)
    with pytest.raises(TypeError, match="record 0"):
        chute.append_ragged(store, [np.zeros(3, np.float64)])
    with pytest.raises(RemoteNotFoundError, match="no sharded dataset"):
        chute.append_dataset(MemoryStore(), ROWS)
    assert "dataset.lock" not in folders(store)  # every refusal let go of the lock


def test_overwrite_replaces_the_dataset_and_removes_old_shards(
    url: str, s3_server: str, tmp_path: Path
) -> None:
    opts = options(s3_server)
    chute.write_dataset(url, ROWS, shard_records=10, **opts)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        chute.write_dataset(url, NEW_ROWS, shard_records=30, **opts)
    chute.write_dataset(url, NEW_ROWS, shard_records=30, overwrite=True, **opts)
    # new names, never an old one's: a reader of the old manifest never reads new bytes
    assert folders(url, s3_server) == {"dataset.json", "part-00003.zr", "part-00004.zr"}
    assert np.array_equal(chute.Dataset(_local(url, tmp_path, s3_server))[:], NEW_ROWS)


def test_http_is_read_only_and_options_are_checked_before_any_request() -> None:
    with pytest.raises(RemoteError, match="read-only"):
        chute.write_dataset("https://example.org/data", ROWS)
    with pytest.raises(RemoteError, match="read-only"):  # refused before a request, too
        chute.write_dataset("http://127.0.0.1:9/data", ROWS, mode="a")
    nowhere = {**options("http://127.0.0.1:9"), "regoin": "eu-west-1"}
    with pytest.raises(TypeError, match="'regoin'; did you mean 'region'"):
        chute.write_dataset("s3://bucket/x", ROWS, **nowhere)
    with pytest.raises(TypeError, match="'shard_record'; did you mean 'shard_records'"):
        chute.write_ragged("s3://bucket/x", SEQS, shard_record=3)
    with pytest.raises(TypeError, match="'workrs'; did you mean 'workers'"):
        chute.append_dataset("gs://bucket/x", ROWS, workrs=2)
    with pytest.raises(TypeError, match="object-storage URLs only"):
        chute.write_dataset("/tmp/somewhere", ROWS, region="eu-west-1")
    with pytest.raises(ValueError, match="break_lock"):
        chute.write_dataset("/tmp/somewhere", ROWS, break_lock=True)


def test_a_store_without_conditional_writes_warns_and_writes(
    url: str, s3_server: str, tmp_path: Path
) -> None:
    opts = {**options(s3_server), "conditional_put": "disabled"}
    with pytest.warns(UserWarning, match="no conditional writes"):
        chute.write_dataset(url, ROWS, shard_records=16, **opts)
    assert np.array_equal(chute.Dataset(_local(url, tmp_path, s3_server))[:], ROWS)


# --- locks, kills and races --------------------------------------------------------------

CHILD = """
import json, sys, numpy as np, chute
url, opts, extra = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
rows = np.arange(60 * 4, dtype=np.int32).reshape(60, 4) + 1000
try:
    chute.write_dataset(url, rows, shard_records=10, overwrite=True, **extra, **opts)
except Exception as e:
    print("FAILED", type(e).__name__, e, flush=True)
    sys.exit(3)
print("DONE", flush=True)
"""


def _writer(url: str, endpoint: str, tmp_path: Path, **extra: Any) -> subprocess.Popen[str]:
    """A child process overwriting ``url`` with NEW_ROWS through ``endpoint``."""
    args = [sys.executable, "-c", CHILD, url, json.dumps(options(endpoint)), json.dumps(extra)]
    env = {**child_env(), "TMPDIR": str(tmp_path)}  # its staging, left behind by a kill
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _wait_held(gate: Gate, child: subprocess.Popen[str]) -> None:
    if not gate.held.wait(120):
        child.kill()
        raise AssertionError(f"the writer never reached the gate: {child.communicate()[0]}")


def test_kill_mid_upload_leaves_the_old_dataset_and_a_rerun_replaces_it(
    url: str, s3_server: str, gate: Gate, tmp_path: Path
) -> None:
    opts = options(s3_server)
    chute.write_dataset(url, ROWS, shard_records=10, **opts)  # part-00000 .. 00002
    gate.hold("PUT", r"/part-00006\.zr/")  # after the first new shards went up
    child = _writer(url, gate.endpoint, tmp_path)
    _wait_held(gate, child)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    gate.drop()
    left = folders(url, s3_server)
    assert {"part-00003.zr", "dataset.lock"} <= left  # its uploads and its lock stay behind
    orphans = sorted(f for f in left if f.startswith("part-") and f >= "part-00003.zr")
    old = chute.Dataset(_local(url, tmp_path, s3_server, "old"))
    assert np.array_equal(old[:], ROWS) and len(old.store.manifest.shards) == 3
    with pytest.raises(StoreLockedError, match=r"dataset\.lock is held by another writer"):
        chute.write_dataset(url, NEW_ROWS, overwrite=True, **opts)  # its lease still runs
    with pytest.warns(UserWarning, match="took over the lock"):
        chute.write_dataset(
            url, NEW_ROWS, shard_records=25, overwrite=True, break_lock=True, **opts
        )
    first = int(orphans[-1][5:10]) + 1  # above every shard there, the dead writer's too
    new = {f"part-{i:05d}.zr" for i in range(first, first + 3)}
    assert folders(url, s3_server) == {"dataset.json", *new}  # old shards and orphans gone
    assert np.array_equal(chute.Dataset(_local(url, tmp_path, s3_server, "new"))[:], NEW_ROWS)


def test_a_second_writer_is_refused_while_the_first_runs(
    url: str, s3_server: str, gate: Gate, tmp_path: Path
) -> None:
    chute.write_dataset(url, ROWS, shard_records=10, **options(s3_server))
    gate.hold("PUT", r"/part-00004\.zr/")
    child = _writer(url, gate.endpoint, tmp_path)
    try:
        _wait_held(gate, child)
        store = store_of(url, s3_server)
        lock, manifest = (obstore.head(store, k)["e_tag"] for k in ("dataset.lock", "dataset.json"))
        with pytest.raises(StoreLockedError, match=rf"{url}/dataset\.lock is held"):
            chute.write_dataset(url, NEW_ROWS[:5], overwrite=True, **options(s3_server))
        with pytest.raises(StoreLockedError):
            chute.append_dataset(url, NEW_ROWS[:5], **options(s3_server))
        # the refused writers took nothing over and committed nothing
        assert obstore.head(store, "dataset.lock")["e_tag"] == lock
        assert obstore.head(store, "dataset.json")["e_tag"] == manifest
    finally:
        gate.release()
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    assert np.array_equal(chute.Dataset(_local(url, tmp_path, s3_server))[:], NEW_ROWS)


def test_a_manifest_committed_meanwhile_is_never_overwritten(
    url: str, s3_server: str, gate: Gate, tmp_path: Path
) -> None:
    opts = options(s3_server)
    chute.write_dataset(url, ROWS, shard_records=10, **opts)
    gate.hold("PUT", r"/dataset\.json")  # the first writer, about to commit
    child = _writer(url, gate.endpoint, tmp_path)
    try:
        _wait_held(gate, child)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the lock taken over, as asked
            chute.write_dataset(url, ROWS[:7], overwrite=True, break_lock=True, **opts)
    finally:
        gate.release()
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 3 and "RemoteChangedError" in out and f"{url}/dataset.json" in out
    assert issubclass(RemoteChangedError, chute.StoreChangedError)
    assert np.array_equal(chute.Dataset(_local(url, tmp_path, s3_server))[:], ROWS[:7])


def test_an_expired_lock_is_taken_over_and_a_live_one_only_when_asked(tmp_path: Path) -> None:
    store = MemoryStore()
    stale = {"format": "chute-lock", "version": 1, "owner": "host:1", "lease_s": 0}
    obstore.put(store, "dataset.lock", json.dumps(stale).encode())
    with pytest.warns(UserWarning, match="took over the lock of host:1, expired"):
        chute.write_dataset(store, ROWS)
    live = {**stale, "owner": "host:2", "lease_s": 3600}
    obstore.put(store, "dataset.lock", json.dumps(live).encode())
    with pytest.raises(StoreLockedError, match=r"host:2"):
        chute.append_dataset(store, ROWS)
    with pytest.warns(UserWarning, match="break_lock=True"):
        chute.append_dataset(store, ROWS, break_lock=True)
    assert folders(store) == {"dataset.json", "part-00000.zr", "part-00001.zr"}
    assert np.array_equal(chute.Dataset(_local(store, tmp_path))[:], np.concatenate([ROWS, ROWS]))


def test_append_to_a_prefix_without_a_dataset_is_refused(url: str, s3_server: str) -> None:
    opts = options(s3_server)
    obstore.put(store_of(url, s3_server), "part-00000.zr/meta.zr", b"left by a dead writer")
    with pytest.raises(StoreError, match="no sharded dataset to append to"):
        chute.write_dataset(url, ROWS, mode="a", **opts)
    chute.write_dataset(url, ROWS, overwrite=True, **opts)  # replaces what was left there
    assert folders(url, s3_server) == {"dataset.json", "part-00001.zr"}


def test_a_damaged_manifest_is_reported_to_an_append_and_replaced_by_an_overwrite(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    chute.write_dataset(store, ROWS, shard_records=20)
    obstore.put(store, "dataset.json", b'{"format": "chute-sharded", "version": 1}')
    with pytest.raises(chute.CorruptStoreError, match=r"dataset\.json"):
        chute.append_dataset(store, ROWS)
    with pytest.raises(FileExistsError):
        chute.write_dataset(store, NEW_ROWS)
    chute.write_dataset(store, NEW_ROWS, overwrite=True)
    assert folders(store) == {"dataset.json", "part-00002.zr"}
    assert np.array_equal(chute.Dataset(_local(store, tmp_path))[:], NEW_ROWS)
