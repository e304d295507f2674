"""Shared by every test folder: a real S3 API server (moto) on 127.0.0.1, started once."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

S3_OPTIONS = {
    "region": "us-east-1",
    "access_key_id": "testing",
    "secret_access_key": "testing",
    "client_options": {"allow_http": True},
}
"""What chute needs besides ``endpoint=`` to reach the test server."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_moto(**env: str) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with ``env`` added to its environment (bounded start-up
    wait, always stopped); yields its endpoint."""
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    port = _free_port()
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # its first answer loads moto's backends: slow under load
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=10).close()
                break
            except urllib.error.HTTPError:  # an answer, if a refusal (a server that checks keys)
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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (bounded start-up wait, always stopped)."""
    with running_moto() as endpoint:
        yield endpoint


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on the test server (an existing one is kept)."""
    request = urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")
    urllib.request.urlopen(request).close()


@pytest.fixture(params=["local", "s3"])
def serve(request: pytest.FixtureRequest) -> Any:
    """Reads each test's datasets from their folder (``local``) or through s3:// (``s3``),
    uploaded to the moto server: tests that read a dataset take it, so each runs on both."""
    from tests.objects.remote import Serve

    if request.param == "local":
        return Serve(None)
    return Serve(request.getfixturevalue("s3_server"))
