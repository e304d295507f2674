"""Reading objects by byte ranges, bounded and checked: what a dataset in object storage reads
its table, schema and records through.

Every fetch of record bytes goes through one method, `ObjectReader.read_spans`: the ranges
are merged where they lie close (a small gap costs less read through than a second request),
issued side by side with at most ``max_in_flight`` requests in flight, and each answer is
checked against the `ObjectInfo` the object had when it was first seen (``If-Match`` on its
ETag where the store takes it, and the size and ETag every answer carries): a changed object
is a `RemoteChangedError`, never bytes of another version. A local block cache plugs in at
that one seam (`RangeCache`).

Requests run on the reader's own threads through obstore's blocking calls (which release the
GIL). Each request is bounded by the store's client timeout and retry budget
(`bounded_options` sets both where the caller did not), and each call of this module by
``deadline`` seconds in all, so a dead server is an error, never a hang.

obstore's runtime does not survive a fork: once a process has made a request, a child forked
from it that makes one waits for ever (a new store does not help). So a process forked after
a request refuses to make any, with a `RemoteError` saying so at once; open the dataset in
the child instead (a pickled dataset reopens by URL), or start workers with ``spawn``.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from chute._objects._cache import BlockCache
from chute._objects._errors import is_panic, remote_error
from chute._objects._spans import Buffer, Span, cut
from chute._objects._url import Location, check_options, open_location, scheme_of
from chute._util.checks import check_int
from chute.errors import (
    ChuteError,
    RemoteChangedError,
    RemoteError,
    RemoteNotFoundError,
    UnsafeFileError,
)

Range = tuple[int, int]
"""A byte range ``(start, end)`` of an object, ``end`` exclusive."""
Fetch = Callable[[Sequence[Range]], list[Buffer]]
"""What a `RangeCache` calls for the ranges it does not hold: one buffer per range."""

#: Ranges closer than this are read as one request, the bytes between them read through.
MERGE_GAP = 64 << 10
#: No merged request grows past this, so a long run is read as several requests side by side.
MAX_REQUEST = 16 << 20

#: What chute sets on a store the caller configured otherwise: every request ends within
#: ``timeout`` (connecting within ``connect_timeout``), and a failing one is retried with
#: backoff for at most ``retry_timeout`` in all.
CLIENT_DEFAULTS: Mapping[str, str] = {"timeout": "30s", "connect_timeout": "5s"}
RETRY_DEFAULTS: Mapping[str, Any] = {
    "max_retries": 5,
    "retry_timeout": timedelta(seconds=60),
    "backoff": {
        "init_backoff": timedelta(milliseconds=100),
        "max_backoff": timedelta(seconds=5),
        "base": 2,
    },
}
#: The longest one call of `ObjectReader` waits for its requests, in seconds.
DEADLINE = 300.0

if TYPE_CHECKING:
    from obstore import GetOptions

_T = TypeVar("_T")

_used = False  # this process (or the one it was forked from) has made a request
_forked_after_use = False


def _after_fork() -> None:
    global _forked_after_use
    _forked_after_use = _used


os.register_at_fork(after_in_child=_after_fork)


@runtime_checkable
class RangeCache(Protocol):
    """A cache of byte ranges that `ObjectReader.read_spans` reads through when given one.

    ``key`` names one version of one object (its URL, ETag and size, so a changed object is
    another key); ``fetch(ranges)`` reads the ranges the cache does not hold from the store
    (one buffer each). Both methods return the bytes covering ``ranges`` as spans (see
    `chute._objects._spans`); ``cached_spans`` only if it holds them all, else None.

    >>> class NoCache:  # holds nothing: every range is fetched
    ...     def cached_spans(self, key, size, ranges):
    ...         return None
    ...     def read_spans(self, key, size, ranges, fetch):
    ...         return sorted(zip((start for start, _ in ranges), fetch(ranges)))
    >>> isinstance(NoCache(), RangeCache)
    True
    """

    def cached_spans(self, key: str, size: int, ranges: Sequence[Range]) -> list[Span] | None: ...

    def read_spans(
        self, key: str, size: int, ranges: Sequence[Range], fetch: Fetch
    ) -> list[Span]: ...


@dataclass(frozen=True)
class ObjectInfo:
    """One object as first seen: its path in the store, size and ETag (``None`` where the
    store gives none). Every later read of it is checked against these.

    >>> import obstore
    >>> from obstore.store import MemoryStore
    >>> from chute._objects import open_location
    >>> store = MemoryStore()
    >>> _ = obstore.put(store, "a/b", b"hello")
    >>> ObjectReader(open_location(store)).head("a/b").size
    5
    """

    path: str
    size: int
    etag: str | None


def bounded_options(url: object, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with chute's request timeouts and retry budget added where the caller set
    none, for a URL of object storage or a web server (a local path takes no options).

    >>> opts = bounded_options("s3://b/p", {"client_options": {"allow_http": True}})
    >>> sorted(opts["client_options"]), opts["retry_config"]["max_retries"]
    (['allow_http', 'connect_timeout', 'timeout'], 5)
    """
    out = dict(options)
    scheme = scheme_of(url)
    if scheme in (None, "file"):
        return out
    mine = dict(out.get("client_options") or {})
    out["client_options"] = {**CLIENT_DEFAULTS, **_client_env(scheme), **mine}
    if "retry_config" not in out:
        out["retry_config"] = dict(RETRY_DEFAULTS)
    return out


