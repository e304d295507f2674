"""Putting a locally written store or dataset into object storage, for the tests that read
it back by URL: a fresh bucket on the moto server, or an obstore ``MemoryStore``."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import obstore
from obstore.store import MemoryStore

from chute._objects import open_location
from tests.conftest import S3_OPTIONS, make_bucket

QUICK_RETRIES = {
    "max_retries": 2,
    "retry_timeout": timedelta(seconds=5),
    "backoff": {
        "init_backoff": timedelta(milliseconds=10),
        "max_backoff": timedelta(milliseconds=50),
        "base": 2,
    },
}
"""A retry budget for tests that inject faults: a few quick retries, then the error."""


def upload(folder: str | os.PathLike[str], store: Any, prefix: str = "") -> int:
    """Put every file under ``folder`` into ``store`` at ``prefix`` + its relative path;
    returns how many."""
    root = Path(folder)
    count = 0
    for path in sorted(root.rglob("*")):
        if path.is_file():
            key = f"{prefix.strip('/')}/{path.relative_to(root)}".lstrip("/")
            obstore.put(store, key, path.read_bytes())
            count += 1
    return count


def s3_location(endpoint: str, name: str = "data") -> tuple[str, dict[str, Any]]:
    """A URL in a fresh bucket on the moto server at ``endpoint``, and the options to reach it."""
    bucket = f"chute-{uuid.uuid4().hex[:16]}"
    make_bucket(endpoint, bucket)
    return f"s3://{bucket}/{name}", {**S3_OPTIONS, "endpoint": endpoint}


def to_s3(folder: str | os.PathLike[str], endpoint: str) -> tuple[str, dict[str, Any]]:
    """``folder`` uploaded to a fresh bucket: its URL and the options to read it."""
    url, options = s3_location(endpoint)
    upload(folder, open_location(url, **options).store)
    return url, options


def to_memory(folder: str | os.PathLike[str]) -> MemoryStore:
    """``folder`` put into a fresh in-memory store."""
    store = MemoryStore()
    upload(folder, store)
    return store


class Serve:
    """``serve(ds)``: ``ds`` as written, or uploaded and reopened by URL as the same class;
    ``serve.open(cls, path, **kw)``: ``cls(path, **kw)``, or the folder uploaded first and
    ``cls(url, **options, **kw)`` (so damage made to the folder travels with it)."""

    def __init__(self, endpoint: str | None) -> None:
        self.endpoint = endpoint
        self.remote = endpoint is not None

    def __call__(self, dataset: Any) -> Any:
        if self.endpoint is None:
            return dataset
        path = dataset.path
        dataset.close()
        return self.open(type(dataset), path)

    def open(self, kind: Any, path: str | os.PathLike[str], **kwargs: Any) -> Any:
        if self.endpoint is None:
            return kind(path, **kwargs)
        url, options = to_s3(path, self.endpoint)
        return kind(url, **options, **kwargs)
