"""Where a test's dataset is read from: the folder it was written to, or the same files in
object storage (the moto server), opened by URL. Tests that read a dataset take `serve`, so
each runs on both."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.objects.remote import to_s3


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


@pytest.fixture(params=["local", "s3"])
def serve(request: pytest.FixtureRequest) -> Serve:
    """Reads each test's datasets from their folder (``local``) or through s3:// (``s3``)."""
    if request.param == "local":
        return Serve(None)
    return Serve(request.getfixturevalue("s3_server"))
