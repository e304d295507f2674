"""`ObjectReader`: whole and ranged reads, merged and bounded in flight, each answer checked
against the object's first-seen version; every failure a `RemoteError` naming the URL, after
bounded retries, never a hang (faults injected by a proxy in front of the moto server)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import obstore
import pytest
from obstore.store import MemoryStore

from chute._objects import (
    ObjectInfo,
    ObjectReader,
    Span,
    bounded_options,
    open_bounded,
    open_location,
)
from chute._objects._reader import merge
from chute.errors import RemoteChangedError, RemoteError, RemoteNotFoundError, UnsafeFileError
from tests.conftest import S3_OPTIONS, make_bucket, running_moto
from tests.objects.fault_proxy import FaultProxy
from tests.objects.remote import QUICK_RETRIES
from tests.objects.spawned import run_spawned
from tests.store.isolate import OK, WRONG_DATA, run_isolated

DATA = bytes(range(256)) * 8192  # 2 MiB


@pytest.fixture
def memory() -> ObjectReader:
    store = MemoryStore()
    obstore.put(store, "d/chunk", DATA)
    obstore.put(store, "d/small", b"tiny")
    return ObjectReader(open_location(store))


@pytest.fixture
def s3(s3_server: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh bucket holding ``d/chunk`` on the moto server, and the options to reach it."""
    bucket = f"reader-{uuid.uuid4().hex[:12]}"
    make_bucket(s3_server, bucket)
    options = {**S3_OPTIONS, "endpoint": s3_server}
    obstore.put(open_location(f"s3://{bucket}", **options).store, "d/chunk", DATA)
    yield bucket, options


def test_merge_joins_neighbours_and_caps_a_request() -> None:
    assert merge([(0, 10), (5, 20), (30, 40)], gap=5) == [(0, 20), (30, 40)]
    assert merge([(0, 10), (14, 20)], gap=5) == [(0, 20)]  # the gap is read through
    assert merge([(0, 10), (20, 30)], gap=5) == [(0, 10), (20, 30)]
    assert merge([(0, 60), (60, 120), (120, 130)], gap=5, most=100) == [(0, 60), (60, 130)]
    assert merge([(0, 500)], most=100) == [(0, 500)]  # one range is never split
    assert merge([(7, 7)]) == []


def test_whole_and_ranged_reads(memory: ObjectReader) -> None:
    assert memory.read_all("d/small", limit=4) == b"tiny"
    info = memory.head("d/chunk")
    assert (info.path, info.size) == ("d/chunk", len(DATA)) and info.etag
    ranges = [(1000, 1010), (0, 4), (1005, 1020), (5000, 5000), (len(DATA) - 3, len(DATA))]
    before = memory.requests
    got = memory.read_ranges(info, ranges)
    assert [bytes(b) for b in got] == [DATA[a:b] for a, b in ranges]
    assert memory.requests - before == 2  # the first three merge; the empty one needs none
    with pytest.raises(ValueError, match="outside"):
        memory.read_ranges(info, [(0, len(DATA) + 1)])


def test_a_bigger_object_than_its_format_allows_is_refused(memory: ObjectReader) -> None:
    with pytest.raises(UnsafeFileError, match="d/small holds more than the 3 bytes"):
        memory.read_all("d/small", limit=3)


def test_a_missing_object_names_its_url(memory: ObjectReader) -> None:
    for read in (lambda: memory.head("d/nothing"), lambda: memory.read_all("d/nothing", 9)):
        with pytest.raises(RemoteNotFoundError, match=r"MemoryStore.*/d/nothing: no such object"):
            read()


def test_a_changed_object_is_never_read(memory: ObjectReader) -> None:
    info = memory.head("d/chunk")
    obstore.put(memory.location.store, "d/chunk", DATA[::-1])
    with pytest.raises(RemoteChangedError, match="d/chunk changed since it was opened"):
        memory.read_ranges(info, [(0, 10)])
    stale = ObjectInfo("d/chunk", len(DATA) + 1, None)  # a size that no longer holds
    with pytest.raises(RemoteChangedError, match="changed since it was opened"):
        memory.read_ranges(stale, [(0, 10)])


def test_s3_reads_and_the_etag_check(s3: tuple[str, dict[str, Any]]) -> None:
    bucket, options = s3
    reader = ObjectReader(open_bounded(f"s3://{bucket}/d", **options))
    info = reader.head("chunk")
    assert bytes(reader.read_ranges(info, [(10, 20)])[0]) == DATA[10:20]
    obstore.put(reader.location.store, "chunk", DATA[:100])  # replaced by a shorter object
    with pytest.raises(RemoteChangedError, match=f"s3://{bucket}/d/chunk changed"):
        reader.read_ranges(info, [(10, 20)])
    reader.close()


