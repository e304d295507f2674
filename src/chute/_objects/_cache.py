"""A bounded local disk cache of remote objects' bytes, in fixed-size blocks, shared by the
processes of a host: each block is fetched once per host while it is cached.

The cache lives in its own folder, ``cache_dir/chute-blocks-<block_bytes>/``, never in
``cache_dir`` itself, so nothing already there (a dataset, the only copy of anything) is
ever evicted or removed. Block ``i`` of an object is bytes ``[i * block_bytes, (i + 1) *
block_bytes)``, the last cut at the object's size; the object is named by a *key* (its URL,
ETag and size, so a changed object never hits the old one's blocks), and the block's file
by the key's SHA-256 and ``i``.

One mechanism with `chute.insitu`'s slab pool: the folder itself (members and the last one
out removing it, the identity check and refusing a folder that is a link or holds files
chute did not write, the byte budget with least-recently-used eviction, reservations
published by rename, dead writers' leftovers reclaimed) is `chute._util.shared_folder`,
which both use unchanged; its docstring argues the crash safety. What is the cache's own:

- A block file is a header (magic, a CRC-32C of the rest of the header, the key's whole
  SHA-256, the block's index and length, then a CRC-32C of each 64 KiB page of the block)
  and the block's bytes. A read checks the header and the pages it serves, so a small
  range costs a page, not the whole block. A file whose header names another block, whose
  size or a CRC of what is read does not match, or that is not a regular file inside the
  folder is damage: it is removed under the block's lock and the block fetched again,
  never served (a damaged page no read touched is caught when one does).
- Locks are ``flock`` on one of 4096 *stripe* lock files (a block's stripe follows from its
  key and index, so neighbouring blocks of an object fall on different stripes); a bounded
  number of lock files however many blocks pass through. A process never waits while it
  holds a lock: it fetches the blocks it could lock in one call, publishes them, releases
  them, and only then polls for the blocks other processes hold. So processes cannot
  deadlock, and a fetcher that dies drops its locks with its descriptors: a waiter then
  takes them and fetches the blocks itself.
- A read keeps every block it needs in memory until it returns, so it never waits for room
  in the budget: a block evicted meanwhile (or never published, the budget taken by other
  writers) is still served from that copy. A batch whose blocks cannot all be cached at
  once would only thrash, so `check_working_set` refuses it up front.

Reads are O(blocks): a cached block is one ``open`` by name, a read of its header and of
the pages wanted, their CRCs and a ``utime`` (the eviction order); the folder is listed
only when a publish finds the budget full.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
import resource
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from chute._native import crc32c
from chute._objects._spans import Span, cut
from chute._util.checks import check_int
from chute._util.closing import Closing
from chute._util.fs import pread_exact
from chute._util.shared_folder import SharedFolder
from chute.errors import CacheTooSmallError, RemoteChangedError, StoreClosedError, UnsafeFileError

__all__ = ["MOST_MAPPED", "PAGE_BYTES", "BlockCache", "file_bytes"]

# magic, CRC-32C of the header after it, pad, key SHA-256, index, length; then one CRC-32C
# (u32, little-endian) per page of the block
_HEAD = struct.Struct("<8sI4x32sQQ")
_MAGIC = b"CHUTEBK1"
_CRC_END = 12  # the header's CRC covers it from here on
PAGE_BYTES = 64 << 10
_TOUCH_S = 1.0  # a mapped block is read from its mapping, its file touched at most this often
"""The unit of the checksums in a block file: a read checks the pages it serves."""
_STRIPES = 4096


def _most_mapped() -> int:
    """Block files a process keeps mapped (their pages checked) at most: 1024, or a quarter
    of the files it may open, as each mapping holds a descriptor (Python's ``mmap`` does)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1024 if soft == resource.RLIM_INFINITY else max(16, min(1024, soft // 4))


MOST_MAPPED = _most_mapped()
_POLL_FIRST, _POLL_MAX = 0.0005, 0.02  # seconds between looks at blocks others fetch

Fetch = Callable[[Sequence[tuple[int, int]]], Sequence[bytes | memoryview]]
"""Fetches byte ranges ``[start, end)`` of one object, in one call: their bytes, in order."""


class _Damaged(Exception):
    """A block file that is not what its name promises."""


def _header_bytes(length: int) -> int:
    return _HEAD.size + 4 * -(-length // PAGE_BYTES)


def file_bytes(length: int) -> int:
    """Bytes on disk of the file of a block of ``length`` bytes (its header, then the bytes):
    what the budget counts.

    >>> file_bytes(4 << 20) - (4 << 20)
    320
    """
    return _header_bytes(length) + length


class BlockCache(Closing):
    """Byte ranges of remote objects, cached on local disk in blocks of ``block_bytes``
    within ``cache_bytes`` (block files with their headers), shared by the processes of a
    host that use the same ``cache_dir`` and block size.

    >>> import tempfile
    >>> data = bytes(range(256)) * 40
    >>> calls = []
    >>> def fetch(ranges):
    ...     calls.append(list(ranges))
    ...     return [data[start:end] for start, end in ranges]
    >>> cache = BlockCache(tempfile.mkdtemp(), 1 << 20, block_bytes=4096)
    >>> key = "s3://bucket/d/x.zr etag-1 10240"
    >>> got = cache.read_ranges(key, len(data), [(10, 20), (5000, 9000)], fetch)
    >>> got == [data[10:20], data[5000:9000]], calls
    (True, [[(0, 4096), (4096, 8192), (8192, 10240)]])
    >>> cache.read_ranges(key, len(data), [(0, 10240)], fetch) == [data], len(calls)
    (True, 1)
    >>> cache.stats()["hits"], cache.stats()["misses"]
    (3, 3)
    >>> cache.close()
    """

    def __init__(
        self, cache_dir: str | os.PathLike[str], cache_bytes: int, *, block_bytes: int = 4 << 20
    ) -> None:
        self.block_bytes = check_int("block_bytes", block_bytes, minimum=1)
        self.cache_bytes = check_int("cache_bytes", cache_bytes)
        if self.cache_bytes < file_bytes(self.block_bytes):
            raise CacheTooSmallError(
                f"cache_bytes={self.cache_bytes} cannot hold one block of block_bytes="
                f"{self.block_bytes} (a block file is {file_bytes(self.block_bytes)} bytes "
                "with its header); raise cache_bytes or lower block_bytes"
            )
        folder = os.fspath(cache_dir)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"cache_dir {folder!r} is not a directory")
        # a new file format takes a new folder name: a folder of another identity is refused
        identity = f"chute block cache, format 1, blocks of {self.block_bytes} bytes"
        self.root = os.path.join(folder, f"chute-blocks-{self.block_bytes}")
        self._folder = SharedFolder(
            self.root,
            hashlib.sha256(identity.encode()).hexdigest().encode(),
            self.cache_bytes,
            suffix=".blk",
            holds="something other than chute's blocks of this size",
        )
        self._closed = False
        self._maps: OrderedDict[str, _Mapped] = OrderedDict()  # this process's, newest last
        self._maps_lock = threading.Lock()
        names = ("hits", "misses", "fetched_bytes", "published", "discarded")
        self._counts = dict.fromkeys(names, 0)
        self._count_lock = threading.Lock()

    # -- the interface -----------------------------------------------------------------

    def read_ranges(
        self, key: str, size: int, ranges: Sequence[tuple[int, int]], fetch: Fetch
    ) -> list[bytes]:
        """Bytes ``[start, end)`` of the object ``key`` (of ``size`` bytes) for each range,
        copied out of `read_spans`."""
        spans = self.read_spans(key, size, ranges, fetch)
        return [bytes(cut(spans, start, end)) for start, end in ranges]

    def read_spans(
        self, key: str, size: int, ranges: Sequence[tuple[int, int]], fetch: Fetch
    ) -> list[Span]:
        """The bytes of the object ``key`` (of ``size`` bytes) that cover ``ranges``: the
        parts of its blocks they touch, as spans (see `chute._objects._spans`).

        Blocks not cached are fetched with one call of ``fetch`` (block-aligned ranges, the
        last block cut at ``size``); blocks another process is fetching are waited for, and
        fetched in one more call only if that process gives up on them (it died, or could
        not publish them within the budget). A fetch that returns other lengths than asked
        is a `RemoteChangedError` naming ``key``; nothing of it is cached. The spans are
        views of the block files' mappings (the pages wanted of a cached block, checked) or of
        the fetched bytes, so they stay valid whatever is evicted meanwhile.
        """
        reading = self._reading(key, size, ranges, fetch)
        return reading.spans(reading.blocks())

    def cached_spans(
        self, key: str, size: int, ranges: Sequence[tuple[int, int]]
    ) -> list[Span] | None:
        """`read_spans` if every block the ranges touch is cached (no lock taken, nothing
        fetched or waited for), else None: the fast path of a warm cache."""
        reading = self._reading(key, size, ranges, None)
        return reading.spans(reading.got) if reading.look() else None

    def _reading(
        self, key: str, size: int, ranges: Sequence[tuple[int, int]], fetch: Fetch | None
    ) -> _Reading:
        if self._closed:
            raise StoreClosedError(f"the block cache at {self.root} is closed")
        size = check_int("size", size)
        step = self.block_bytes
        spans: dict[int, tuple[int, int]] = {}  # block -> the part of it the ranges need
        for start, end in ranges:
            if not 0 <= start <= end <= size:
                raise ValueError(f"range [{start}, {end}) is not within the {size} bytes of {key}")
            for i in range(start // step, -(-end // step) if start < end else 0):
                lo, hi = max(start - i * step, 0), min(end - i * step, step)
                was = spans.get(i)
                spans[i] = (lo, hi) if was is None else (min(was[0], lo), max(was[1], hi))
        return _Reading(self, key, size, fetch, spans)

    def check_working_set(self, nbytes: int) -> None:
        """Raise `CacheTooSmallError` naming both sizes if a batch that needs ``nbytes``
        at once (rounded up to whole blocks, with their headers) exceeds ``cache_bytes``:
        its blocks would evict each other before it is done."""
        nbytes = check_int("nbytes", nbytes)
        blocks = -(-nbytes // self.block_bytes)
        need = blocks * file_bytes(self.block_bytes)
        if need > self.cache_bytes:
            raise CacheTooSmallError(
                f"a batch needs {nbytes} bytes at once, {blocks} blocks of {self.block_bytes} "
                f"bytes ({need} bytes on disk), more than cache_bytes={self.cache_bytes}; "
                f"raise cache_bytes to at least {need}, or read smaller batches"
            )

    def stats(self) -> dict[str, int]:
        """This process's counts: blocks served from the cache (``hits``) and fetched
        (``misses``), bytes fetched, blocks published, files evicted for room, damaged
        block files discarded."""
        with self._count_lock:
            out = dict(self._counts)
        out["evictions"] = self._folder.evicted
        return out

    def close(self) -> None:
        """Leave the cache; the last process to leave removes its folder."""
        self._closed = True
        self._folder.close()

    # -- blocks ------------------------------------------------------------------------

    def _count(self, **more: int) -> None:
        with self._count_lock:
            for name, n in more.items():
                self._counts[name] += n

    def _load(
        self,
        name: str,
        digest: bytes,
        index: int,
        length: int,
        span: tuple[int, int],
        *,
        held: bool,
    ) -> tuple[int, memoryview] | None:
        """The part ``span`` of the published block (widened to whole pages), checked, with
        the offset in the block where it starts; ``None`` if absent or damaged. With
        ``held`` (the caller holds its lock, so nobody publishes it meanwhile) a damaged
        file is removed, to be fetched again."""
        with self._maps_lock:
            mapped = self._maps.get(name)
        if mapped is not None and time.monotonic() - mapped.touched < _TOUCH_S:
            try:  # a block this process mapped and checked: its bytes cannot have changed
                part = mapped.read(span)
            except _Damaged:
                pass  # looked at again through its file below
            else:
                self._count(hits=1)
                return part
        try:
            fd = self._folder.open(name)
        except FileNotFoundError:
            return None
        except UnsafeFileError:
            self._damaged(name, held)
            return None
        try:
            mapped = self._mapped(name, fd, digest, index, length)
            part = mapped.read(span)
            self._folder.touch(fd)  # most recently used
            mapped.touched = time.monotonic()
        except _Damaged:
            with self._maps_lock:
                self._maps.pop(name, None)
            self._damaged(name, held)
            return None
        finally:
            os.close(fd)
        self._count(hits=1)
        return part

    def _mapped(self, name: str, fd: int, digest: bytes, index: int, length: int) -> _Mapped:
        """The block file open at ``fd``, mapped: the mapping this process made of that same
        file before (its pages checked once each), or a new one once its header checks."""
        ino = os.fstat(fd).st_ino
        with self._maps_lock:
            mapped = self._maps.get(name)
            if mapped is not None and mapped.ino == ino:
                self._maps.move_to_end(name)
                return mapped
        mapped = _Mapped(fd, ino, digest, index, length)
        with self._maps_lock:
            self._maps[name] = mapped
            while len(self._maps) > MOST_MAPPED:  # a dropped map goes when its last view does
                self._maps.popitem(last=False)
        return mapped

    def _damaged(self, name: str, held: bool) -> None:
        if held:
            self._folder.discard(name)
            self._count(discarded=1)

    def _publish(self, name: str, digest: bytes, index: int, data: memoryview) -> None:
        n = data.nbytes
        pages = [crc32c(data[p : p + PAGE_BYTES]) for p in range(0, n, PAGE_BYTES)]
        rest = _HEAD.pack(_MAGIC, 0, digest, index, n)[_CRC_END:]
        rest += struct.pack(f"<{len(pages)}I", *pages)
        head = _MAGIC + crc32c(rest).to_bytes(4, "little") + rest
        if self._folder.publish(name, [head, data]):
            self._count(published=1)


@functools.lru_cache(maxsize=4096)
def _names(key: str) -> tuple[bytes, str, int]:
    """The key's SHA-256, the prefix of its block files' names, and its first stripe."""
    digest = hashlib.sha256(key.encode()).digest()
    return digest, digest.hex()[:32], int.from_bytes(digest[:4], "little")


class _Reading:
    """One `BlockCache.read_ranges` call's blocks of one object: what it holds in memory,
    and the rounds of locking, fetching and waiting that fill it."""

    def __init__(
        self,
        cache: BlockCache,
        key: str,
        size: int,
        fetch: Fetch | None,
        spans: dict[int, tuple[int, int]],
    ) -> None:
        self.cache, self.key, self.size, self.fetch = cache, key, size, fetch
        self.digest, self.prefix, self.stripe_base = _names(key)
        self.wanted = spans  # block -> the part ``[lo, hi)`` of it the ranges need
        self.got: dict[int, tuple[int, memoryview]] = {}

    def look(self) -> bool:
        """Take the blocks already cached, without locks (the common case); True if that
        was all of them."""
        return all([self._look(i, held=False) for i in sorted(self.wanted)])

    def spans(self, got: dict[int, tuple[int, memoryview]]) -> list[Span]:
        """The parts of the blocks in ``got`` as spans of the object, in order."""
        step = self.cache.block_bytes
        return [(i * step + got[i][0], got[i][1]) for i in sorted(got)]

    def blocks(self) -> dict[int, tuple[int, memoryview]]:
        """The parts of the blocks wanted, each as the offset in its block where it starts
        and its bytes (a fetched block whole), fetching and waiting as needed."""
        self.look()
        pending = [i for i in sorted(self.wanted) if i not in self.got]
        delay = _POLL_FIRST
        while pending:
            waiting = self._round(pending)
            if len(waiting) == len(pending):  # every one held elsewhere: look again later
                time.sleep(delay)
                delay = min(2 * delay, _POLL_MAX)
            else:
                delay = _POLL_FIRST
            pending = waiting
        return self.got

    def _name(self, i: int) -> str:
        return f"{self.prefix}-{i}"

    def _range(self, i: int) -> tuple[int, int]:
        step = self.cache.block_bytes
        return i * step, min((i + 1) * step, self.size)

    def _look(self, i: int, *, held: bool) -> bool:
        start, end = self._range(i)
        part = self.cache._load(
            self._name(i), self.digest, i, end - start, self.wanted[i], held=held
        )
        if part is not None:
            self.got[i] = part
        return part is not None

    def _round(self, pending: list[int]) -> list[int]:
        """Lock the blocks nobody else holds, take those published meanwhile, fetch the
        rest in one call and publish them, release; return the blocks others hold."""
        locks: dict[str, int] = {}
        busy: set[str] = set()
        mine: list[int] = []
        waiting: list[int] = []
        try:
            for i in pending:
                stripe = f"stripe-{(self.stripe_base + i) % _STRIPES:03x}"
                if stripe not in locks:
                    fd = None if stripe in busy else self.cache._folder.try_lock(stripe)
                    if fd is None:
                        busy.add(stripe)
                        waiting.append(i)
                        continue
                    locks[stripe] = fd
                if not self._look(i, held=True):
                    mine.append(i)
            if mine:
                self._fetch(mine)
        finally:
            for fd in locks.values():
                SharedFolder.unlock(fd)
        return waiting

    def _fetch(self, mine: list[int]) -> None:
        assert self.fetch is not None, "a look-only reading fetches nothing"
        ranges = [self._range(i) for i in mine]
        parts = self.fetch(ranges)
        if len(parts) != len(ranges):
            raise RemoteChangedError(
                f"{self.key}: {len(ranges)} ranges were asked for, {len(parts)} came back"
            )
        views = []
        for (start, end), part in zip(ranges, parts, strict=True):
            view = memoryview(part)
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            if view.nbytes != end - start:
                raise RemoteChangedError(
                    f"{self.key}: bytes [{start}, {end}) came back as {view.nbytes} bytes "
                    f"(the object is no longer the {self.size} bytes it was opened with)"
                )
            views.append(view)
        self.cache._count(misses=len(mine), fetched_bytes=sum(v.nbytes for v in views))
        for i, view in zip(mine, views, strict=True):
            self.got[i] = (0, view)
            self.cache._publish(self._name(i), self.digest, i, view)


class _Mapped:
    """A published block file mapped read-only, its header checked; each 64 KiB page is
    checked against its CRC-32C the first time a read covers it, and served from the mapping
    after that. Published files are never written in place (a new version is a new file,
    renamed over it), so a page checked once stays what was checked."""

    def __init__(self, fd: int, ino: int, digest: bytes, index: int, length: int) -> None:
        head_bytes = _header_bytes(length)
        if os.fstat(fd).st_size != head_bytes + length:
            raise _Damaged("size")
        try:
            head = pread_exact(fd, head_bytes, 0)
        except EOFError:
            raise _Damaged("cut short") from None
        magic, crc, held_digest, held_index, held_length = _HEAD.unpack_from(head)
        if (magic, held_digest, held_index, held_length) != (_MAGIC, digest, index, length):
            raise _Damaged("another block's file")
        if crc32c(memoryview(head)[_CRC_END:]) != crc:
            raise _Damaged("header checksum")
        npages = -(-length // PAGE_BYTES)
        self.ino, self.length, self.head_bytes = ino, length, head_bytes
        self.sums = struct.unpack_from(f"<{npages}I", head, _HEAD.size)
        self.checked = bytearray(npages)
        self.touched = 0.0  # when this process last marked the file most recently used
        self.view = memoryview(mmap.mmap(fd, head_bytes + length, prot=mmap.PROT_READ))

    def read(self, span: tuple[int, int]) -> tuple[int, memoryview]:
        """The pages covering ``span`` (checked, once each) and where in the block they start."""
        first, last = span[0] // PAGE_BYTES, (span[1] - 1) // PAGE_BYTES
        start, end = first * PAGE_BYTES, min((last + 1) * PAGE_BYTES, self.length)
        view = self.view[self.head_bytes + start : self.head_bytes + end]
        for page in range(first, last + 1):
            if not self.checked[page]:
                k = page - first
                if crc32c(view[k * PAGE_BYTES : (k + 1) * PAGE_BYTES]) != self.sums[page]:
                    raise _Damaged("page checksum")
                self.checked[page] = 1
        return start, view
