"""Small Zarr v3 archives whose values encode their own index (the S3 server is the suite's,
in tests/conftest.py)."""

from __future__ import annotations

import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore

from tests.conftest import S3_OPTIONS

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
