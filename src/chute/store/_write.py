"""The writing side of a store: append, delete, compact, train_dict and fsyncs (opening
for write, lock first, is `chute.store._opening`).

Crash-safety and reader-safety order, for every mutation (the one place it is argued):

* Nothing a reader may have mapped ever shrinks in place (a read of a page past a file's end
  is SIGBUS, which no exception can turn into an error). meta.zr, crc32c.chute and gen.chute
  only grow; a chunk file is cut only by renaming a fresh copy of its prefix over it
  (`replace_with_prefix`), so a reader keeps the old file, whole, until it closes. Bytes past
  the frontier that a crash left are overwritten by the next append, never truncated.
* open for writing: the writer lock (flock on meta.zr) is taken before anything is created,
  reset or removed, so a live writer's store is never touched by a second opener. A directory
  whose meta.zr is missing (or was never initialised) but whose chunk files hold bytes is
  damage: mode "a" refuses it. A new store's header is written last, so a crash while
  creating leaves a store that is still "not yet initialised". crc32c.chute is created
  before gen.chute, so a store with gen.chute (chute wrote it) and no sidecar is damage.
* append: record bytes go past the frontier of the tail chunk (nothing refers to them); a
  new chunk file is fsynced into the directory (durable) before anything names it; then
  checksums and table entries go into slots past ``length`` (nothing reads them); then one
  publish of the header (`store_state`: ``tail_chunk``, then ``tail_offset`` and ``length``
  as one aligned 8-byte store) commits them. A kill before that leaves the store as it was;
  after it, the records are committed; a reader sees the old state or the new. With
  ``durable=True`` each step is also fsynced before the next, so this holds across power loss.
* delete, compact and reset first bump the generation in gen.chute, holding it locked
  exclusively, so every open reader's next read raises `StoreChangedError` (and a reader's
  read that overlapped the change is caught by its check after the read) while no reader can
  open half-way through.
* delete: per target, highest first, the tail entry is copied into the hole and then
  ``length`` drops by one. A kill between the two leaves the tail record present twice and
  the target gone; every record not being deleted stays readable.
* compact: records move down in physical order, each run of bytes once with every entry
  naming it (a delete killed part way names its tail record twice: moved apart, the second
  copy would land on a record not yet moved); records overlapping otherwise are damage,
  refused before anything moves. A record whose new place overlaps its old bytes is first
  copied past the frontier and the table pointed there, so the table never names bytes
  that are being overwritten. Then the header names the packed layout, and only
  then are files cut (by prefix copy) and the chunks past the new tail unlinked; a kill in
  between leaves longer files, cut by the next compaction. Re-running finishes the job.
* reset (mode "w"): the header says zero records before any chunk is replaced or unlinked.
* train_dict: dict.chute (the dictionary's size and CRC-32C) is written before dict.zr, so
  a dict.zr that stands is the one it describes; a dict.chute without dict.zr (a kill in
  between) is removed by the next writer and ignored by readers.
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from chute import _native
from chute._util.fs import (
    fsync_dir,
    pread_exact,
    pwrite_all,
    write_file_atomic,
)
from chute.errors import CorruptStoreError, StoreError
from chute.store import _format as fmt
from chute.store._codec import (
    dict_sum,
    digest_for_reading,
    digest_for_writing,
    train_dictionary,
)
from chute.store._files import NO_STATE, Snapshot, State, StoreFiles
from chute.store._io import replace_with_prefix
from chute.store._opening import MIN_CAPACITY, changing, sums_header

APPEND_SLICE = 64 << 20  # source bytes compressed and written per step
_PAGE = mmap.PAGESIZE


class Writer:
    """Append, delete, compact and train a dictionary on a store opened for writing.

    The caller (`RecordStore`) serialises calls; readers in other threads use `snap`, a new
    `Snapshot` published after each commit.
    """

    def __init__(self, files: StoreFiles, *, durable: bool, threads: int) -> None:
        self.files = files
        self.path = files.path
        self.durable = durable
        self.threads = threads
        self.cdict: Any = None
        self.cdict_level = -1
        self.tail_chunk, self.tail_offset, self.length = files.map_meta()
        files.open_chunks(self.tail_chunk)
        if not (self.path / fmt.DICT_FILE).exists():  # a train_dict that died half way
            (self.path / fmt.DICT_SUM_FILE).unlink(missing_ok=True)
        files.open_dict()
        self._open_sums()
        self._drop_uncommitted_tail()
        self._check_tail_whole()
        self.generation = files.generation()
        self.snap: Snapshot = files.snapshot(self.state, self.generation)

    @property
    def state(self) -> State:
        return self.tail_chunk, self.tail_offset, self.length

    # ---- opening -------------------------------------------------------------------

    def _open_sums(self) -> None:
        files = self.files
        path = self.path / fmt.SUMS_FILE
        if not files.open_sums():  # open_for_writing made one: this one was damaged or lost
            if self.length:
                warnings.warn(
                    f"{path} is damaged or missing; rebuilding it: the records already "
                    "stored have no checksum to verify against",
                    stacklevel=5,
                )
            files.close_sums()
            write_file_atomic(path, sums_header(self.state), durable=self.durable)
            files.open_sums()
        files.map_sums(len(files.table))
        if files.sums_stamp() != self.state:
            self._resync_sums()

    def _resync_sums(self) -> None:
        """After another tool's writes (or a crash mid-commit), forget checksums whose record
        has moved, so that from here on any mismatch means damage."""
        sums, live = self._sums()[: self.length], self.files.table[: self.length]
        moved = (
            (sums["offset"] != live["offset"])
            | (sums["chunk_id"] != live["chunk_id"])
            | (sums["phys_length"] != live["phys_length"])
            | (sums["codec"] != live["codec"])
        )
        sums["valid"][moved] = 0
        self._stamp_sums()

    def _sums(self) -> npt.NDArray[np.void]:
        assert self.files.sums is not None
        return self.files.sums

    def _stamp_sums(self, in_step: bool = True) -> None:
        """Record that the sidecar matches the table (or, before a multi-step edit of both,
        that it may not, so a crash midway reads as 'unchecked' rather than damage)."""
        assert self.files.sums_map is not None
        _native.store_state(self.files.sums_map, *(self.state if in_step else NO_STATE))

    def _drop_uncommitted_tail(self) -> None:
        """Unlink whole chunk files a crashed writer left past the tail. Bytes it left past
        the frontier stay (a reader may map them) until the next append overwrites them."""
        c = self.tail_chunk + 1
        while (self.path / fmt.chunk_file(c)).exists():
            (self.path / fmt.chunk_file(c)).unlink()
            c += 1

    def _check_tail_whole(self) -> None:
        """The tail chunk reaches the frontier: appending to one cut short would fill the
        gap with zeros, and the records that lay there would read as zeros, not damage."""
        size = os.fstat(self.files.chunk_fds[self.tail_chunk]).st_size
        if size < self.tail_offset:
            raise CorruptStoreError(
                f"{self.path}: chunk file {fmt.chunk_file(self.tail_chunk)} is {size} bytes, "
                f"short of the {self.tail_offset} its records reach: it was cut; the store is "
                "damaged and is not written to (verify() names the records lost)"
            )

    # ---- append --------------------------------------------------------------------

    def append_slice(
        self,
        data: npt.NDArray[np.uint8],
        starts: npt.NDArray[np.uint64],
        lens: npt.NDArray[np.uint64],
        codec: fmt.Codec,
        level: int,
    ) -> None:
        n = lens.size
        phys = np.empty(n, np.uint32)
        codecs = np.empty(n, np.uint8)
        crcs = np.empty(n, np.uint32)
        cdict = None
        if codec is fmt.Codec.ZSTD_DICT:
            assert self.files.dictionary is not None
            if self.cdict is None or self.cdict_level != level:
                self.cdict = digest_for_writing(self.files.dictionary, level)
                self.cdict_level = level
            cdict = self.cdict
        packed = _native.compress(
            data, starts, lens, int(codec), level, cdict, self.threads, phys, codecs, crcs
        )
        if packed is None:  # raw records, already end to end in the source: write it as is
            first = int(starts[0]) if n else 0
            view = data[first : first + int(lens.sum())].data
        else:
            view = memoryview(packed)
        chunk_ids, offsets, writes, end = place(phys, self.tail_chunk, self.tail_offset)
        touched = set()
        for chunk, file_offset, a, b in writes:
            fd = self._chunk_fd_for_write(chunk)
            pwrite_all(fd, view[a:b], file_offset)
            touched.add(fd)
        if self.durable:
            for fd in touched:
                os.fdatasync(fd)
        self._ensure_capacity(self.length + n)
        rows = np.zeros(n, fmt.LOC_DTYPE)
        rows["offset"], rows["phys_length"], rows["logic_length"] = offsets, phys, lens
        rows["chunk_id"], rows["codec"] = chunk_ids, codecs
        self.files.table[self.length : self.length + n] = rows
        sums = self._sums()[self.length : self.length + n]
        sums["crc"], sums["offset"], sums["phys_length"] = crcs, offsets, phys
        sums["chunk_id"], sums["codec"], sums["valid"] = chunk_ids, codecs, 1
        self._flush_maps(self.length, n)
        self._commit(end[0], end[1], self.length + n)

    def _chunk_fd_for_write(self, chunk: int) -> int:
        fds = self.files.chunk_fds
        while len(fds) <= chunk:
            c = len(fds)
            if c >= fmt.MAX_CHUNKS:
                raise StoreError(f"the store is full: {fmt.MAX_CHUNKS} chunks of 4 GiB")
            path = self.path / fmt.chunk_file(c)
            fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
            if self.durable:  # the file's name is durable before the header names it
                fsync_dir(self.path)
            self.files.remap_chunks()
        return fds[chunk]

    def _ensure_capacity(self, needed: int) -> None:
        capacity = len(self.files.table)
        if needed <= capacity:
            return
        new = max(needed, capacity * 2, MIN_CAPACITY)
        new = min(max(new, needed), fmt.MAX_RECORDS)
        os.ftruncate(self.files.meta_fd, fmt.meta_size(new))
        self.files.map_meta()
        self.files.map_sums(new)

    def _flush_maps(self, first: int, n: int) -> None:
        if not self.durable:
            return
        files = self.files
        assert files.meta is not None and files.sums_map is not None
        _msync(files.meta, fmt.HEADER_SIZE + first * fmt.LOC_SIZE, n * fmt.LOC_SIZE)
        item = fmt.SUMS_DTYPE.itemsize
        _msync(files.sums_map, fmt.SUMS_HEADER.size + first * item, n * item)

    def _commit(self, tail_chunk: int, tail_offset: int, length: int) -> None:
        """Publish the frontier and the length in one step: the commit point."""
        assert self.files.meta is not None
        _native.store_state(self.files.meta, tail_chunk, tail_offset, length)
        if self.durable:
            self.files.meta.flush(0, _PAGE)
        self.tail_chunk, self.tail_offset, self.length = tail_chunk, tail_offset, length
        self._stamp_sums()
        self.publish()

    def publish(self) -> None:
        """Hand readers of this handle a snapshot of the current state."""
        self.snap = self.files.snapshot(self.state, self.generation)

    # ---- delete --------------------------------------------------------------------

    def delete(self, idx: npt.NDArray[np.int64]) -> None:
        """Remove the records at ``idx`` (unique, in range): the last fills each hole."""
        files = self.files
        assert files.meta is not None
        table, sums = files.table, self._sums()
        with changing(files, self.durable) as self.generation:
            self._stamp_sums(in_step=False)
            for i in idx[::-1].tolist():
                last = self.length - 1
                if i != last:  # each entry whole in one store: a kill never leaves half
                    _put(files.meta, fmt.HEADER_SIZE, i, table[last : last + 1])
                    _put(self._sums_map(), fmt.SUMS_HEADER.size, i, sums[last : last + 1])
                _native.store_state(files.meta, self.tail_chunk, self.tail_offset, last)
                self.length = last
            self._stamp_sums()
            if self.durable:
                self.sync()
            self.publish()

    # ---- dictionary ----------------------------------------------------------------

    def train_dict(self, data: npt.NDArray[np.uint8], lens: npt.NDArray[np.uint64],
                   dict_size: int | None) -> int:  # fmt: skip
        if self.files.dictionary is not None:
            raise StoreError(f"{self.path} already has a dictionary (dict.zr)")
        dictionary = train_dictionary(data, lens, dict_size)
        # its record first: a dict.zr that stands is always the one dict.chute describes
        write_file_atomic(self.path / fmt.DICT_SUM_FILE, dict_sum(dictionary), durable=True)
        write_file_atomic(self.path / fmt.DICT_FILE, dictionary, durable=True)
        self.files.dictionary = dictionary
        self.files.ddict = digest_for_reading(dictionary)
        self.cdict = None
        self.publish()
        return len(dictionary)

    # ---- compact -------------------------------------------------------------------

    def compact(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Pack live records densely from chunk 0; returns the bytes freed. ``progress``
        gets (bytes done, bytes to do) as records move and files are cut.

        Entries naming the same bytes (the record a delete killed part way left twice) move
        as one: the bytes are laid out once and every such entry follows them. Records that
        overlap otherwise are damage, refused before anything moves."""
        before = int(self.snap.limits.sum(dtype=np.uint64))
        live = self.files.table[: self.length]
        order = np.lexsort((live["phys_length"], live["offset"], live["chunk_id"]))
        chunk, off, phys = (live[f][order] for f in ("chunk_id", "offset", "phys_length"))
        fresh = np.ones(order.size, bool)  # the first entry naming its bytes
        fresh[1:] = (chunk[1:] != chunk[:-1]) | (off[1:] != off[:-1]) | (phys[1:] != phys[:-1])
        self._check_disjoint(order[fresh], chunk[fresh], off[fresh], phys[fresh])
        owner = np.cumsum(fresh) - 1  # each entry's run of bytes
        size = phys[fresh]
        new_chunk, new_off, _, end = place(size, 0, 0)
        old_chunk, old_off = chunk[fresh], off[fresh]
        moved = (new_chunk != old_chunk) | (new_off != old_off)
        overlap = moved & (new_chunk == old_chunk) & (new_off.astype(np.int64) + size > old_off)
        with changing(self.files, self.durable) as self.generation:
            bounce = self._reserve_bounce(int(size[overlap].max()) if overlap.any() else 0)
            self._stamp_sums(in_step=False)
            ends = np.zeros(end[0] + 1, np.uint64)
            np.maximum.at(ends, new_chunk, new_off.astype(np.uint64) + size)
            ends[end[0]] = end[1]
            report = _Report(progress, int(size[moved].sum(dtype=np.uint64)) + self._to_cut(ends))
            for k in np.flatnonzero(moved).tolist():
                entries = order[owner == k].tolist()
                self._move(entries, int(new_chunk[k]), int(new_off[k]), bool(overlap[k]), bounce)
                report.advance(int(size[k]))
            self.sync()
            self._commit(end[0], end[1], self.length)
            self._cut_chunks(ends, report)
            self.publish()
            report.finish()
        return before - int(self.snap.limits.sum(dtype=np.uint64))

    def _check_disjoint(
        self,
        records: npt.NDArray[np.intp],
        chunk: npt.NDArray[np.uint16],
        off: npt.NDArray[np.uint32],
        phys: npt.NDArray[np.uint32],
    ) -> None:
        """Distinct runs of bytes of live records, in physical order: each must end before
        the next begins (``records``: an entry naming each)."""
        starts = off.astype(np.int64)
        clash = (chunk[1:] == chunk[:-1]) & (starts[1:] < starts[:-1] + phys[:-1])
        if clash.any():
            k = int(np.flatnonzero(clash)[0])
            raise CorruptStoreError(
                f"{self.path}: records {int(records[k])} and {int(records[k + 1])} overlap in "
                f"chunk {int(chunk[k])}: meta.zr is damaged; nothing was moved",
                int(records[k + 1]),
            )

    def _to_cut(self, ends: npt.NDArray[np.uint64]) -> int:
        """Bytes `_cut_chunks` will copy: the kept part of every chunk longer than it."""
        fds = self.files.chunk_fds[: len(ends)]
        return sum(int(e) for fd, e in zip(fds, ends, strict=True) if os.fstat(fd).st_size > e)

    def _cut_chunks(self, ends: npt.NDArray[np.uint64], report: _Report) -> None:
        """Unlink chunks past the new tail and cut the rest where their records end, each
        by a fresh file renamed over it, never by shrinking a file a reader may map."""
        fds = self.files.chunk_fds
        for c in range(len(fds) - 1, len(ends) - 1, -1):
            os.close(fds.pop())
            (self.path / fmt.chunk_file(c)).unlink()
        for c, fd in enumerate(fds):
            if os.fstat(fd).st_size > int(ends[c]):
                path = self.path / fmt.chunk_file(c)
                fds[c] = replace_with_prefix(path, fd, int(ends[c]), durable=self.durable)
                os.close(fd)
                report.advance(int(ends[c]))
        self.files.remap_chunks()
        fsync_dir(self.path)

    def _reserve_bounce(self, size: int) -> tuple[int, int]:
        """Commit ``size`` spare bytes past the frontier, where a record whose new place
        overlaps its old bytes waits while it moves; a fresh chunk if the last one is full.
        Returns the area's (chunk, offset)."""
        chunk, start = self.tail_chunk, self.tail_offset
        if size == 0:
            return chunk, start
        if start + size > fmt.CHUNK_LIMIT:
            chunk, start = chunk + 1, 0
            self._chunk_fd_for_write(chunk)
        fd = self.files.chunk_fds[chunk]
        if os.fstat(fd).st_size < start + size:
            os.ftruncate(fd, start + size)  # grows only
        self._commit(chunk, start + size, self.length)
        return chunk, start

    def _move(
        self, entries: list[int], chunk: int, offset: int, overlap: bool, bounce: tuple[int, int]
    ) -> None:
        """The bytes ``entries`` name, to ``chunk``/``offset``, each entry pointed there once
        they are written (by way of the bounce area first where the new place overlaps the
        old: no entry ever names bytes being overwritten)."""
        loc = self.files.table[entries[0]]
        size, old_chunk, old_off = int(loc["phys_length"]), int(loc["chunk_id"]), int(loc["offset"])
        fds = self.files.chunk_fds
        try:
            data = pread_exact(fds[old_chunk], size, old_off)
        except EOFError:
            raise CorruptStoreError(
                f"{self.path}: record {entries[0]} lies past the end of chunk {old_chunk}",
                entries[0],
            ) from None
        if overlap:
            pwrite_all(fds[bounce[0]], data, bounce[1])
            for index in entries:
                self._relocate(index, *bounce)
        pwrite_all(fds[chunk], data, offset)
        for index in entries:
            self._relocate(index, chunk, offset)

    def _relocate(self, index: int, chunk: int, offset: int) -> None:
        """Point entry ``index`` (and its checksum's place) at ``chunk``/``offset``, each
        entry whole in one store: a kill between two fields would point at other bytes."""
        sums, table = self._sums(), self.files.table
        assert self.files.meta is not None
        if sums["valid"][index] and _same_place(sums[index], table[index]):
            moved = sums[index : index + 1].copy()
            moved["chunk_id"], moved["offset"] = chunk, offset
            _put(self._sums_map(), fmt.SUMS_HEADER.size, index, moved)
        moved = table[index : index + 1].copy()
        moved["chunk_id"], moved["offset"] = chunk, offset
        _put(self.files.meta, fmt.HEADER_SIZE, index, moved)

    def _sums_map(self) -> mmap.mmap:
        assert self.files.sums_map is not None
        return self.files.sums_map

    # ---- durability ----------------------------------------------------------------

    def sync(self) -> None:
        """Make everything written so far durable (fsync data, table, checksums)."""
        for fd in self.files.chunk_fds:
            os.fdatasync(fd)
        if self.files.meta is not None:
            self.files.meta.flush()
        if self.files.sums_map is not None:
            self.files.sums_map.flush()


