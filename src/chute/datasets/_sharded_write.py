"""Writing sharded datasets: new ones (optionally a shard per worker process) and appends.

Crash-safety order, for both: every shard is written complete and made durable before the
manifest names it, and the manifest is replaced atomically, last. So at any instant the
directory holds the old manifest (the old dataset, whole) or the new one, plus at most some
records or shards no manifest names yet. An append clears those leftovers of a crashed
writer first: it drops the last shard's records past the manifest's count and removes shard
directories the manifest does not name, then fills the last shard up to ``shard_records``,
then writes new shards, then rewrites the manifest. A write over an existing dataset takes
the writer lock before anything is removed, then removes the old one in `clear`'s order.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import replace
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from chute._util.checks import check_int, check_optional_int
from chute._util.fs import fsync_dir, held_lock, lock_exclusive
from chute._util.orphans import die_with_parent
from chute.datasets._one_store import write_records, write_rows
from chute.datasets._schema import RecordSchema
from chute.datasets._sharded_manifest import (
    LOCK_FILE,
    MANIFEST_FILE,
    Manifest,
    is_sharded,
    next_shard_number,
    read_manifest,
    remove_shard,
    shard_dirs,
    shard_name,
    write_manifest,
)
from chute.errors import ChuteError, StoreChangedError, StoreKindError, UnsafeFileError
from chute.store import RecordStore
from chute.store._internal import (
    GEN_FILE,
    MAX_RECORDS,
    META_FILE,
    bump_generation,
    is_store_file,
)

Options = dict[str, Any]
"""The per-shard writer's keyword arguments (codec, chunk_bytes, dict_size, level ...)."""


def check_sharding(shard_records: int | None, workers: int | None) -> tuple[int | None, int | None]:
    """``(shard_records, workers)`` checked, as ints (a numpy integer would not go into the
    manifest's JSON)."""
    if shard_records is None:
        if workers is not None:
            raise ValueError("workers= writes shards in parallel: it needs shard_records=")
        return None, None
    records = check_int("shard_records", shard_records, minimum=1, maximum=MAX_RECORDS)
    return records, check_optional_int("workers", workers, minimum=1)


def clear(path: Path) -> None:
    """Remove the dataset at ``path`` (sharded, or a single store) to write a new one there.

    The caller holds ``dataset.lock``; a single store's own lock is taken too, before
    anything goes (`StoreLockedError` while it has a writer: then nothing is removed). The
    manifest goes first, so a crash part way leaves an unfinished dataset, never a smaller
    valid one; then the generation in gen.chute rises, so every reader opened before raises
    `StoreChangedError` on its next read instead of mixing old records and new; only then
    are the shards and the store's files removed. gen.chute itself stays, for those readers.
    """
    manifest = path / MANIFEST_FILE
    if manifest.is_dir() and not manifest.is_symlink():
        raise UnsafeFileError(
            f"{manifest} is a folder, not a manifest chute wrote: remove it by hand to write "
            "a dataset here"
        )
    meta_fd = _lock_store(path)
    try:
        manifest.unlink(missing_ok=True)
        bump_generation(path, durable=True)
        for part in shard_dirs(path):
            remove_shard(part)
        for entry in path.iterdir():  # gen.chute stays: readers opened before check it
            if entry.name != GEN_FILE and is_store_file(entry.name) and not entry.is_dir():
                entry.unlink()
    finally:
        if meta_fd >= 0:
            os.close(meta_fd)


