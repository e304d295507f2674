"""Ray conversions into object storage (moto): read back (downloaded, opened with chute) the
same as chute's own writers give; an overwrite replaces the columns and removes the old
shards; a failed or retried task leaves nothing unnamed; a second conversion is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
from obstore.store import MemoryStore

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's own

import chute  # noqa: E402
import chute.ray  # noqa: E402
from chute.datasets import read_manifest  # noqa: E402
from tests.datasets.remote_helpers import (  # noqa: E402
    download,
    folders,
    keys,
    new_bucket,
    options,
    store_of,
)

N = 120
RNG = np.random.default_rng(1)
IMAGES = RNG.integers(0, 255, (N, 4, 4, 3), dtype=np.uint8)
LABELS = RNG.integers(0, 10, N).astype(np.int64)
TOKENS = [RNG.integers(0, 1000, int(RNG.integers(1, 9))).astype(np.int32) for _ in range(N)]


def _source(blocks: int = 4) -> Any:
    rows = [
        {"image": IMAGES[i], "label": LABELS[i], "tokens": TOKENS[i], "index": i} for i in range(N)
    ]
    return ray.data.from_items(rows, override_num_blocks=blocks)


def _columns(url: str, endpoint: str, dest: Path) -> dict[str, Any]:
    return chute.ray.open_columns(download(url, dest, endpoint))


def _names_match_manifests(url: str, endpoint: str, local: Path) -> None:
    """Every shard folder under each column is one its manifest names: nothing left over."""
    for column in json.loads((local / "columns.json").read_text())["columns"]:
        name = column["name"]
        named = {n for n, _ in read_manifest(local / name).shards}
        assert folders(f"{url}/{name}", endpoint) == {"dataset.json", *named}


def test_a_conversion_reads_back_as_chute_writes_the_same_data(
    local_ray: None, s3_server: str, tmp_path: Path
) -> None:
    bucket, opts = new_bucket(s3_server), options(s3_server)
    url = f"s3://{bucket}/conv"
    remote = chute.ray.write_dataset(url, _source(), shard_records=25, **opts)
    assert folders(url, s3_server) == {"columns.json", "image", "label", "tokens", "index"}
    cols = _columns(url, s3_server, tmp_path / "conv")
    for name, col in remote.items():  # what the conversion returns reads the same, remotely
        assert len(col) == N and np.array_equal(col[N - 1], cols[name][N - 1])
    _names_match_manifests(url, s3_server, tmp_path / "conv")
    # the same data through chute's own writers, to the same bucket
    chute.write_dataset(f"s3://{bucket}/w/image", IMAGES, shard_records=25, **opts)
    chute.write_dataset(f"s3://{bucket}/w/label", LABELS, shard_records=25, **opts)
    chute.write_ragged(f"s3://{bucket}/w/tokens", TOKENS, shard_records=25, **opts)
    for name in ("image", "label", "tokens"):
        mine = download(f"s3://{bucket}/w/{name}", tmp_path / "w" / name, s3_server)
        view = chute.RaggedDataset if name == "tokens" else chute.Dataset
        ours, theirs = view(mine), cols[name]
        assert type(theirs) is view and len(ours) == len(theirs) == N
        for i in range(N):
            assert np.array_equal(ours[i], theirs[i]), (name, i)
    assert np.array_equal(cols["image"][:], IMAGES) and np.array_equal(
        cols["index"][:], np.arange(N)
    )


def test_an_overwrite_replaces_the_columns_and_a_failure_leaves_the_old_ones(
    local_ray: None, s3_server: str, tmp_path: Path
) -> None:
    url, opts = f"s3://{new_bucket(s3_server)}/conv", options(s3_server)
    chute.ray.write_dataset(url, _source(), shard_records=25, **opts)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        chute.ray.write_dataset(url, _source(), **opts)
    old_keys = keys(url, s3_server)

    def broken(batch: dict[str, Any]) -> dict[str, Any]:
        if 100 in batch["index"]:
            raise RuntimeError("injected failure")
        return batch

    with pytest.raises(Exception, match="injected failure"):
        chute.ray.write_dataset(
            url, _source().map_batches(broken, batch_size=10), overwrite=True, **opts
        )
    assert keys(url, s3_server) == old_keys  # its uploads removed, the old conversion whole
    cols = _columns(url, s3_server, tmp_path / "old")
    assert np.array_equal(cols["label"][:], LABELS)
    chute.ray.write_dataset(url, _source(), columns=["label"], overwrite=True, **opts)
    assert folders(url, s3_server) == {"columns.json", "label"}  # the old columns removed
    local = download(url, tmp_path / "new", s3_server)
    _names_match_manifests(url, s3_server, local)
    assert set(chute.ray.open_columns(local)) == {"label"}
    assert np.array_equal(chute.ray.open_columns(local)["label"][:], LABELS)


def test_an_overwrite_replaces_a_dataset_at_the_prefix_itself(
    local_ray: None, s3_server: str
) -> None:
    url, opts = f"s3://{new_bucket(s3_server)}/plain", options(s3_server)
    chute.write_dataset(url, np.arange(10), shard_records=4, **opts)
    rows = ray.data.from_items([{"v": i * 10} for i in range(5)], override_num_blocks=1)
    chute.ray.write_dataset(url, rows, shard_records=4, overwrite=True, **opts)
    assert folders(url, s3_server) == {"columns.json", "v"}  # its manifest and shards gone
    with pytest.raises(chute.errors.RemoteNotFoundError):
        chute.Dataset(url, **opts)
    assert chute.Dataset(f"{url}/v", **opts)[:].tolist() == [0, 10, 20, 30, 40]


def test_a_conversion_in_object_storage_reopens_by_its_url(local_ray: None, s3_server: str) -> None:
    """open_columns and read_dataset take the URL write_dataset wrote to, with the same
    store options (they made it a local path: 'no converted dataset at s3:/...')."""
    url, opts = f"s3://{new_bucket(s3_server)}/conv", options(s3_server)
    chute.ray.write_dataset(url, _source(), shard_records=25, **opts)
    cols = chute.ray.open_columns(url, ["label", "tokens"], **opts)
    assert np.array_equal(cols["label"][:], LABELS) and np.array_equal(cols["tokens"][7], TOKENS[7])
    rows = chute.ray.read_dataset(url, ["index", "image"], override_num_blocks=3, **opts)
    got = rows.take_all()
    assert [int(r["index"]) for r in got] == list(range(N))
    assert all(np.array_equal(r["image"], IMAGES[i]) for i, r in enumerate(got))
    with pytest.raises(TypeError, match="did you mean 'region'"):
        chute.ray.open_columns(url, regoin="x", **opts)
    with pytest.raises(chute.errors.RemoteNotFoundError, match="no converted dataset"):
        chute.ray.open_columns(f"{url}-nothing", **opts)
    obstore.delete(store_of(url, s3_server), "columns.json")
    with pytest.raises(chute.IncompleteDatasetError, match="did not finish"):
        chute.ray.open_columns(url, **opts)


def test_a_retried_task_leaves_no_shard_unnamed(
    local_ray: None, s3_server: str, tmp_path: Path
) -> None:
    url, flag = f"s3://{new_bucket(s3_server)}/conv", tmp_path / "failed-once"

    def once(batch: dict[str, Any]) -> dict[str, Any]:
        if 70 in batch["index"] and not flag.exists():
            flag.touch()
            raise RuntimeError("injected failure")
        return batch

    ds = _source().map_batches(once, batch_size=10)
    ds.context.retried_map_errors, ds.context.max_map_retries = True, 2
    chute.ray.write_dataset(url, ds, shard_records=10, **options(s3_server))
    assert flag.exists()  # the failure did happen, and the conversion still finished
    local = download(url, tmp_path / "conv", s3_server)
    _names_match_manifests(url, s3_server, local)
    values, splits = chute.ray.open_columns(local)["tokens"][:]
    for i in range(N):
        assert np.array_equal(values[splits[i] : splits[i + 1]], TOKENS[i])


def test_a_second_conversion_is_refused_and_a_memory_store_cannot_take_one(
    local_ray: None, s3_server: str
) -> None:
    url, opts = f"s3://{new_bucket(s3_server)}/conv", options(s3_server)
    live = {"format": "chute-lock", "version": 1, "owner": "driver:7", "lease_s": 3600}
    obstore.put(store_of(url, s3_server), "columns.lock", json.dumps(live).encode())
    with pytest.raises(chute.StoreLockedError, match=r"columns\.lock is held .*driver:7"):
        chute.ray.write_dataset(url, _source(), **opts)
    assert keys(url, s3_server) == ["columns.lock"]  # no task ran
    with pytest.raises(chute.ChuteError, match="read-only"):
        chute.ray.write_dataset("https://example.org/conv", _source())
    with pytest.raises(TypeError, match="MemoryStore lives in one process"):
        chute.ray.write_dataset(MemoryStore(), _source())
    with pytest.raises(TypeError, match="'shard_record'; did you mean 'shard_records'"):
        chute.ray.write_dataset(url, _source(), shard_record=3, **opts)
