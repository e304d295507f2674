"""The on-disk pool (``cache_dir=``) trusts nothing on disk: a changed archive gets a new
pool, a damaged slab file is decoded again, dead writers' reservations are reclaimed and a
file-size limit only stops publishing. Whatever can crash or hang runs in a child process."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from chute.errors import UnsafeFileError
from chute.insitu import InSituDataset, open_geometries, split_by_chunk

from .conftest import CHUNK, N, write_archive, x_values
from .test_shared_pool import on_disk, slab_count, tight_member

HEADER = 256


def member(archive: Path, cache: Path) -> InSituDataset:
    m = split_by_chunk(open_geometries(archive)["x"])
    return InSituDataset(archive, m, batch_size=8, cache_dir=cache, cache_budget_bytes=10**6)


def write_negated(root: Path) -> None:
    """An archive of the same geometry as ``write_archive``'s (for ``x`` and ``y``) whose
    values are negated: a reader served the other archive's slabs is caught at once."""
    g = zarr.open_group(str(root), mode="w")
    x = g.create_array("x", shape=(N, 3, 5), chunks=(CHUNK, 3, 5), dtype="f4")
    x[:] = -x_values(np.arange(N))
    y = g.create_array("y", shape=(N,), chunks=(CHUNK,), dtype="i8")
    y[:] = -np.arange(N)


def read_all(ds: InSituDataset, sign: int = 1) -> None:
    """Read every batch of ``ds.all``, checking each value (negated for ``sign=-1``)."""
    seen = []
    for b in ds.all:
        idx = b["sample_indices"]
        np.testing.assert_array_equal(b["x"], sign * x_values(idx))
        np.testing.assert_array_equal(b["y"], sign * idx)
        seen.extend(idx.tolist())
    assert sorted(seen) == list(range(N))


def slab_file(cache: Path, variable: str, chunk: int) -> Path:
    (pool,) = os.listdir(cache)
    name = hashlib.sha256(variable.encode()).hexdigest()[:16]
    return cache / pool / f"{name}-{chunk}.slab"


def replace_with(path: Path, raw: bytes) -> None:
    """Put ``raw`` in place of ``path`` as a new file: whoever maps the old one keeps it."""
    new = path.with_name(path.name + ".new")
    new.write_bytes(raw)
    os.replace(new, path)


JSON_START = len(b"CHUTESL2") + 4  # magic, then the CRC-32C


def edit_header(
    path: Path, change: Callable[[dict[str, object]], None], keep: int | None = None
) -> None:
    """Rewrite the JSON of a slab file's header by ``change`` (its first ``keep`` bytes)."""
    raw = path.read_bytes()
    head = raw[:HEADER]
    # the JSON follows the magic and the CRC-32C, whose 4 bytes may happen to hold a brace
    start, end = head.index(b"{", JSON_START), head.rindex(b"}") + 1
    meta = json.loads(head[start:end])
    change(meta)
    text = json.dumps(meta).encode()
    assert start + len(text) <= HEADER
    replace_with(path, (head[:start] + text.ljust(HEADER - start, b" ") + raw[HEADER:])[:keep])


# -- an archive that changes gets another pool (item 5) --------------------------------


