"""For the tests of writes to object storage: a fresh bucket on the moto server, a download
of a prefix into a local folder (which chute then opens as any local dataset), and a gate:
a proxy in front of moto that holds one chosen request until told to let it through, so a
test can kill a writer, or race a second one, at a known point of its upload."""

from __future__ import annotations

import os
import re
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import obstore
from obstore.store import S3Store

from tests.conftest import S3_OPTIONS, make_bucket
from tests.objects.fault_proxy import FaultProxy


def new_bucket(endpoint: str) -> str:
    name = f"chute-w-{uuid.uuid4().hex[:12]}"
    make_bucket(endpoint, name)
    return name


def options(endpoint: str) -> dict[str, Any]:
    """The store options chute needs to reach the moto server (or a gate in front of it)."""
    return {**S3_OPTIONS, "endpoint": endpoint}


def store_of(url_or_store: Any, endpoint: str = "") -> Any:
    """An obstore store for an ``s3://`` URL on the test server (or the store itself)."""
    if not isinstance(url_or_store, str):
        return url_or_store
    parsed = urlparse(url_or_store)
    return S3Store(parsed.netloc, prefix=parsed.path.strip("/") or None, **options(endpoint))


def keys(url_or_store: Any, endpoint: str = "") -> list[str]:
    """Every object key under the prefix, sorted."""
    store = store_of(url_or_store, endpoint)
    return sorted(meta["path"] for batch in obstore.list(store) for meta in batch)


def folders(url_or_store: Any, endpoint: str = "") -> set[str]:
    """The top-level names under the prefix (shard folders, dataset.json, a lock ...)."""
    return {key.split("/", 1)[0] for key in keys(url_or_store, endpoint)}


def download(url_or_store: Any, dest: Path, endpoint: str = "") -> Path:
    """Copy every object under the prefix into ``dest`` (same relative names)."""
    store = store_of(url_or_store, endpoint)
    for key in keys(store):
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bytes(obstore.get(store, key).bytes()))
    return dest


class Gate:
    """A `FaultProxy` to ``upstream`` (moto) that holds the first request whose method and
    path match (``hold(method, pattern)``) until `release` (passed on) or `drop` (never
    answered, as a killed writer's request); `held` is set when it arrives."""

    def __init__(self, upstream: str) -> None:
        self.pattern: re.Pattern[str] | None = None
        self.method = ""
        self.held = threading.Event()
        self.released = threading.Event()
        self.dropped = False
        self.proxy = FaultProxy(upstream).__enter__()
        self.proxy.fault = self._fault
        self.endpoint = self.proxy.endpoint

    def hold(self, method: str, pattern: str) -> None:
        self.method, self.pattern = method, re.compile(pattern)

    def _fault(self, method: str, path: str) -> str | None:
        if self.pattern is None or method != self.method or not self.pattern.search(path):
            return None
        self.pattern = None  # the first match only
        self.held.set()
        self.released.wait(60)
        return "drop" if self.dropped else None

    def release(self) -> None:
        self.released.set()

    def drop(self) -> None:
        """Let the held request die unanswered, as a killed writer's does."""
        self.dropped = True
        self.released.set()

    def close(self) -> None:
        self.drop()
        self.proxy.__exit__(None, None, None)


def child_env() -> dict[str, str]:
    """The environment of a writer run as a child process: this checkout's sources first."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (src, root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}
