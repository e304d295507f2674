"""Opening a store for writing: the writer lock first, then creating or resetting its
files; and the generation bump that comes before every change a reader could be in the
middle of. The order each step keeps is argued in `chute.store._write`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from chute import _native
from chute._util.fs import (
    fsync_dir,
    lock_exclusive,
    lock_exclusive_wait,
    pwrite_all,
    unlock,
    write_file_atomic,
)
from chute._util.safe_open import create_regular
from chute.errors import CorruptStoreError, StoreError, StoreKindError
from chute.store import _format as fmt
from chute.store._files import NO_STATE, State, StoreFiles
from chute.store._io import replace_with_empty

MIN_CAPACITY = 1024  # table entries a new store makes room for


def open_for_writing(path: Path, *, reset: bool, durable: bool) -> StoreFiles:
    """Open (creating, or with ``reset`` emptying) a store, holding the writer lock."""
    if path.exists() and not path.is_dir():
        raise StoreError(f"{path} exists and is not a directory")
    if os.path.lexists(path / fmt.SHARDED_MANIFEST):
        raise StoreKindError(
            f"{path} is a sharded dataset, not a store: open it with chute.Dataset or "
            "chute.RaggedDataset, and write over it with write_dataset(..., overwrite=True)"
        )
    meta_path = path / fmt.META_FILE
    if not reset and not meta_path.exists():
        _refuse_orphan_chunks(path, "has no meta.zr")
    path.mkdir(parents=True, exist_ok=True)
    files = StoreFiles(path, writable=True)
    files.meta_fd = create_regular(meta_path, path)  # never a FIFO, nor a link out
    try:
        lock_exclusive(files.meta_fd, path)
        head = os.pread(files.meta_fd, 4, 0)
        fresh = head in (b"", b"\0\0\0\0")  # created, never initialised (or a crash then)
        if fresh and not reset:
            _refuse_orphan_chunks(path, "has an empty meta.zr")
        sums = path / fmt.SUMS_FILE
        if not os.path.lexists(sums) and not os.path.lexists(path / fmt.GEN_FILE):
            # a new store, or one only another tool wrote: the sidecar comes first, so that
            # gen.chute (which says chute wrote the store) never stands without it
            write_file_atomic(sums, sums_header(NO_STATE), durable=durable)
        _open_gen(files, durable)
        if reset or fresh:
            _reset(files, durable)
    except BaseException:
        files.close()
        raise
    return files


def _open_gen(files: StoreFiles, durable: bool) -> None:
    """Map gen.chute for writing, creating it (generation 0) if it is missing or unsound."""
    gen = fmt.GEN_HEADER.pack(fmt.GEN_MAGIC, fmt.GEN_VERSION, 0)
    _ensure_side_file(files.path, fmt.GEN_FILE, gen, durable)
    if not files.open_gen():
        raise CorruptStoreError(f"{files.path}/{fmt.GEN_FILE} could not be created")


def bump_generation(path: Path, *, durable: bool) -> None:
    """Raise the generation in ``path``/gen.chute (creating it if missing), so every reader
    that opened what was at ``path`` before raises `StoreChangedError` on its next read.

    A sharded dataset's overwrite calls it for the folder (its readers check this file as a
    store's readers check their own); the caller holds the folder's writer lock.
    """
    files = StoreFiles(path, writable=True)
    try:
        _open_gen(files, durable)
        with changing(files, durable):
            pass
    finally:
        files.close()


def _refuse_orphan_chunks(path: Path, why: str) -> None:
    """Refuse to (re)create a store over chunk files that hold bytes: that would lose them."""
    if not path.is_dir():
        return
    for entry in path.iterdir():
        stem = entry.name[:-3] if entry.name.endswith(".zr") else ""
        if stem.isdigit() and entry.stat().st_size > 0:
            raise CorruptStoreError(
                f"{path} {why} but {entry.name} holds {entry.stat().st_size} bytes: the "
                "table is lost or damaged; opening for append would destroy the records "
                "(open with mode='w' to start over deliberately)"
            )


def _ensure_side_file(path: Path, name: str, content: bytes, durable: bool) -> None:
    """Create one of chute's side files if it is missing or too short to be sound."""
    file = path / name
    with contextlib.suppress(FileNotFoundError):
        if file.stat().st_size >= len(content) and file.read_bytes()[:4] == content[:4]:
            return
    write_file_atomic(file, content, durable=durable)


@contextlib.contextmanager
def changing(files: StoreFiles, durable: bool) -> Iterator[int]:
    """Bump the generation, holding gen.chute exclusively while a delete, compaction or
    reset runs: open readers notice on their next read, new readers wait for the end."""
    assert files.gen_map is not None
    lock_exclusive_wait(files.gen_fd)
    try:
        generation = _native.load_generation(files.gen_map) + 1
        _native.store_generation(files.gen_map, generation)
        if durable:
            files.gen_map.flush()
        yield generation
    finally:
        unlock(files.gen_fd)


def _reset(files: StoreFiles, durable: bool) -> None:
    """Empty the store in place: header first, then chunks (replaced, never shrunk)."""
    path = files.path
    with changing(files, durable):
        if os.fstat(files.meta_fd).st_size < fmt.meta_size(MIN_CAPACITY):
            os.ftruncate(files.meta_fd, fmt.meta_size(MIN_CAPACITY))
        pwrite_all(files.meta_fd, fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, 0, 0, 0), 0)
        if durable:
            os.fsync(files.meta_fd)
        _reset_sums(path / fmt.SUMS_FILE, durable)
        for name in (fmt.DICT_FILE, fmt.DICT_SUM_FILE):  # the dictionary, then its record
            (path / name).unlink(missing_ok=True)
        first = path / fmt.chunk_file(0)
        if not first.exists() or first.stat().st_size:
            replace_with_empty(first, durable=durable)
        c = 1
        while (path / fmt.chunk_file(c)).exists():
            (path / fmt.chunk_file(c)).unlink()
            c += 1
        if durable:
            fsync_dir(path)


def _reset_sums(sums: Path, durable: bool) -> None:
    """No entry is in use after a reset: say the sidecar is in step with that, or, if it is
    damaged or missing (it is about nothing now), put a fresh one in its place."""
    head = b""
    with contextlib.suppress(FileNotFoundError):
        head = sums.read_bytes()[: fmt.SUMS_HEADER.size]
    if head[:6] == sums_header(NO_STATE)[:6] and len(head) == fmt.SUMS_HEADER.size:
        with open(sums, "r+b") as f:
            f.seek(fmt.STATE_OFFSET)
            f.write(fmt.STATE.pack(0, 0, 0))
    else:
        write_file_atomic(sums, sums_header((0, 0, 0)), durable=durable)


def sums_header(state: State) -> bytes:
    return fmt.SUMS_HEADER.pack(fmt.SUMS_MAGIC, fmt.SUMS_VERSION, *state)