@pytest.mark.parametrize("how", ["rewritten in place", "link moved"])
def test_a_changed_archive_is_not_served_from_the_old_pool(tmp_path: Path, how: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    if how == "rewritten in place":
        path = tmp_path / "data.zarr"
        write_archive(str(path))
    else:
        write_archive(str(tmp_path / "a.zarr"))
        write_negated(tmp_path / "b.zarr")
        path = tmp_path / "latest.zarr"
        path.symlink_to(tmp_path / "a.zarr")
    with member(path, cache) as old:
        read_all(old)  # every slab of the old archive published, the pool kept open
        if how == "rewritten in place":
            write_negated(path)
        else:
            link = tmp_path / "next.zarr"
            link.symlink_to(tmp_path / "b.zarr")
            os.replace(link, path)
        with member(path, cache) as new:
            read_all(new, sign=-1)
            assert new.stats()["shared_hits"] == 0
            assert len(os.listdir(cache)) == 2  # one pool per archive
        read_all(old)  # the old member still reads the archive it opened, from its pool


def test_a_pool_folder_of_another_archive_is_refused(archive: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    with member(archive, cache):
        (pool,) = os.listdir(cache)
        replace_with(cache / pool / "identity", hashlib.sha256(b"another").hexdigest().encode())
        with pytest.raises(UnsafeFileError, match="another archive"):
            member(archive, cache)


# -- a damaged slab file is decoded again, never served (items 6, 16) -------------------


def set_dtype(dtype: str) -> Callable[[dict[str, object]], None]:
    return lambda meta: meta.update(dtype=dtype)


def halve(meta: dict[str, object]) -> None:
    shape = meta["shape"]
    assert isinstance(shape, list)
    meta["shape"] = [shape[0] // 2, *shape[1:]]


def damage(cache: Path, kind: str) -> None:
    x0, y0 = slab_file(cache, "x", 0), slab_file(cache, "y", 0)
    if kind == "x as >f4":
        edit_header(x0, set_dtype(">f4"))
    elif kind == "y as <f8":
        edit_header(y0, set_dtype("<f8"))
    elif kind == "x halved, file cut":
        edit_header(x0, halve, keep=HEADER + (CHUNK // 2) * 15 * 4)
    elif kind == "a data byte flipped":
        raw = bytearray(x0.read_bytes())
        raw[HEADER + 17] ^= 0x40
        replace_with(x0, bytes(raw))
    elif kind == "another slab's file":
        replace_with(x0, slab_file(cache, "x", 1).read_bytes())


@pytest.mark.parametrize(
    "kind",
    ["x as >f4", "y as <f8", "x halved, file cut", "a data byte flipped", "another slab's file"],
)
def test_a_damaged_slab_file_is_decoded_again(archive: Path, tmp_path: Path, kind: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    with member(archive, cache) as first:
        read_all(first)
        damage(cache, kind)
        with member(archive, cache) as second:
            read_all(second)
            stats = second.stats()
            assert (stats["decodes"], stats["shared_discarded"]) == (1, 1)
            assert stats["shared_hits"] == slab_count(archive) - 1
        with member(archive, cache) as third:  # the slab was published again, whole
            read_all(third)
            assert third.stats()["shared_hits"] == slab_count(archive)


def run_child(script: str, *args: str, timeout: float = 120) -> dict[str, int]:
    """Run ``script`` in a fresh interpreter (a crash is a signal, a hang a timeout, both
    failing the test); its last line of output, as JSON."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the reader hung for {timeout} s")
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    out: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


# reads every batch of ``ds.all`` checking its values (a batch spans two slabs, so a bad one
# is read into a batch whose dtype an earlier slab set); prints its counters
READER = """
import json, resource, signal, sys
import numpy as np
from chute.insitu import InSituDataset, open_geometries, split_by_chunk

archive, cache, fsize = sys.argv[1:4]
if int(fsize):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, no signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(fsize), int(fsize)))
m = split_by_chunk(open_geometries(archive)["x"])
with InSituDataset(archive, m, batch_size=12, cache_dir=cache, cache_budget_bytes=10**6) as ds:
    for b in ds.all:
        idx = b["sample_indices"]
        want = (idx[:, None, None] * 100 + np.arange(15).reshape(3, 5)).astype(np.float32)
        assert (b["x"] == want).all() and (b["y"] == idx).all()
    print(json.dumps({k: ds.stats()[k] for k in ("decodes", "shared_hits", "shared_discarded")}))
"""


def test_slab_files_that_crash_or_hang_a_reader_are_decoded_again(
    archive: Path, tmp_path: Path
) -> None:
    """An object dtype in a header (a segfault once mapped), a FIFO (whose open blocks) and
    a link to /dev/zero (which never ends) in place of slabs, and a FIFO as the ``usage``
    count (read before publishing the slabs decoded again)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    with member(archive, cache) as first:
        read_all(first)
        edit_header(slab_file(cache, "y", 1), set_dtype("|O"))
        fifo, zero = slab_file(cache, "x", 1), slab_file(cache, "x", 2)
        fifo.unlink()
        os.mkfifo(fifo)
        zero.unlink()
        zero.symlink_to("/dev/zero")
        usage = fifo.with_name("usage")  # the count of bytes published, read to publish
        usage.unlink()
        os.mkfifo(usage)
        stats = run_child(READER, str(archive), str(cache), "0")
        assert (stats["decodes"], stats["shared_discarded"]) == (3, 3)
        assert stats["shared_hits"] == slab_count(archive) - 3
        assert all(p.is_file() and not p.is_symlink() for p in (fifo, zero, usage))  # anew


# -- reservations and file-size limits (item 19) -----------------------------------------


def test_reservations_of_dead_writers_do_not_hold_the_budget(archive: Path, tmp_path: Path) -> None:
    """Reservations nobody holds (their writers died mid-write) are removed by the next
    listing, a held one is left alone, and publishing goes on within the budget."""
    cache = tmp_path / "cache"
    cache.mkdir()
    first, budget = tight_member(archive, cache)
    with first:
        read_all(first)
        (name,) = os.listdir(cache)
        pool = cache / name
        size = HEADER + open_geometries(archive)["x"].slab_nbytes
        dead = [pool / f"{slab_file(cache, 'x', k).stem}.tmp-dead{k}" for k in range(8)]
        for path in dead:  # what a writer killed mid-write leaves: a full-size reservation
            with open(path, "wb") as f:
                f.truncate(size)
        live = pool / f"{slab_file(cache, 'x', 9).stem}.tmp-live"
        held = os.open(live, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(held, fcntl.LOCK_EX)  # a writer still writing
            os.truncate(live, size)
            for f in pool.iterdir():
                if f.suffix == ".slab":
                    f.unlink()  # gone: the next members must publish them again
            (pool / "usage").write_bytes(b"")  # recounted by listing the folder
            second, _ = tight_member(archive, cache)
            with second:
                read_all(second)
                assert on_disk(pool) <= budget
            assert any(f.suffix == ".slab" for f in pool.iterdir())  # published again
            assert not any(p.exists() for p in dead)
            assert live.exists()
        finally:
            os.close(held)


def test_a_file_size_limit_only_stops_publishing(archive: Path, tmp_path: Path) -> None:
    """With RLIMIT_FSIZE below a slab of ``x`` (EFBIG, as ENOSPC), every batch is served."""
    cache = tmp_path / "cache"
    cache.mkdir()
    limit = HEADER + open_geometries(archive)["y"].slab_nbytes  # y's slabs fit, x's do not
    stats = run_child(READER, str(archive), str(cache), str(limit))
    assert stats["decodes"] == slab_count(archive)
    with member(archive, cache) as later:  # nothing half-written was left behind
        read_all(later)
    assert os.listdir(cache) == []


def test_a_stray_folder_in_the_pool_is_cleared(archive: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    with member(archive, cache) as first:
        read_all(first)
        (name,) = os.listdir(cache)
    (cache / name).mkdir()
    (cache / name / "members.lock").touch()
    (cache / name / "stray.slab").mkdir()  # left by something else: cleared on joining alone
    with member(archive, cache) as second:
        read_all(second)
    assert os.listdir(cache) == []


def test_an_s3_archive_shares_a_pool_until_its_metadata_changes(
    s3_archive: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    import obstore
    from obstore.store import S3Store

    url, options = s3_archive
    cache = tmp_path / "cache"
    cache.mkdir()
    geoms = open_geometries(url, ["x", "y"], **options)
    m = split_by_chunk(geoms["x"])
    kw: dict[str, Any] = {"batch_size": 8, "cache_dir": cache, "cache_budget_bytes": 10**6}
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    store = S3Store(bucket, prefix=prefix, **options)
    original = bytes(obstore.get(store, "y/zarr.json").bytes())
    with InSituDataset(url, m, geoms, **kw, **options) as first:
        read_all(first)
        with InSituDataset(url, m, geoms, **kw, **options) as second:
            read_all(second)
            assert second.stats()["shared_hits"] == geoms["x"].n_chunks + geoms["y"].n_chunks
        meta = json.loads(original)
        meta["attributes"] = {"written": "again"}
        obstore.put(store, "y/zarr.json", json.dumps(meta).encode())
        try:
            with InSituDataset(url, m, geoms, **kw, **options) as third:
                read_all(third)
                assert third.stats()["shared_hits"] == 0
        finally:
            obstore.put(store, "y/zarr.json", original)


# -- chunk data rewritten without touching the metadata (item 5) -------------------------


def y_member(path: Path, cache: Path) -> InSituDataset:
    """A member over the one variable ``y`` of ``path`` (64 samples in chunks of 8)."""
    m = split_by_chunk(open_geometries(path)["y"])
    return InSituDataset(path, m, batch_size=8, cache_dir=cache, cache_budget_bytes=10**6)


def y_values(ds: InSituDataset) -> np.ndarray:
    """Every sample of ``y``, in sample order."""
    out = np.empty(64, dtype=np.int64)
    for b in ds.all:
        out[b["sample_indices"]] = b["y"]
    return out


def test_chunks_rewritten_without_their_metadata_are_not_served_from_the_pool(
    tmp_path: Path,
) -> None:
    """The archive keeps its identity (same metadata, same pool), but each slab's header
    records the stamps of the chunk files it was decoded from, so the changed ones are
    decoded again rather than served stale."""
    path, cache = tmp_path / "data.zarr", tmp_path / "cache"
    cache.mkdir()
    group = zarr.open_group(str(path), mode="w")
    group.create_array("y", shape=(64,), chunks=(8,), dtype="i8")[:] = np.arange(64)
    with y_member(path, cache) as old:
        np.testing.assert_array_equal(y_values(old), np.arange(64))  # all 8 slabs published
        zarr.open_array(str(path / "y"), mode="r+")[:] = -np.arange(64)  # chunk files only
        with y_member(path, cache) as new:
            np.testing.assert_array_equal(y_values(new), -np.arange(64))
            stats = new.stats()
            assert (stats["decodes"], stats["shared_discarded"], stats["shared_hits"]) == (8, 8, 0)
        assert len(os.listdir(cache)) == 1  # one pool: the archive's identity did not change
        with y_member(path, cache) as later:  # the new slabs were published in their place
            np.testing.assert_array_equal(y_values(later), -np.arange(64))
            assert later.stats()["shared_hits"] == 8


def wait_past(stamp_ns: int, probe: Path) -> None:
    """Wait until the file system stamps a change after ``stamp_ns`` (its clock is coarse)."""
    while True:
        probe.write_bytes(b"")
        if os.stat(probe).st_ctime_ns > stamp_ns:
            return


@pytest.mark.parametrize("how", ["replaced by rename", "overwritten in place"])
def test_a_chunk_file_changed_keeping_its_size_and_mtime_is_decoded_again(
    tmp_path: Path, how: str
) -> None:
    """A chunk file changed to one of the same size whose modification time is set back:
    replaced, it has another inode; overwritten in place, its change time (which no
    ``utime`` can set back) moved on."""
    path, cache = tmp_path / "data.zarr", tmp_path / "cache"
    cache.mkdir()
    y = zarr.open_group(str(path), mode="w").create_array(
        "y", shape=(64,), chunks=(8,), dtype="<i8", compressors=None
    )
    y[:] = np.arange(64)
    chunk = path / "y" / "c" / "3"
    before = os.stat(chunk)
    assert before.st_size == 64  # stored raw: the new bytes keep the size
    with y_member(path, cache) as old:
        np.testing.assert_array_equal(y_values(old), np.arange(64))
        wait_past(before.st_ctime_ns, tmp_path / "probe")
        raw = (-np.arange(24, 32)).astype("<i8").tobytes()
        if how == "replaced by rename":
            replace_with(chunk, raw)
        else:
            with open(chunk, "r+b") as f:
                f.write(raw)
        os.utime(chunk, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(chunk)
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        assert (after.st_ino == before.st_ino) == (how == "overwritten in place")
        with y_member(path, cache) as new:
            want = np.arange(64)
            want[24:32] *= -1
            np.testing.assert_array_equal(y_values(new), want)
            stats = new.stats()
            assert (stats["decodes"], stats["shared_discarded"], stats["shared_hits"]) == (1, 1, 7)
