"""Datasets by URL: what opening costs (a sharded dataset's shards open on first use), an
overwrite noticed, pickling, options checked before any request, ``chute info`` and
``chute verify`` of a URL, the loader surfacing a failing server in ``next()``, a dataset on
a web server. (Every
read test of tests/datasets also runs through s3:// on moto: the ``serve`` fixture.)"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest

import chute
from chute import DataLoader, Dataset, RaggedDataset
from chute._objects import open_location
from chute.cli import main
from chute.datasets import ShardedStore
from chute.datasets._sharded_manifest import Manifest, shard_name
from chute.errors import (
    CorruptStoreError,
    RemoteError,
    RemoteNotFoundError,
    StoreChangedError,
)
from tests.objects.fault_proxy import FaultProxy, FileServer
from tests.objects.remote import QUICK_RETRIES, s3_location, to_s3, upload
from tests.objects.spawned import run_spawned
from tests.store.isolate import OK, WRONG_DATA

SHARDS = 10_000


def test_opening_ten_thousand_shards_costs_three_requests(tmp_path: Path, s3_server: str) -> None:
    one = chute.write_dataset(tmp_path / "one", np.array([[7, 8]], np.int32), shard_records=1)
    schema = one.schema
    one.close()
    url, options = s3_location(s3_server)
    bucket = open_location(url, **options).store
    for i in (0, SHARDS - 1):  # two shards are there; the manifest names ten thousand
        upload(tmp_path / "one" / shard_name(0), bucket, shard_name(i))
    obstore.put(bucket, "gen.chute", (tmp_path / "one" / "gen.chute").read_bytes())
    shards = tuple((shard_name(i), 1) for i in range(SHARDS))
    manifest = Manifest(schema=schema, shard_records=1, shards=shards)
    obstore.put(bucket, "dataset.json", manifest.to_bytes())
    with FaultProxy(s3_server) as proxy:
        ds = Dataset(url, **{**options, "endpoint": proxy.endpoint})
        assert len(ds) == SHARDS and ds.shape == (SHARDS, 2)
        assert len(proxy.seen) == 3  # dataset.json, schema.json, gen.chute: one round trip
        assert ds[[SHARDS - 1, 0]].tolist() == [[7, 8], [7, 8]]
        store = ds.store
        assert isinstance(store, ShardedStore) and store.opened_shards == (0, SHARDS - 1)
        # a shard opens in one round trip: the dataset's gen.chute and the shard's schema.json,
        # meta.zr and checksums, a HEAD of its chunk (no dictionary: no record needs one);
        # then one GET of its record
        opened = sorted(p.split("/")[-1] for _, p in proxy.seen[3:] if shard_name(0) in p)
        assert opened == ["0.zr", "0.zr", "crc32c.chute", "meta.zr", "schema.json"]
        assert len(proxy.seen) == 3 + 2 * 6
        with pytest.raises(CorruptStoreError, match=r"shard part-05000\.zr of the manifest"):
            ds[5000]
        ds.close()


def test_a_shard_that_fails_to_open_in_a_batch_is_asked_for_once(
    tmp_path: Path, s3_server: str
) -> None:
    """A batch across shards raises the first failure to open one: the per-shard path did
    not open the same shards again (a second full retry budget: twice the documented
    bound, against a server that hangs)."""
    chute.write_dataset(tmp_path / "d", np.arange(40), shard_records=10).close()
    url, options = to_s3(tmp_path / "d", s3_server)
    meta = "part-00003.zr/meta.zr"
    with FaultProxy(s3_server) as proxy:
        proxy.fault = lambda method, path: "403" if path.endswith(meta) else None
        ds = Dataset(url, **{**options, "endpoint": proxy.endpoint})
        with pytest.raises(RemoteError, match=r"denied.*opening the shards of record 5"):
            ds[[5, 35]]
        assert proxy.count("GET", meta) == 1
        ds.close()


def test_a_shard_whose_schema_alone_is_gone_says_so(tmp_path: Path, s3_server: str) -> None:
    chute.write_dataset(tmp_path / "d", np.arange(30), shard_records=10).close()
    url, options = to_s3(tmp_path / "d", s3_server)
    bucket = open_location(url, **options).store
    obstore.delete(bucket, "part-00001.zr/schema.json")
    ds = Dataset(url, **options)
    with pytest.raises(CorruptStoreError, match=r"schema\.json of shard part-00001\.zr"):
        ds[15]
    obstore.delete(bucket, [m["path"] for b in obstore.list(bucket, "part-00002.zr") for m in b])
    with pytest.raises(CorruptStoreError, match=r"shard part-00002\.zr of the manifest is"):
        ds[25]
    ds.close()


def test_an_overwrite_is_noticed_when_a_shard_opens(tmp_path: Path, s3_server: str) -> None:
    chute.write_dataset(tmp_path / "d", np.arange(30), shard_records=10).close()
    url, options = to_s3(tmp_path / "d", s3_server)
    ds = Dataset(url, **options)
    assert ds[[0, 1]].tolist() == [0, 1]  # shard 0 open
    chute.write_dataset(tmp_path / "d", np.arange(30) * 2, shard_records=10, overwrite=True)
    bucket = open_location(url, **options).store
    obstore.put(bucket, "gen.chute", (tmp_path / "d" / "gen.chute").read_bytes())
    with pytest.raises(StoreChangedError, match="overwritten since this reader opened it"):
        ds[15]
    assert ds[[2]].tolist() == [2]  # shard 0's objects are unchanged: still its own
    ds.close()


def test_a_dataset_by_url_pickles_with_its_options(tmp_path: Path, s3_server: str) -> None:
    chute.write_ragged(tmp_path / "r", [np.arange(i) for i in range(9)], shard_records=4).close()
    url, options = to_s3(tmp_path / "r", s3_server)
    ds = RaggedDataset(url, verify=True, **options)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.path == url and isinstance(copy.store, ShardedStore)
    for a, b in zip(ds[[8, 3]], copy[[8, 3]], strict=True):
        assert np.array_equal(a, b)
    ds.close()
    copy.close()


def test_options_are_checked_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'regoin'; did you mean 'region'"):
        Dataset("s3://bucket/d", regoin="eu-west-1", endpoint="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="'verfy'; did you mean 'verify'"):
        RaggedDataset("s3://bucket/d", verfy=True, endpoint="http://127.0.0.1:9")
    chute.write_dataset(tmp_path / "x", np.arange(3)).close()
    with pytest.raises(TypeError, match="apply to object-storage URLs only"):
        Dataset(tmp_path / "x", region="eu-west-1")
    assert Dataset(f"file://{tmp_path / 'x'}")[[2]].tolist() == [2]


def test_nothing_at_a_url_is_a_clear_error(s3_server: str) -> None:
    url, options = s3_location(s3_server)
    with pytest.raises(RemoteNotFoundError, match=r"neither dataset\.json nor schema\.json"):
        Dataset(url, **options)


def test_chute_info_and_verify_take_urls(
    tmp_path: Path, s3_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    chute.write_dataset(tmp_path / "one", np.arange(50, dtype=np.int64)).close()
    chute.write_dataset(tmp_path / "many", np.arange(50, dtype=np.int64), shard_records=20).close()
    chunk = tmp_path / "many" / "part-00001.zr" / "0.zr"
    data = bytearray(chunk.read_bytes())
    data[10] ^= 1
    chunk.write_bytes(bytes(data))
    one, options = to_s3(tmp_path / "one", s3_server)
    many, _ = to_s3(tmp_path / "many", s3_server)
    flags = [f"-o{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in options.items()]
    assert main(["info", "--json", one, many, *flags]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [r["records"] for r in info] == [50, 50]
    assert info[0]["schema"]["dtype"] == "int64" and len(info[1]["shard_names"]) == 3
    assert main(["verify", "--json", one, many, *flags]) == 1
    one_report, many_report = json.loads(capsys.readouterr().out)
    assert one_report["checked"] == 50 and not one_report["damaged"]
    assert [(d["shard"], d["index"]) for d in many_report["damaged"]] == [("part-00001.zr", 21)]
    assert main(["info", one, "-oregoin=x", *flags]) == 2
    assert "did you mean 'region'" in capsys.readouterr().err
    assert main(["compact", one]) == 2


def _loader_through_faults(url: str, options: dict[str, Any]) -> int:
    """In a spawned child: a loader whose chunk reads all fail raises in next()."""
    ds = Dataset(url, **options)
    with DataLoader({"x": ds}, batch_size=8, sampler="iid", seed=1, prefetch=2) as loader:
        try:
            next(loader)
        except RemoteError as e:
            return OK if url in str(e) and "record" in str(e) else WRONG_DATA
    return WRONG_DATA


def test_the_loader_surfaces_a_failing_server_in_next(tmp_path: Path, s3_server: str) -> None:
    chute.write_dataset(tmp_path / "d", np.arange(64, dtype=np.int32), shard_records=16).close()
    url, options = to_s3(tmp_path / "d", s3_server)
    with FaultProxy(s3_server) as proxy:
        proxy.fault = lambda method, path: "503" if path.endswith("/0.zr") else None
        opts = {**options, "endpoint": proxy.endpoint, "retry_config": QUICK_RETRIES}
        assert run_spawned(_loader_through_faults, url, opts) == OK


def test_a_dataset_on_a_web_server(tmp_path: Path) -> None:
    seqs = [np.arange(i % 7) for i in range(40)]
    chute.write_ragged(tmp_path / "tok", seqs, shard_records=16).close()
    chute.write_dataset(tmp_path / "one", np.arange(40, dtype=np.int16)).close()
    web_options = {"client_options": {"allow_http": True}}
    with FileServer(str(tmp_path)) as web:
        tokens = RaggedDataset(f"{web.url}/tok", verify=True, **web_options)
        values, splits = tokens[[39, 0, 20]]
        assert splits.tolist() == [0, 4, 4, 10] and values.tolist() == [
            0,
            1,
            2,
            3,
            0,
            1,
            2,
            3,
            4,
            5,
        ]
        one = Dataset(f"{web.url}/one", **web_options)
        assert one[[5, 39]].tolist() == [5, 39] and one.store.verify()["checked"] == 40
        chunk = tmp_path / "one" / "0.zr"  # rewritten in place: the server's ETag changes
        chunk.write_bytes(chunk.read_bytes()[::-1])
        with pytest.raises(RemoteError, match=r"one/0\.zr changed since it was opened"):
            one[[5]]
        with pytest.raises(RemoteNotFoundError):
            Dataset(f"{web.url}/nothing", **web_options)
        with pytest.raises(TypeError, match="'region'"):
            Dataset(f"{web.url}/one", region="x")  # a web server takes no credentials


def test_shards_with_their_own_dictionaries_and_a_damaged_one(
    tmp_path: Path, s3_server: str
) -> None:
    # a batch across shards is decoded in one native call per dictionary: every shard's
    # records with its own, and damage in one named as the local read names it
    rows = (np.arange(400 * 64) % 251).astype(np.uint8).reshape(400, 64)
    rows[::7] = np.random.default_rng(6).integers(0, 256, (len(rows[::7]), 64))
    chute.write_dataset(tmp_path / "d", rows, shard_records=100, codec="zstd_dict").close()
    assert all((tmp_path / "d" / shard_name(i) / "dict.zr").exists() for i in range(4))
    order = np.random.default_rng(7).permutation(len(rows))
    url, options = to_s3(tmp_path / "d", s3_server)
    with Dataset(url, **options, verify=True) as ds:
        assert np.array_equal(ds[order], rows[order])
    chunk = tmp_path / "d" / shard_name(2) / "0.zr"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError) as local:
        Dataset(tmp_path / "d", verify=True)[order]
    url, options = to_s3(tmp_path / "d", s3_server)
    with Dataset(url, **options, verify=True) as ds, pytest.raises(CorruptStoreError) as remote:
        ds[order]
    assert type(remote.value) is type(local.value)
    where = str(local.value).split(": ", 1)[1]
    assert str(remote.value).endswith(where), (local.value, remote.value)
