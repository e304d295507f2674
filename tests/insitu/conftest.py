"""Small Zarr v3 archives whose values encode their own index, and a local S3 server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

N = 203  # samples: 25 full chunks of 8 and a short one of 3
CHUNK = 8


def x_values(idx: np.ndarray) -> np.ndarray:
    """The (3, 5) float32 sample stored at each index of variable ``x``."""
    return (idx[:, None, None] * 100 + np.arange(15).reshape(3, 5)).astype(np.float32)


def write_archive(root: Any) -> None:
    """Variables ``x`` (N, 3, 5) float32 zstd, ``y`` (N,) int64 and ``z`` (2, N) with the
    samples on axis 1; plus a coordinate of another length that the loader must skip."""
    g = zarr.open_group(root, mode="w")
    x = g.create_array("x", shape=(N, 3, 5), chunks=(CHUNK, 3, 5), dtype="f4")
    x[:] = x_values(np.arange(N))
    y = g.create_array("y", shape=(N,), chunks=(CHUNK,), dtype="i8")
    y[:] = np.arange(N)
    z = g.create_array("z", shape=(2, N), chunks=(2, CHUNK), dtype="i4")
    z[:] = np.stack([np.arange(N), -np.arange(N)])
    lat = g.create_array("lat", shape=(3,), chunks=(3,), dtype="f8")
    lat[:] = [1.0, 2.0, 3.0]


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    path = tmp_path / "data.zarr"
    write_archive(str(path))
    return path


class CountingStore(WrapperStore[Store]):
    """Counts every ``get`` per key: the test's own view of what was fetched."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.gets: Counter[str] = Counter()

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        self.gets[key] += 1
        return await self._store.get(key, prototype, byte_range)

    def chunk_gets(self) -> Counter[str]:
        return Counter({k: v for k, v in self.gets.items() if "/c/" in k})


@pytest.fixture
def counting(archive: Path) -> CountingStore:
    return CountingStore(LocalStore(str(archive), read_only=True))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (bounded start-up wait, always stopped)."""
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # its first answer loads moto's backends: slow under load
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=10).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {endpoint}") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


S3_OPTIONS = {
    "region": "us-east-1",
    "access_key_id": "testing",
    "secret_access_key": "testing",
    "client_options": {"allow_http": True},
}


@pytest.fixture(scope="session")
def s3_archive(s3_server: str) -> tuple[str, dict[str, Any]]:
    """The test archive written into a fresh bucket through obstore; (url, store options)."""
    import obstore
    from obstore.store import S3Store
    from zarr.storage import ObjectStore

    options = {**S3_OPTIONS, "endpoint": s3_server}
    bucket = "insitu-test"
    urllib.request.urlopen(urllib.request.Request(f"{s3_server}/{bucket}", method="PUT")).close()
    write_archive(ObjectStore(S3Store(bucket, prefix="data.zarr", **options)))
    assert obstore.list(S3Store(bucket, **options)).collect()
    return f"s3://{bucket}/data.zarr", options