def test_requests_in_flight_are_bounded(s3: tuple[str, dict[str, Any]], s3_server: str) -> None:
    bucket, options = s3
    with FaultProxy(s3_server) as proxy:
        proxy.fault = lambda method, path: "hold"  # each waits until 4 are in flight
        proxy.hold_for = 4
        reader = ObjectReader(
            open_bounded(f"s3://{bucket}/d", **{**options, "endpoint": proxy.endpoint}),
            max_in_flight=4,
        )
        info = reader.head("chunk")
        ranges = [(k * 100_000, k * 100_000 + 100) for k in range(20)]  # far apart: 20 requests
        got = reader.read_ranges(info, ranges)
        assert [bytes(b) for b in got] == [DATA[a:b] for a, b in ranges]
        assert proxy.count("GET") == 20
        assert 2 <= proxy.most_in_flight <= 4
        reader.close()


def _read_through_faults(url: str, options: dict[str, Any]) -> int:
    """In a spawned child: a read through a proxy that always fails ends in a RemoteError."""
    reader = ObjectReader(open_bounded(url, **options))
    try:
        reader.read_ranges(ObjectInfo("chunk", len(DATA), None), [(0, 100)])
    except RemoteError as e:
        return OK if f"{url}/chunk" in str(e) else WRONG_DATA
    return WRONG_DATA


@pytest.mark.parametrize("fault", ["503", "drop", "cut"])
def test_a_failing_server_is_retried_then_an_error(
    s3: tuple[str, dict[str, Any]], s3_server: str, fault: str
) -> None:
    bucket, options = s3
    with FaultProxy(s3_server) as proxy:
        proxy.fault = lambda method, path: fault
        opts = {**options, "endpoint": proxy.endpoint, "retry_config": QUICK_RETRIES}
        assert run_spawned(_read_through_faults, f"s3://{bucket}/d", opts) == OK
        assert proxy.count("GET") > 1  # retried before giving up


def test_a_passing_fault_is_retried_away(s3: tuple[str, dict[str, Any]], s3_server: str) -> None:
    bucket, options = s3
    with FaultProxy(s3_server) as proxy:
        opts = {**options, "endpoint": proxy.endpoint, "retry_config": QUICK_RETRIES}
        reader = ObjectReader(open_bounded(f"s3://{bucket}/d", **opts))
        info = reader.head("chunk")
        failures = iter(["503", "drop"])
        proxy.fault = lambda method, path: next(failures, None) if method == "GET" else None
        assert bytes(reader.read_ranges(info, [(0, 100)])[0]) == DATA[:100]
        assert proxy.count("GET") == 3


def test_a_denied_request_names_the_url() -> None:
    with running_moto(INITIAL_NO_AUTH_ACTION_COUNT="0") as endpoint:  # keys are checked
        reader = ObjectReader(open_bounded("s3://locked-bucket/d", **S3_OPTIONS, endpoint=endpoint))
        with pytest.raises(RemoteError, match=r"s3://locked-bucket/d/meta\.zr: access denied"):
            reader.head("meta.zr")


def test_a_child_forked_after_a_request_refuses_at_once(memory: ObjectReader) -> None:
    info = memory.head("d/chunk")  # obstore's runtime is running in this process now

    def check() -> int:
        try:
            memory.read_ranges(info, [(5, 9)])
        except RemoteError as e:
            return OK if "forked from one that had read object storage" in str(e) else WRONG_DATA
        return WRONG_DATA

    assert run_isolated(check) == OK


def test_the_cache_seam_gets_every_range_read() -> None:
    store = MemoryStore()
    obstore.put(store, "chunk", DATA)
    calls: list[tuple[str, int, list[tuple[int, int]]]] = []

    class Remember:
        """A cache that holds nothing: it records what it was asked and fetches it all."""

        def cached_spans(
            self, key: str, size: int, ranges: Sequence[tuple[int, int]]
        ) -> list[Span] | None:
            return None

        def read_spans(
            self, key: str, size: int, ranges: Sequence[tuple[int, int]], fetch: Any
        ) -> list[Span]:
            calls.append((key, size, list(ranges)))
            return sorted(zip([start for start, _ in ranges], fetch(ranges), strict=True))

    reader = ObjectReader(open_location(store), cache=Remember())
    info = reader.head("chunk")
    assert bytes(reader.read_ranges(info, [(3, 6)])[0]) == DATA[3:6]
    ((key, size, ranges),) = calls
    assert (size, ranges) == (len(DATA), [(3, 6)])
    # the object's version names it; a store passed in is named by its reader alone (its repr
    # is an address a later store may reuse)
    name, etag, length = key.split("\0")
    assert (etag, length) == (info.etag, str(len(DATA)))
    assert name.startswith(repr(store) + "#") and name.endswith("/chunk")
    assert ObjectReader(open_location(store), cache=Remember())._key(info) != key


def test_bounded_options_fill_only_what_the_caller_left() -> None:
    mine = bounded_options("s3://b/p", {"client_options": {"timeout": "2s"}, "retry_config": {}})
    assert mine["client_options"] == {"timeout": "2s", "connect_timeout": "5s"}
    assert mine["retry_config"] == {}
    assert bounded_options("/tmp/x", {}) == {}
    assert "retry_config" in bounded_options("https://example.org/d", {})
