"""The one URL resolver: schemes, options checked before any request, the same for insitu."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from chute._objects import is_remote_url, open_location, scheme_of
from chute.insitu import open_geometries


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("s3://b/p", "s3"),
        ("S3A://b/p", "s3"),
        ("gs://b/p", "gs"),
        ("gcs://b", "gs"),
        ("az://c/p", "az"),
        ("abfss://c/p", "az"),
        ("https://example.org/d", "https"),
        ("file:///tmp/x", "file"),
        ("/tmp/x", None),
        ("ftp://h/x", None),
    ],
)
def test_schemes(url: str, scheme: str | None) -> None:
    assert scheme_of(url) == scheme


def test_each_object_store_scheme_builds_its_store_without_a_request() -> None:
    for url, kw in [
        ("s3://bucket/a/b", {"region": "eu-west-1", "skip_signature": True}),
        ("gs://bucket/a", {"skip_signature": True}),
        ("az://container/a", {"account_name": "acct", "skip_signature": True}),
    ]:
        loc = open_location(url, **kw)
        assert loc.remote and loc.writable and type(loc.store).__name__.endswith("Store")
    web = open_location("https://example.org/data")
    assert web.remote and not web.writable
    local = open_location("file:///tmp/somewhere")
    assert not local.remote and local.local == "/tmp/somewhere" and local.store is None
    assert not is_remote_url("file:///tmp/x") and is_remote_url("gs://b")


@pytest.mark.parametrize(
    ("url", "key", "near"),
    [
        ("s3://b/p", "regoin", "region"),
        ("s3://b/p", "endpiont", "endpoint"),
        ("gs://b/p", "service_acount", "service_account"),
        ("az://c/p", "acount_name", "account_name"),
    ],
)
def test_a_misspelt_option_names_the_nearest(url: str, key: str, near: str) -> None:
    with pytest.raises(
        TypeError, match=rf"unexpected keyword argument '{key}'; did you mean '{near}'"
    ):
        open_location(url, **{key: "x"})


def test_options_in_obstore_spellings_are_taken() -> None:
    open_location("s3://b/p", AWS_REGION="eu-west-1", aws_skip_signature=True)
    open_location("gs://b/p", google_skip_signature=True)


def test_options_with_a_local_path_or_an_unknown_scheme_are_refused() -> None:
    with pytest.raises(TypeError, match="apply to object-storage URLs only"):
        open_location("/tmp/x", region="eu-west-1")
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        open_location("ftp://host/x")
    with pytest.raises(ValueError, match="names no bucket"):
        open_location("s3:///just/a/path")


def test_insitu_resolves_the_same_way() -> None:
    with pytest.raises(TypeError, match="did you mean 'region'"):
        open_geometries("s3://b/p.zarr", regoin="eu-west-1")


def test_chute_imports_and_reads_locally_without_obstore(tmp_path: Path) -> None:
    """obstore is the 'remote' extra: without it chute works on local data, and a URL says
    which extra to install."""
    code = f"""
import sys
sys.modules["obstore"] = None  # as if not installed
import numpy as np, chute
ds = chute.write_dataset({str(tmp_path / "d")!r}, np.arange(4))
assert ds[:].tolist() == [0, 1, 2, 3]
try:
    chute.Dataset("s3://bucket/d", skip_signature=True)
except ImportError as e:
    assert "pip install 'chute[remote]'" in str(e), e
else:
    raise AssertionError("no ImportError")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("endpoint", ["not a url", "http://127.0.0.1:9000 ", "http//127.0.0.1:9000",
                                      "ftp://host", "http://host:99999", 9000])  # fmt: skip
def test_a_malformed_endpoint_is_a_value_error_naming_it_before_any_request(
    endpoint: object,
) -> None:
    """obstore took these and panicked (pyo3's PanicException, no Exception) at the first
    request, from chute.Dataset and chute.write_dataset alike."""
    import numpy as np

    import chute

    opts = {"region": "us-east-1", "skip_signature": True, "endpoint": endpoint}
    with pytest.raises(ValueError, match=r"Dataset: endpoint=.* is not a URL"):
        chute.Dataset("s3://b/d", **opts)
    with pytest.raises(ValueError, match=r"write_dataset: endpoint=.* is not a URL"):
        chute.write_dataset("s3://b/d", np.arange(3), **opts)
    with pytest.raises(ValueError, match=r"AWS_ENDPOINT=.* is not a URL"):
        open_location("s3://b/d", AWS_ENDPOINT=endpoint)
    with pytest.raises(ValueError, match=r"base_url=.* is not a URL"):
        open_location("gs://b/d", base_url=endpoint, skip_signature=True)
    open_location("s3://b/d", endpoint="http://[::1]:9000/path", region="us-east-1")  # fine


def test_a_panic_in_obstore_s_client_is_a_remote_error() -> None:
    """A store instance is not checked as options are: a panic at its first request (a
    BaseException) is turned into a `RemoteError` at chute's boundary, on read and write."""
    import numpy as np
    from obstore.store import S3Store

    import chute
    from chute.errors import RemoteError

    def store() -> S3Store:
        return S3Store("b", region="us-east-1", skip_signature=True, endpoint="not a url")

    with pytest.raises(RemoteError, match="client failed"):
        chute.Dataset(store())
    with pytest.raises(RemoteError, match="client failed"):
        chute.write_dataset(store(), np.arange(3))