#: obstore's client options, and which of them are flags (the environment spells them
#: ``true``/``false``).
_CLIENT_KEYS = frozenset(
    """allow_http allow_invalid_certificates connect_timeout default_content_type http1_only
    http2_keep_alive_interval http2_keep_alive_timeout http2_keep_alive_while_idle http2_only
    pool_idle_timeout pool_max_idle_per_host proxy_url proxy_ca_certificate proxy_excludes
    randomize_addresses read_timeout timeout user_agent""".split()  # noqa: SIM905
)
_CLIENT_FLAGS = frozenset(
    {"allow_http", "allow_invalid_certificates", "http1_only", "http2_only", "randomize_addresses"}
)
_ENV_PREFIX = {"s3": "AWS_", "gs": "GOOGLE_", "az": "AZURE_"}


def _client_env(scheme: str | None) -> dict[str, Any]:
    """The client options the environment sets for ``scheme`` (``AWS_ALLOW_HTTP`` ...): a
    store given ``client_options`` reads none from there, so chute passes them on."""
    prefix = _ENV_PREFIX.get(scheme or "")
    if prefix is None:
        return {}
    out: dict[str, Any] = {}
    for key in _CLIENT_KEYS:
        value = os.environ.get(prefix + key.upper())
        if value is not None:
            out[key] = (
                value.strip().lower() in ("1", "true", "yes") if key in _CLIENT_FLAGS else value
            )
    return out


def open_bounded(url: Any, **options: Any) -> Location:
    """`open_location` with `bounded_options`: the location a dataset reads through.

    >>> open_bounded("s3://bucket/d", region="eu-west-1", skip_signature=True).scheme
    's3'
    """
    if not isinstance(url, (str, os.PathLike)):
        return open_location(url, **options)
    return open_location(url, **bounded_options(os.fspath(url), options))


READER_OPTIONS = ("max_in_flight", "cache_dir", "cache_bytes")
"""The options every remote dataset takes besides its store's: requests in flight, and the
local block cache (`chute._objects.BlockCache`)."""


def open_reader(
    url: Any, options: Mapping[str, Any], owner: str, keywords: Sequence[str]
) -> ObjectReader:
    """The `ObjectReader` of a remote dataset at ``url``: ``options`` are its store's plus
    `READER_OPTIONS`, all checked (a misspelt one names the nearest of them and
    ``keywords``) before any request. With ``cache_dir``, byte ranges go through a
    `BlockCache` there holding at most ``cache_bytes`` (default: half the free space of its
    disk), shared by every process of the host that reads through the same folder.

    >>> reader = open_reader("s3://b/d", {"skip_signature": True}, "Dataset", ())
    >>> reader.max_in_flight, reader.cache is None
    (16, True)
    """
    store_options = dict(options)
    in_flight = check_int("max_in_flight", store_options.pop("max_in_flight", 16), minimum=1)
    cache_dir = store_options.pop("cache_dir", None)
    cache_bytes = store_options.pop("cache_bytes", None)
    check_options(url, store_options, owner, [*keywords, *READER_OPTIONS])
    cache = None
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)  # the cache's own folder goes inside it
        if cache_bytes is None:
            cache_bytes = shutil.disk_usage(cache_dir).free // 2
        cache = BlockCache(cache_dir, check_int("cache_bytes", cache_bytes, minimum=1))
    elif cache_bytes is not None:
        raise TypeError(f"{owner}: cache_bytes= needs cache_dir= (where the cache lives)")
    try:
        location = open_bounded(url, **store_options)
        return ObjectReader(location, max_in_flight=in_flight, cache=cache, owns_cache=True)
    except BaseException:
        if cache is not None:
            cache.close()
        raise


