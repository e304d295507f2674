"""Training in place on an Icechunk repository (local and S3 via moto), as on plain Zarr."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from chute.insitu import InSituDataset, open_geometries, split_by_chunk

from .conftest import S3_OPTIONS, N, write_archive, x_values

icechunk = pytest.importorskip("icechunk")


def committed_repo(storage: Any) -> tuple[Any, str]:
    """A repository holding the test archive on ``main``; (repo, snapshot id)."""
    repo = icechunk.Repository.create(storage)
    session = repo.writable_session("main")
    write_archive(session.store)
    return repo, session.commit("the test archive")


def batches(ds: InSituDataset, view: str = "train") -> list[list[int]]:
    out = []
    for b in getattr(ds, view):
        np.testing.assert_array_equal(b["x"], x_values(b["sample_indices"]))
        np.testing.assert_array_equal(b["y"], b["sample_indices"])
        out.append(b["sample_indices"].tolist())
    return out


def test_a_local_repository_reads_as_the_same_plain_zarr(tmp_path: Path, archive: Path) -> None:
    repo, _ = committed_repo(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.readonly_session("main")
    geoms = open_geometries(session)
    assert geoms == open_geometries(archive)  # same metadata as the plain archive
    m = split_by_chunk(geoms["x"])
    with (
        InSituDataset(session, m, batch_size=8) as ice,
        InSituDataset(archive, m, batch_size=8) as plain,
    ):
        assert ice.snapshot_id == session.snapshot_id
        assert batches(ice) == batches(plain)
        assert sorted(i for b in batches(ice, "all") for i in b) == list(range(N))
    with InSituDataset(session.store, m, batch_size=8) as by_store:  # the session's store
        assert by_store.snapshot_id == session.snapshot_id


def test_the_resume_state_pins_the_snapshot(tmp_path: Path) -> None:
    repo, first = committed_repo(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    m = split_by_chunk(open_geometries(repo.readonly_session("main"))["x"])
    with InSituDataset(repo.readonly_session("main"), m, batch_size=8, block_chunks=3) as ds:
        it = iter(ds.train)
        head = [next(it)["sample_indices"].tolist() for _ in range(4)]
        state = ds.state_dict()
        it.close()
        ds.set_epoch(0)
        full = [b["sample_indices"].tolist() for b in ds.train]
    assert state["config"]["snapshot_id"] == first and head == full[:4]
    writer = repo.writable_session("main")  # the branch moves on: y changes
    y = zarr.open_array(writer.store, path="y", mode="r+")
    y[:] = -np.arange(N)
    writer.commit("negate y")
    moved = repo.readonly_session("main")
    with InSituDataset(moved, m, batch_size=8, block_chunks=3) as later:
        with pytest.raises(ValueError, match=f"snapshot_id: saved '{first}'") as info:
            later.load_state_dict(state)
        assert f"readonly_session(snapshot_id='{first}')" in str(info.value)
    with InSituDataset(
        repo.readonly_session(snapshot_id=first), m, batch_size=8, block_chunks=3
    ) as same:
        same.load_state_dict(state)
        assert batches(same) == full[4:]  # the same data as before the new commit
    repo.create_tag("v1", snapshot_id=first)
    with InSituDataset(repo.readonly_session(tag="v1"), m, batch_size=8, block_chunks=3) as tag:
        tag.load_state_dict(state)  # a tag at the saved snapshot reads the same data too
        assert batches(tag) == full[4:]


def test_a_writable_session_is_refused(tmp_path: Path) -> None:
    repo, _ = committed_repo(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    m = split_by_chunk(open_geometries(repo.readonly_session("main"))["x"])
    with pytest.raises(ValueError, match="read-only Icechunk session"):
        InSituDataset(repo.writable_session("main"), m)


def test_a_repository_on_s3(s3_server: str, tmp_path: Path) -> None:
    bucket = "insitu-icechunk"
    urllib.request.urlopen(urllib.request.Request(f"{s3_server}/{bucket}", method="PUT")).close()
    storage = icechunk.s3_storage(
        bucket=bucket,
        prefix="repo",
        endpoint_url=s3_server,
        allow_http=True,
        force_path_style=True,
        region=S3_OPTIONS["region"],
        access_key_id=S3_OPTIONS["access_key_id"],
        secret_access_key=S3_OPTIONS["secret_access_key"],
    )
    repo, snapshot = committed_repo(storage)
    session = repo.readonly_session(tag=None, snapshot_id=snapshot)
    geoms = open_geometries(session)
    m = split_by_chunk(geoms["x"])
    with InSituDataset(session, m, batch_size=16) as ds:
        seen = batches(ds)
        assert sorted(i for b in seen for i in b) == m.sample_indices("train").tolist()
        assert ds.stats()["store_reads"] > 0


def test_a_commit_that_rewrites_chunks_gets_a_pool_of_its_own(tmp_path: Path) -> None:
    """A snapshot never changes, so an Icechunk pool is keyed by it: chunk data committed
    anew (the metadata untouched) is a new snapshot, read from a new pool, never stale."""
    repo, _ = committed_repo(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    cache = tmp_path / "cache"
    cache.mkdir()
    m = split_by_chunk(open_geometries(repo.readonly_session("main"))["x"])
    kw: dict[str, Any] = {"batch_size": 8, "cache_dir": cache, "cache_budget_bytes": 10**6}
    with InSituDataset(repo.readonly_session("main"), m, **kw) as old:
        batches(old, "all")  # every slab published
        writer = repo.writable_session("main")
        zarr.open_array(writer.store, path="y", mode="r+")[:] = -np.arange(N)
        writer.commit("negate y")
        with InSituDataset(repo.readonly_session("main"), m, **kw) as new:
            for b in new.all:
                np.testing.assert_array_equal(b["y"], -b["sample_indices"])
            assert new.stats()["shared_hits"] == 0
            assert len(list(cache.iterdir())) == 2
