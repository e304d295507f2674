"""Where a test's dataset is read from: the folder it was written to, or the same files in
object storage (the moto server), opened by URL. Tests that read a dataset take `serve`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.objects.remote import by_url


@pytest.fixture(params=["local", "s3"])
def serve(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """``serve(ds)``: ``ds`` as written (``local``), or uploaded and reopened by URL (``s3``)."""
    if request.param == "local":
        return lambda ds: ds
    endpoint = request.getfixturevalue("s3_server")
    return lambda ds: by_url(ds, endpoint)
