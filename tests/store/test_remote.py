"""A record store in object storage (`RecordStore(url)`): the same records, results and errors
as the store on disk it was copied from, read from the moto S3 server and from obstore's
memory store; damage, a changed object and a failing server each end in a `ChuteError`
naming the URL and the record."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest

from chute import RecordStore
from chute._objects import open_location
from chute.errors import (
    ChecksumError,
    CorruptStoreError,
    RemoteChangedError,
    RemoteError,
    RemoteNotFoundError,
    StoreClosedError,
    StoreError,
    UnsafeFileError,
)
from chute.store import RemoteStore
from tests.conftest import S3_OPTIONS, running_moto
from tests.objects.fault_proxy import FaultProxy
from tests.objects.remote import QUICK_RETRIES, s3_location, to_memory, to_s3, upload
from tests.objects.spawned import run_spawned
from tests.store.conftest import record
from tests.store.isolate import OK, WRONG_DATA

N = 60


def _write(path: Path) -> list[bytes]:
    """A store of raw, zstd and zstd_dict records (one empty), in two chunks' worth of calls."""
    records = [record(i) for i in range(N)]
    records[7] = b""
    with RecordStore(path, mode="w", codec="raw") as store:
        store.append(records[:20])
        store.append(records[20:40], codec="zstd")
        store.train_dict(records[:40], dict_size=4096)
        store.append(records[40:], codec="zstd_dict")
    return records


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    path = tmp_path_factory.mktemp("remote") / "store.zr"
    return path, _write(path)


@pytest.fixture(params=["memory", "s3"])
def opened(
    request: pytest.FixtureRequest, written: tuple[Path, list[bytes]]
) -> Callable[..., RecordStore]:
    """Opens the written store by URL, through moto or a memory store."""
    path, _ = written
    if request.param == "memory":
        store = to_memory(path)
        return lambda **kw: RecordStore(store, **kw)
    url, options = to_s3(path, request.getfixturevalue("s3_server"))
    return lambda **kw: RecordStore(url, **options, **kw)


def test_a_remote_store_reads_what_the_local_one_does(
    opened: Callable[..., RecordStore], written: tuple[Path, list[bytes]]
) -> None:
    path, records = written
    with RecordStore(path) as local, opened(verify=True) as remote:
        assert isinstance(remote, RemoteStore) and isinstance(remote, RecordStore)
        assert len(remote) == N and remote.has_dict and remote.has_checksums
        assert not remote.supports_writes and not remote.supports_growth
        idx = np.array([59, 0, 7, 33, 33, 41, 19, 20])
        values, offsets = remote.gather_packed(idx)
        assert [values[a:b].tobytes() for a, b in itertools.pairwise(offsets)] == [
            records[i] for i in idx
        ]
        assert (remote.lengths(idx) == local.lengths(idx)).all()
        same = [i for i in range(N) if len(records[i]) == len(records[3])]
        assert (remote.gather(same) == local.gather(same)).all()
        out = np.full(10_000, 255, np.uint8)
        offs = np.array([0, 3000, 6000])
        remote.gather_into([3, 7, 50], out, offs)
        for k, i in enumerate([3, 7, 50]):
            assert out[offs[k] : offs[k] + len(records[i])].tobytes() == records[i]
        report = remote.verify(batch=16)
        assert report == {"records": N, "damaged": [], "unchecked": 0, "checked": N}
        stats, mine = local.stats(), remote.stats()
        for key in ("records", "live_bytes", "logical_bytes", "chunk_bytes", "codecs", "chunks"):
            assert stats[key] == mine[key]
        assert mine["disk_bytes"] > stats["live_bytes"]
        assert str(remote.path) in repr(remote)


def test_a_batch_larger_than_one_native_call(tmp_path: Path) -> None:
    n = 70_000  # more records than chunks one native call takes
    with RecordStore(tmp_path / "s.zr", mode="w", codec="raw") as store:
        store.append(np.arange(n, dtype=np.uint32).view(np.uint8).reshape(n, 4))
    with RecordStore(to_memory(tmp_path / "s.zr"), verify=True) as remote:
        idx = np.arange(n)[::-1]
        assert (remote.gather(idx, np.empty(n, np.uint32)) == idx).all()
        values, _ = remote.gather_packed(idx)
        assert (values.view(np.uint32) == idx).all()