def _put(target: mmap.mmap, header: int, index: int, entry: npt.NDArray[np.void]) -> None:
    """Replace entry ``index`` of a table (16-byte entries after ``header`` bytes) by the one
    in ``entry`` (a 1-element array), in a single store instruction."""
    _native.put_entry(target, header + entry.itemsize * index, entry.tobytes())


class _Report:
    """Calls ``progress(done, total)`` about every 4 MiB of work, and once at the end."""

    def __init__(self, progress: Callable[[int, int], None] | None, total: int) -> None:
        self.progress, self.total, self.done, self.last = progress, total, 0, 0

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.progress is not None and self.done - self.last >= 4 << 20:
            self.last = self.done
            self.progress(min(self.done, self.total), self.total)

    def finish(self) -> None:
        if self.progress is not None:
            self.progress(self.total, self.total)


def place(
    phys: npt.NDArray[np.uint32], chunk: int, offset: int
) -> tuple[
    npt.NDArray[np.uint16],
    npt.NDArray[np.uint32],
    list[tuple[int, int, int, int]],
    tuple[int, int],
]:
    """Lay records of the given sizes densely from (chunk, offset), rolling to a fresh chunk
    when one would cross the 4 GiB limit. Returns per-record chunk ids and offsets, the
    contiguous runs to write as (chunk, file offset, start, end) into the packed bytes, and
    the new frontier."""
    n = phys.size
    chunk_ids = np.empty(n, np.uint16)
    offsets = np.empty(n, np.uint32)
    runs: list[tuple[int, int, int, int]] = []
    i = pos = 0
    while i < n:
        cum = np.cumsum(phys[i:], dtype=np.uint64)
        fit = int(np.searchsorted(cum + np.uint64(offset), fmt.CHUNK_LIMIT, side="right"))
        if fit == 0:
            chunk, offset = chunk + 1, 0
            if chunk >= fmt.MAX_CHUNKS:
                raise StoreError(f"the store is full: {fmt.MAX_CHUNKS} chunks of 4 GiB")
            continue
        offsets[i] = offset
        offsets[i + 1 : i + fit] = offset + cum[: fit - 1]
        chunk_ids[i : i + fit] = chunk
        size = int(cum[fit - 1])
        runs.append((chunk, offset, pos, pos + size))
        pos += size
        offset += size
        i += fit
    return chunk_ids, offsets, runs, (chunk, offset)


def _same_place(s: np.void, loc: np.void) -> bool:
    return bool(
        s["chunk_id"] == loc["chunk_id"]
        and s["offset"] == loc["offset"]
        and s["phys_length"] == loc["phys_length"]
        and s["codec"] == loc["codec"]
    )


def _msync(m: mmap.mmap, start: int, size: int) -> None:
    if size <= 0:
        return
    first = start - start % _PAGE
    m.flush(first, start + size - first)