def _lock_store(path: Path) -> int:
    """The writer lock of the single store at ``path``, held on the returned descriptor
    (-1 where there is no store)."""
    try:
        fd = os.open(path / META_FILE, os.O_RDWR)
    except FileNotFoundError:
        return -1
    try:
        lock_exclusive(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def occupied(path: Path) -> bool:
    """Whether ``path`` holds anything but a writer's lock and generation files."""
    if not path.exists():
        return False
    return not path.is_dir() or any(e.name not in (LOCK_FILE, GEN_FILE) for e in path.iterdir())


@contextlib.contextmanager
def undone_on_failure(path: Path, mode: str) -> Iterator[None]:
    """Around writing a new dataset at ``path`` (mode ``"w"``, nothing there): if the write
    fails (a record over the cap part way through a generator, say), what it wrote is
    removed under the writer's lock, so the folder is as it was and a rerun needs no
    ``overwrite=True``. An interrupt (Ctrl-C) keeps what was written, which ``mode="a"`` can
    go on from; appends and overwrites keep their own guarantees."""
    fresh = mode == "w" and not occupied(path)
    existed = path.exists()
    try:
        yield
    except Exception:
        if fresh and occupied(path):
            with contextlib.suppress(ChuteError, OSError):
                with writer_lock(path):
                    clear(path)
                    for name in (GEN_FILE, LOCK_FILE):  # nobody read a store that never was
                        (path / name).unlink(missing_ok=True)
                if not existed:
                    path.rmdir()
        raise


@contextlib.contextmanager
def replacing_shards(path: Path, *, overwrite: bool) -> Iterator[None]:
    """Around opening a single store at ``path`` with ``overwrite``: where a sharded dataset
    (or its writer's lock) is, hold ``dataset.lock``, `clear` the folder, and keep the lock
    until the block has opened the new store (which then holds its own)."""
    if not overwrite or not (is_sharded(path) or (path / LOCK_FILE).exists()):
        yield
        return
    with writer_lock(path):
        clear(path)
        yield


def writer_lock(path: Path) -> contextlib.AbstractContextManager[None]:
    """The dataset's one-writer lock (``dataset.lock``), held for the block."""
    return held_lock(path / LOCK_FILE, path)


def _fsync_tree(path: Path) -> None:
    for entry in path.iterdir():
        fd = os.open(entry, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(path)


def _write_shard(kind: str, part: Path, payload: Any, options: Options) -> int:
    """Write one complete shard (a plain store with its schema.json and checksum sidecar),
    durably; returns its record count. Runs in a worker process or inline."""
    if kind == "fixed":
        n = write_rows(part, payload, **options)
    else:
        options = dict(options)
        dtype, item_shape = np.dtype(options.pop("dtype")), tuple(options.pop("item_shape"))
        n = write_records(part, payload, dtype, item_shape, **options)
    _fsync_tree(part)
    return n


def iter_shards(
    path: Path,
    kind: str,
    payloads: Iterable[Any],
    first: int,
    options: Options,
    workers: int | None,
) -> Iterator[tuple[str, int]]:
    """Write ``payloads`` as shards ``first, first + 1 ...`` under ``path``, at most
    ``workers`` at once (a process pool) with a bounded number of payloads in flight; yields
    each shard's name and record count in shard order, as soon as it is written."""
    names = (shard_name(i) for i in range(first, first + (1 << 40)))
    if workers is None or workers == 1:
        for name, payload in zip(names, payloads, strict=False):
            yield name, _write_shard(kind, path / name, payload, options)
        return
    pending: deque[tuple[str, Future[int]]] = deque()
    # fork where there is one: no `if __name__ == "__main__"` guard needed in the caller's
    # script, and the compiled core's thread pool rebuilds itself in a forked child
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    pool: Executor
    parent = os.getpid()  # a parent killed outright takes its workers (and their lock) along
    with ProcessPoolExecutor(workers, mp_context=context, initializer=die_with_parent,
                             initargs=(parent,)) as pool:  # fmt: skip
        for name, payload in zip(names, payloads, strict=False):
            if len(pending) >= 2 * workers:
                head, future = pending.popleft()
                yield head, future.result()
            pending.append((name, pool.submit(_write_shard, kind, path / name, payload, options)))
        while pending:
            head, future = pending.popleft()
            yield head, future.result()


def write_shards(
    path: Path,
    kind: str,
    payloads: Iterable[Any],
    empty: Any,
    *,
    shard_records: int,
    workers: int | None,
    options: Options,
) -> None:
    """A new sharded dataset from ``payloads`` (one per shard; ``empty`` makes the one shard
    of an empty dataset, which keeps the schema): shards first, the manifest last. The
    caller holds the writer lock and has cleared the folder."""
    it = iter(payloads)
    head = next(it, empty)
    shards = tuple(iter_shards(path, kind, chain([head], it), 0, options, workers))
    schema = RecordSchema.read(path / shards[0][0])
    write_manifest(path, Manifest(schema=schema, shard_records=shard_records, shards=shards))


class Rows:
    """Rows ``[start, stop)`` of a source array, read only as a shard writer slices them
    (cast to ``dtype``), so a shard is never held whole. Pickled for a worker process, a
    memory-mapped ``.npy`` travels as its file name and offset; any other source as the rows.
    """

    def __init__(
        self, source: Any, start: int, stop: int, dtype: np.dtype[Any] | None = None
    ) -> None:
        self.source, self.start = source, start
        self.dtype: np.dtype[Any] = np.dtype(dtype if dtype is not None else source.dtype)
        self.shape: tuple[int, ...] = (stop - start, *(int(d) for d in source.shape[1:]))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> npt.NDArray[Any]:
        if isinstance(key, slice):
            a, b, step = key.indices(self.shape[0])
            if step != 1:
                raise IndexError("rows are read in contiguous runs")
            rows = self.source[self.start + a : self.start + max(a, b)]
        else:
            rows = self.source[np.asarray(key, np.int64) + self.start]
        return np.asarray(rows).astype(self.dtype, copy=False)

    def __getstate__(self) -> dict[str, Any]:
        src = self.source
        if (
            isinstance(src, np.memmap)
            and isinstance(src.base, mmap.mmap)
            and src.filename
            and src.flags.c_contiguous
        ):
            row = src.dtype.itemsize * math.prod(src.shape[1:])
            return {
                "file": src.filename,
                "offset": int(src.offset) + self.start * row,
                "source_dtype": src.dtype,
                "shape": self.shape,
                "dtype": self.dtype,
            }
        return {"rows": self[:], "dtype": self.dtype}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "file" in state:
            self.source = np.memmap(
                state["file"], state["source_dtype"], "r", state["offset"], state["shape"]
            )
        else:
            self.source = state["rows"]
        self.start, self.dtype, self.shape = 0, state["dtype"], tuple(self.source.shape)


def fixed_payloads(
    array: Any, shard_records: int, start: int = 0, dtype: np.dtype[Any] | None = None
) -> Iterator[Rows]:
    """Rows ``start:`` of ``array`` in windows of ``shard_records``, one per shard."""
    n = int(array.shape[0])
    for a in range(start, n, shard_records):
        yield Rows(array, a, min(a + shard_records, n), dtype)


def ragged_payloads(
    records: Iterator[Any], shard_records: int, *, lazy: bool = False
) -> Iterator[Iterable[Any]]:
    """The records left in ``records``, ``shard_records`` per shard: as lists (for worker
    processes), or ``lazy`` as one pass each, read while the shard is written."""
    if not lazy:
        while group := list(islice(records, shard_records)):
            yield group
        return
    for first in records:  # the consumer drains each group before the next is made
        yield chain([first], islice(records, shard_records - 1))


def recover(path: Path, manifest: Manifest) -> None:
    """Undo what a crashed writer left beyond the manifest (the caller holds the lock)."""
    named = {name for name, _ in manifest.shards}
    for part in shard_dirs(path):
        if part.name not in named:
            remove_shard(part)
    if not manifest.shards:
        return
    last, want = manifest.shards[-1]
    with RecordStore(path / last, mode="a") as store:
        if len(store) > want:
            store.delete(np.arange(want, len(store)))
            store.compact()
            store.sync()


def append_shards(
    path: Path,
    kind: str,
    expected: Manifest,
    fill: Callable[[RecordStore, int], int],
    rest: Callable[[int], Iterable[Any]],
    *,
    workers: int | None,
) -> None:
    """Under the writer lock: check that the manifest still has ``expected``'s schema and
    shard cap (what ``fill`` and ``rest`` cast and cut the records by, read before the lock),
    clean up, ``fill(last_shard_store, room)`` (returns how many records it added), write
    ``rest(added)`` (a payload per new shard), commit the manifest."""
    with writer_lock(path):
        manifest = read_manifest(path)
        if (manifest.schema, manifest.shard_records) != (expected.schema, expected.shard_records):
            raise StoreChangedError(
                f"{path} changed while this append prepared its records (another writer "
                f"replaced it: {expected.schema.describe()}, codec {expected.schema.codec!r}, "
                f"shard_records={expected.shard_records} became "
                f"{manifest.schema.describe()}, codec {manifest.schema.codec!r}, "
                f"shard_records={manifest.shard_records}); nothing was appended"
            )
        recover(path, manifest)
        options = shard_options(manifest.schema)
        kept, added = manifest.shards, 0
        if kept:  # a manifest of no shards (written by hand) has no last shard to fill
            last, have = kept[-1]
            with RecordStore(path / last, mode="a", codec=options["codec"]) as store:
                added = fill(store, manifest.shard_records - have)
                store.sync()
            kept = (*kept[:-1], (last, have + added))
        first = next_shard_number(name for name, _ in kept)  # names need not run from 0
        new = tuple(iter_shards(path, kind, rest(added), first, options, workers))
        write_manifest(path, replace(manifest, shards=(*kept, *new)))


def shard_options(schema: RecordSchema) -> Options:
    options: Options = {"codec": schema.codec}
    if schema.ragged:
        options["dtype"] = schema.dtype
        options["item_shape"] = schema.item_shape
    return options


def check_appendable(path: Path, ragged: bool) -> Manifest:
    """The manifest of the sharded dataset at ``path``, if it is of the asked kind."""
    manifest = read_manifest(path)
    if manifest.schema.ragged != ragged:
        kind = "variable-length" if manifest.schema.ragged else "fixed-shape"
        raise StoreKindError(f"{path} holds {kind} records: append with the matching function")
    return manifest