def test_damage_is_reported_naming_the_url_and_record(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    records = _write(path)
    chunk = bytearray((path / "0.zr").read_bytes())
    chunk[5] ^= 0xFF  # inside record 0, raw
    (path / "0.zr").write_bytes(bytes(chunk))
    bucket = to_memory(path)
    with RecordStore(bucket, verify=True) as remote:
        with pytest.raises(ChecksumError, match=r"store.*: record 0 \(chunk 0"):
            remote.gather_packed([1, 0])
        assert remote.gather_packed([1])[0].tobytes() == records[1]
        report = remote.verify()
        assert [i for i, _ in report["damaged"]] == [0] and report["checked"] == N - 1
    with RecordStore(bucket) as unchecked:  # without verify the bytes are returned as stored
        assert unchecked.gather_packed([0])[0].tobytes() != records[0]


def test_a_truncated_chunk_object_is_damage_not_shorter_data(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    records = _write(path)
    size = (path / "0.zr").stat().st_size
    (path / "0.zr").write_bytes((path / "0.zr").read_bytes()[: size // 2])
    with RecordStore(to_memory(path)) as remote:
        assert remote.gather_packed([0])[0].tobytes() == records[0]
        with pytest.raises(CorruptStoreError, match=r"record 59 .* past the end of its chunk"):
            remote.gather_packed([0, 59])
        assert remote.verify()["damaged"]


def test_missing_objects(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    _write(path)
    with pytest.raises(RemoteNotFoundError, match=r"no store at .*MemoryStore"):
        RecordStore(to_memory(tmp_path))  # the folder above the store
    (path / "0.zr").unlink()
    with RecordStore(to_memory(path)) as remote:
        assert len(remote) == N  # chunks are looked at on first use
        with pytest.raises(CorruptStoreError, match=r"chunk object 0\.zr is missing"):
            remote.gather_packed([0])
    (path / "crc32c.chute").unlink()
    with pytest.raises(CorruptStoreError, match=r"crc32c\.chute is missing"):
        RecordStore(to_memory(path), verify=True)


def test_an_object_changed_after_open_is_never_read(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    records = _write(path)
    bucket = to_memory(path)
    with RecordStore(bucket) as remote:
        assert remote.gather_packed([0])[0].tobytes() == records[0]  # chunk 0 seen
        obstore.put(bucket, "0.zr", (path / "0.zr").read_bytes()[::-1])
        with pytest.raises(RemoteChangedError, match=r"0\.zr changed .*record 0"):
            remote.gather_packed([0])
    obstore.put(bucket, "0.zr", (path / "0.zr").read_bytes())
    with RecordStore(bucket) as remote:
        with RecordStore(tmp_path / "other.zr", mode="w") as other:
            other.append([b"x"])
        obstore.put(bucket, "meta.zr", (tmp_path / "other.zr" / "meta.zr").read_bytes())
        # chunk 0 was HEADed with the table at open: the store reads as it was then
        assert remote.gather_packed([0])[0].tobytes() == records[0]
        obstore.put(bucket, "0.zr", (tmp_path / "other.zr" / "0.zr").read_bytes())
        with pytest.raises(RemoteChangedError, match=r"0\.zr changed .*record 0"):
            remote.gather_packed([0])


def test_a_hostile_table_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    _write(path)
    meta = bytearray((path / "meta.zr").read_bytes())
    entry = 16 + 16 * 5
    meta[entry : entry + 4] = (2**32 - 8).to_bytes(4, "little")  # offset far past the chunk
    meta[entry + 12 : entry + 14] = (3).to_bytes(2, "little")  # a chunk past the tail
    (path / "meta.zr").write_bytes(bytes(meta))
    with (
        RecordStore(to_memory(path)) as remote,
        pytest.raises(CorruptStoreError, match=r"record 5 .*names chunk 3"),
    ):
        remote.gather_packed([4, 5])
    meta[entry + 12 : entry + 14] = (0).to_bytes(2, "little")
    (path / "meta.zr").write_bytes(bytes(meta))
    with (
        RecordStore(to_memory(path)) as remote,
        pytest.raises(CorruptStoreError, match=r"record 5 .*past the end of its chunk"),
    ):
        remote.gather_packed([5])
    big = tmp_path / "big"
    big.mkdir()
    (big / "meta.zr").write_bytes(bytes(meta))
    (big / "dict.zr").write_bytes(bytes((1 << 27) + 1))
    with pytest.raises(UnsafeFileError, match=r"dict\.zr holds more than"):
        RecordStore(to_memory(big))


def test_writing_a_remote_store_points_to_write_dataset(written: tuple[Path, list[bytes]]) -> None:
    bucket = to_memory(written[0])
    for mode in ("a", "w"):
        with pytest.raises(StoreError, match=r"chute\.write_dataset"):
            RecordStore(bucket, mode=mode)
    with (
        RecordStore(bucket) as remote,
        pytest.raises(StoreError, match="read-only: write datasets there"),
    ):
        remote.append([b"x"])
    with pytest.raises(StoreClosedError):
        remote.gather_packed([0])


def test_a_misspelt_option_is_named_before_any_request() -> None:
    with pytest.raises(TypeError, match="'regoin'; did you mean 'region'"):
        RecordStore("s3://no-such-bucket/d", regoin="us-east-1", endpoint="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="'verfy'; did you mean 'verify'"):
        RecordStore("s3://no-such-bucket/d", verfy=True, endpoint="http://127.0.0.1:9")


def test_a_denied_request_names_the_url() -> None:
    with (
        running_moto(INITIAL_NO_AUTH_ACTION_COUNT="0") as endpoint,  # keys are checked
        pytest.raises(RemoteError, match=r"s3://locked/store\.zr/meta\.zr: access denied"),
    ):
        RecordStore("s3://locked/store.zr", **S3_OPTIONS, endpoint=endpoint)


def _gather_through(url: str, options: dict[str, Any]) -> int:
    """In a spawned child: open through the proxy, then every GET fails."""
    with RecordStore(url, **options) as remote:
        try:
            remote.gather_packed([3, 50])
        except RemoteError as e:
            return OK if url in str(e) and "record 3" in str(e) else WRONG_DATA
    return WRONG_DATA


@pytest.mark.parametrize("fault", ["503", "drop"])
def test_a_failing_server_ends_a_read_in_an_error(
    s3_server: str, written: tuple[Path, list[bytes]], fault: str
) -> None:
    url, options = s3_location(s3_server)
    upload(written[0], open_location(url, **options).store)
    with FaultProxy(s3_server) as proxy:
        # the open passes (its reads are whole objects); ranged reads of chunks fail
        proxy.fault = lambda method, path: fault if "/0.zr" in path else None
        opts = {**options, "endpoint": proxy.endpoint, "retry_config": QUICK_RETRIES}
        assert run_spawned(_gather_through, url, opts) == OK
        assert proxy.count("GET", "/0.zr") > 1 or proxy.count("HEAD", "/0.zr") > 1


def _outcome(open_ds: Callable[[], Any], where: str) -> tuple[str, str]:
    """What reading everything gives: the data's bytes, or the error's class and message
    (its location written as ``<where>``)."""
    try:
        ds = open_ds()
        got = np.concatenate([ds[:].reshape(-1), ds[[N - 1, 0, N // 2]].reshape(-1)])
        ds.close()
    except Exception as e:
        return type(e).__name__, str(e).replace(where, "<where>")
    return "data", got.tobytes().hex()


def _damage_sweep(root: str, trials: int) -> int:
    """In a spawned child: damage a store at random, many times; read it from its folder and
    from object storage (a memory store): the same data, or the same error."""
    import shutil

    from chute import Dataset, write_dataset
    from tests.objects.remote import to_memory

    rng = np.random.default_rng(5)
    rows = rng.integers(0, 4, (N, 96)).astype(np.uint8)
    failures = []
    for codec in ("raw", "zstd", "zstd_dict"):
        pristine = Path(root) / f"{codec}.zr"
        write_dataset(pristine, rows, codec=codec).close()
        files = sorted(f.name for f in pristine.iterdir())
        for trial in range(trials):
            path = Path(root) / f"t{trial}"
            shutil.copytree(pristine, path)
            target = path / files[trial % len(files)]
            data = bytearray(target.read_bytes())
            if data and rng.random() < 0.6:
                for _ in range(int(rng.integers(1, 4))):
                    data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
            else:
                data = data[: int(rng.integers(0, max(len(data), 1)))]
            target.write_bytes(bytes(data))
            bucket = to_memory(path)
            for verify in (False, True):
                local = _outcome(partial(Dataset, path, verify=verify), str(path))
                remote = _outcome(partial(Dataset, bucket, verify=verify), repr(bucket))
                if local != remote:
                    failures.append((codec, target.name, verify, local[:2], remote[:2]))
            shutil.rmtree(path)
    for failure in failures:
        print(failure)
    return OK if not failures else WRONG_DATA


def test_damage_reads_the_same_from_object_storage_as_from_a_folder(tmp_path: Path) -> None:
    assert run_spawned(_damage_sweep, str(tmp_path), 60, timeout=300) == OK