def merge(ranges: Sequence[Range], gap: int = MERGE_GAP, most: int = MAX_REQUEST) -> list[Range]:
    """The requests that cover ``ranges``: sorted, overlapping ones joined, neighbours less
    than ``gap`` apart joined while the request stays within ``most`` bytes (one range larger
    than that is one request of its own). Empty ranges need no request.

    >>> merge([(100, 200), (0, 50), (60, 70), (5000, 5000)], gap=20)
    [(0, 70), (100, 200)]
    """
    out: list[Range] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start - out[-1][1] < gap and max(end, out[-1][1]) - out[-1][0] <= most:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return out


class ObjectReader:
    """Reads the objects of one `Location`: whole small objects, and byte ranges of large
    ones, with at most ``max_in_flight`` requests in flight; ``cache`` (a `RangeCache`) is
    read through for byte ranges when given.

    >>> import obstore
    >>> from obstore.store import MemoryStore
    >>> from chute._objects import open_location
    >>> store = MemoryStore()
    >>> _ = obstore.put(store, "chunk", bytes(range(100)))
    >>> reader = ObjectReader(open_location(store))
    >>> info = reader.head("chunk")
    >>> [bytes(b) for b in reader.read_ranges(info, [(10, 13), (0, 2)])]
    [b'\\n\\x0b\\x0c', b'\\x00\\x01']
    >>> reader.close()
    """

    def __init__(
        self,
        location: Location,
        *,
        max_in_flight: int = 16,
        cache: RangeCache | None = None,
        owns_cache: bool = False,
        deadline: float = DEADLINE,
    ) -> None:
        if location.store is None:
            raise ValueError(f"{location.url} is a local folder: read it as files")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self._location = location
        self._store = location.store
        # an obstore store passed in is named by its address, which a later store may reuse:
        # its objects' cache keys get a name of this reader's own
        self._name = location.url
        if location.scheme == "memory":
            self._name = f"{location.url}#{uuid.uuid4().hex}"
        self._max_in_flight = max_in_flight
        self._cache = cache
        self._owns_cache = owns_cache  # closed with the reader
        self._deadline = deadline
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._outer: ThreadPoolExecutor | None = None
        self.requests = 0
        """Requests sent so far (heads, gets): how tests see what an open costs."""

    @property
    def location(self) -> Location:
        return self._location

    @property
    def max_in_flight(self) -> int:
        """The most requests this reader has in flight at once."""
        return self._max_in_flight

    def url(self, path: str) -> str:
        """The URL of the object at ``path``, for messages."""
        return f"{self._location.url.rstrip('/')}/{path}"

    # ---- requests ------------------------------------------------------------------

    def head(self, path: str) -> ObjectInfo:
        """The object's size and ETag; a missing object is `RemoteNotFoundError`."""
        info = self.head_all([path])[0]
        assert info is not None
        return info

    def head_all(
        self, paths: Sequence[str], *, missing_ok: bool = False
    ) -> list[ObjectInfo | None]:
        """`head` of each of ``paths``, side by side; with ``missing_ok`` a missing object
        is None."""
        return self._run([partial(self._head, path, missing_ok) for path in paths])

    def read_all(self, path: str, limit: int) -> bytes:
        """The whole object at ``path``, if it holds at most ``limit`` bytes (a larger one is
        an `UnsafeFileError`, its body never read)."""
        found = self._run([partial(self._read_start, path, limit, whole=True, missing_ok=False)])
        assert found[0] is not None
        return found[0][1]

    def read_starts(
        self, items: Sequence[tuple[str, int]], *, missing_ok: bool = False
    ) -> list[tuple[ObjectInfo, bytes] | None]:
        """For each ``(path, n)``, side by side: the object's info and its first ``n`` bytes
        (all of it, if it is shorter). One request each, so the small files a dataset opens
        with cost one round trip together; with ``missing_ok`` a missing object is None."""
        return self.starts_and_heads(items, (), missing_ok=missing_ok)[0]

    def starts_and_heads(
        self, items: Sequence[tuple[str, int]], heads: Sequence[str], *, missing_ok: bool
    ) -> tuple[list[tuple[ObjectInfo, bytes] | None], list[ObjectInfo | None]]:
        """`read_starts` of ``items`` and, in the same round trip, a look at ``heads``:
        their infos, None for one missing or that failed to answer (a guess that may be
        wrong: the caller asks again when it needs the object)."""
        calls: list[Callable[[], Any]] = [
            partial(self._read_start, path, n, whole=False, missing_ok=missing_ok)
            for path, n in items
        ]
        calls += [partial(self._head_or_none, path) for path in heads]
        found = self._run(calls)
        return found[: len(items)], found[len(items) :]

    def read_ranges(self, info: ObjectInfo, ranges: Sequence[Range]) -> list[Buffer]:
        """One buffer per range of ``ranges`` (each within the object): `read_spans` of the
        one object, cut."""
        spans = self.read_spans([(info, ranges)])[0]
        starts = [start for start, _ in spans]
        return [cut(spans, start, end, starts) for start, end in ranges]

    def read_spans(
        self, requests: Sequence[tuple[ObjectInfo, Sequence[Range]]]
    ) -> list[list[Span]]:
        """For each ``(object, ranges)`` of ``requests``: the bytes covering its ranges, as
        spans (see `chute._objects._spans`). The one way this module reads record bytes.

        Without a cache, the ranges of every object are merged into requests that all go out
        side by side, each answer checked against its ``info``; with one, blocks already
        cached are served at once on the calling thread, and the objects with blocks missing
        are read through the cache side by side."""
        for info, ranges in requests:
            for start, end in ranges:
                if not 0 <= start <= end <= info.size:
                    raise ValueError(f"range {(start, end)} is outside {self.url(info.path)}")
        if self._cache is None:
            return self._fetch_all(requests)
        cache = self._cache
        keys = [self._key(info) for info, _ in requests]
        out: list[list[Span] | None] = [
            cache.cached_spans(key, info.size, ranges)
            for key, (info, ranges) in zip(keys, requests, strict=True)
        ]
        missing = [k for k, spans in enumerate(out) if spans is None]

        def through(k: int) -> list[Span]:
            info, ranges = requests[k]
            return cache.read_spans(keys[k], info.size, ranges, lambda r: self._fetch(info, r))

        if len(missing) == 1:
            out[missing[0]] = through(missing[0])
        elif missing:
            with self._lock:
                if self._outer is None:  # waits on requests: never a thread of the request pool
                    self._outer = ThreadPoolExecutor(self._max_in_flight, "chute-objects-wait")
                outer = self._outer
            futures = [outer.submit(through, k) for k in missing]
            wait(futures)
            for k, future in zip(missing, futures, strict=True):
                out[k] = future.result()
        return cast(list[list[Span]], out)

    def cached(self, infos: Sequence[ObjectInfo]) -> list[list[Span]] | None:
        """The spans covering each object of ``infos`` whole, if the cache holds every block
        of them all (nothing is fetched or waited for; a block's pages are checked the first
        time they are read); None when one is missing, or without a cache."""
        if self._cache is None:
            return None
        out = []
        for info in infos:
            spans = self._cache.cached_spans(self._key(info), info.size, [(0, info.size)])
            if spans is None:
                return None
            out.append(spans)
        return out

    def _key(self, info: ObjectInfo) -> str:
        """What names one version of an object in the cache."""
        return f"{self._name.rstrip('/')}/{info.path}\0{info.etag}\0{info.size}"

    def _fetch_all(
        self, requests: Sequence[tuple[ObjectInfo, Sequence[Range]]]
    ) -> list[list[Span]]:
        """The ranges of every object fetched, merged, all requests side by side."""
        merged = [(info, merge(ranges)) for info, ranges in requests]
        calls = [partial(self._get, info, request) for info, asked in merged for request in asked]
        answers = iter(self._run(calls))
        return [[(start, next(answers)) for start, _ in asked] for _, asked in merged]

    def _fetch(self, info: ObjectInfo, ranges: Sequence[Range]) -> list[Buffer]:
        """Fetch ``ranges`` of one object (the cache's blocks): one buffer each."""
        spans = self._fetch_all([(info, ranges)])[0]
        starts = [start for start, _ in spans]
        return [cut(spans, start, end, starts) for start, end in ranges]

    def _head_or_none(self, path: str) -> ObjectInfo | None:
        try:
            return self._head(path, True)
        except RemoteError:
            return None

    def _head(self, path: str, missing_ok: bool = False) -> ObjectInfo | None:
        try:
            meta = self._call(path, lambda: _obstore().head(self._store, path))
        except RemoteNotFoundError:
            if missing_ok:
                return None
            raise
        return ObjectInfo(path, int(meta["size"]), meta.get("e_tag"))

    def _read_start(
        self, path: str, n: int, *, whole: bool, missing_ok: bool
    ) -> tuple[ObjectInfo, bytes] | None:
        """One GET of the object: its first ``n`` bytes; with ``whole``, all of it, or an
        `UnsafeFileError` if it holds more than ``n`` (the body then never read)."""
        try:
            result = self._call(path, lambda: _obstore().get(self._store, path))
        except RemoteNotFoundError:
            if missing_ok:
                return None
            raise
        meta = result.meta
        info = ObjectInfo(path, int(meta["size"]), meta.get("e_tag"))
        if whole and info.size > n:
            raise UnsafeFileError(
                f"{self.url(path)} holds more than the {n} bytes its format allows"
            )
        want = min(n, info.size)
        if info.size <= n:
            data = bytes(self._call(path, result.bytes, body=True))
        else:  # read the start of the body, then drop the rest
            stream = iter(result.stream(min_chunk_size=max(want, 1)))
            parts: list[bytes] = []
            while sum(map(len, parts)) < want:
                part = self._call(path, lambda: next(stream, b""), body=True)
                if not part:
                    break
                parts.append(part)
            data = b"".join(parts)[:want]
        if len(data) != want:
            raise RemoteError(
                f"{self.url(path)}: the answer held {len(data)} bytes where {want} were due "
                "(a truncated answer)"
            )
        return info, data

    def _get(self, info: ObjectInfo, request: Range) -> memoryview:
        options: GetOptions = {"range": request}
        if info.etag is not None:
            options["if_match"] = info.etag
        result = self._call(
            info.path, lambda: _obstore().get(self._store, info.path, options=options)
        )
        meta = result.meta
        etag, size = meta.get("e_tag"), int(meta["size"])
        if size != info.size or (info.etag is not None and etag not in (None, info.etag)):
            raise RemoteChangedError(
                f"{self.url(info.path)} changed since it was opened (now {size} bytes, ETag "
                f"{etag}; it was {info.size} bytes, ETag {info.etag}): reopen the dataset"
            )
        data = memoryview(self._call(info.path, result.bytes, body=True))
        want = request[1] - request[0]
        if len(data) != want or tuple(result.range) != request:
            raise RemoteError(
                f"{self.url(info.path)}: asked for bytes {request[0]}..{request[1]}, the answer "
                f"held {len(data)} bytes at {tuple(result.range)} (a truncated or wrong answer)"
            )
        return data

    def _call(self, path: str, request: Callable[[], _T], *, body: bool = False) -> _T:
        """One request (or, with ``body``, reading the body of one), its failure turned into
        the `RemoteError` naming the URL."""
        if not body:
            with self._lock:
                self.requests += 1
        try:
            return request()
        except ChuteError:
            raise
        except BaseException as e:  # obstore's errors (a panic too), a timeout, a dropped link
            if not isinstance(e, Exception) and not is_panic(e):
                raise
            raise remote_error(self.url(path), e) from None

    def _run(self, calls: Sequence[Callable[[], _T]]) -> list[_T]:
        """Run ``calls`` side by side on the reader's threads and wait for all of them (at
        most the reader's deadline); then raise the first error, in call order."""
        global _used
        if _forked_after_use:
            raise RemoteError(
                f"{self._location.url}: this process was forked from one that had read object "
                "storage, and obstore cannot make requests in such a child: open the dataset "
                "in the child (or start worker processes with 'spawn')"
            )
        _used = True
        pool = self._threads()
        futures = [pool.submit(call) for call in calls]
        _, pending = wait(futures, timeout=self._deadline)
        if pending:
            for future in pending:
                future.cancel()
            raise RemoteError(
                f"{self._location.url}: {len(pending)} requests still unanswered after "
                f"{self._deadline:g} s"
            )
        return [future.result() for future in futures]

    def _threads(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_in_flight, "chute-objects")
            return self._pool

    def close(self, *, wait: bool = True) -> None:
        """Stop the reader's threads (with ``wait``, requests in flight finish first; a
        finalizer must not wait, as it may run on one of them); idempotent."""
        with self._lock:
            pools, self._pool, self._outer = (self._outer, self._pool), None, None
        for pool in pools:
            if pool is not None and not _forked_after_use:
                pool.shutdown(wait=wait)
        cache, self._cache = self._cache, None
        if self._owns_cache and cache is not None:
            cast(Any, cache).close()  # a BlockCache: it leaves the host's shared folder

    @property
    def cache(self) -> RangeCache | None:
        """The range cache reads go through, if any."""
        return self._cache


def _obstore() -> Any:
    """obstore, imported on first use: chute imports without the ``remote`` extra."""
    import obstore

    return obstore
