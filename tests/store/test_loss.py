"""No silent loss: a reset never runs under a live writer, an orphaned chunk is never
truncated, damage reads as damage (never as a size mismatch or "unchecked"), and a durable
store names a chunk file only once the directory holds it."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import chute
from chute import CorruptStoreError, Dataset, RecordStore, StoreLockedError
from chute.store import _format

from .isolate import OK, UNEXPECTED, WRONG_DATA, run_isolated

HOLDER = r"""
import sys
from chute import RecordStore
s = RecordStore(sys.argv[1], mode="a")
s.append([b"late" * 10])
print("holding", flush=True)
sys.stdin.read()
print(len(s), flush=True)
"""


def hold(path: Path) -> subprocess.Popen[str]:
    """Another process that holds the store for writing until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def dataset(path: Path, n: int = 50) -> np.ndarray:
    rows = np.arange(n * 16, dtype=np.int32).reshape(n, 16)
    chute.write_dataset(path, rows).close()
    return rows


def test_reset_under_a_live_writer_is_refused_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "d.zr"
    rows = dataset(path)
    with RecordStore(path, mode="a") as holder:  # another handle in this process
        with pytest.raises(StoreLockedError):
            RecordStore(path, mode="w")
        with pytest.raises(StoreLockedError):
            chute.write_dataset(path, np.zeros((3, 16), np.int32), overwrite=True)
        assert len(holder) == 50
    proc = hold(path)  # and another process
    try:
        with pytest.raises(StoreLockedError):
            RecordStore(path, mode="w")
        with pytest.raises(StoreLockedError):
            chute.write_dataset(path, np.zeros((3, 16), np.int32), overwrite=True)
        np.save(tmp_path / "z.npy", np.zeros((3, 16), np.int32))
        r = subprocess.run(
            [sys.executable, "-m", "chute", "convert", str(tmp_path / "z.npy"), str(path),
             "--overwrite", "-q"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == 2 and "open for writing" in r.stderr
    finally:
        out, _ = proc.communicate("", timeout=60)
    assert out.strip() == "51"  # the holder's own commit survived, and it saw no error
    ds = Dataset(path)
    assert len(ds) == 51 and np.array_equal(ds[:50], rows)


def test_append_refuses_chunks_without_a_table(tmp_path: Path) -> None:
    path = tmp_path / "d.zr"
    dataset(path)
    size = (path / "0.zr").stat().st_size
    (path / "meta.zr").unlink()

    def check() -> int:
        for opener in (
            lambda: RecordStore(path, mode="a"),
            lambda: RecordStore(path, mode="a").append([b"x"]),
        ):
            try:
                opener()
            except CorruptStoreError as e:
                if "0.zr holds" not in str(e):
                    return UNEXPECTED
            else:
                return WRONG_DATA
        return OK

    assert run_isolated(check) == OK
    assert (path / "0.zr").stat().st_size == size and not (path / "meta.zr").exists()
    (path / "meta.zr").write_bytes(b"")  # an empty table is the same loss
    assert run_isolated(check) == OK
    assert (path / "0.zr").stat().st_size == size
    with RecordStore(path, mode="w") as s:  # starting over is still possible, deliberately
        assert len(s) == 0


def set_loc(store: Path, index: int, **fields: int) -> None:
    names = ["offset", "phys_length", "logic_length", "chunk_id", "codec", "reserved"]
    with open(store / "meta.zr", "r+b") as f:
        f.seek(16 + 16 * index)
        loc = dict(zip(names, struct.unpack("<IIIHBB", f.read(16)), strict=True))
        loc.update(fields)
        f.seek(16 + 16 * index)
        f.write(struct.pack("<IIIHBB", *(loc[n] for n in names)))


@pytest.mark.parametrize("field", ["logic_length", "phys_length"])
def test_a_huge_length_in_the_table_is_damage_not_a_size_mismatch(
    tmp_path: Path, field: str
) -> None:
    path = tmp_path / "d.zr"
    dataset(path)
    set_loc(path, 32, **{field: 2365587576})

    def check() -> int:
        ds = Dataset(path)
        for read in (lambda: ds[32], lambda: ds[:], lambda: ds.store.gather_packed([32])):
            try:
                read()
            except CorruptStoreError as e:
                if "record 32" not in str(e) or e.index != 32:
                    return UNEXPECTED
            else:
                return WRONG_DATA
        return OK

    assert run_isolated(check) == OK


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chute", *args], capture_output=True, text=True, timeout=60
    )


def test_verify_counts_add_up(tmp_path: Path) -> None:
    path = tmp_path / "r.zr"
    chute.write_dataset(path, np.tile(np.arange(200, dtype=np.uint8), (400, 1)), codec="raw")
    for k in (6, 90):
        with open(path / "0.zr", "r+b") as f:
            f.seek(200 * k + 3)
            f.write(b"\xff")
    r = run_cli("verify", str(path))
    assert r.returncode == 1
    assert "400 records: 398 matched their checksum, 0 decoded without one, 2 damaged" in r.stdout
    with RecordStore(path) as s:
        report = s.verify()
    assert (report["checked"], report["unchecked"], len(report["damaged"])) == (398, 0, 2)


def test_a_sidecar_shorter_than_the_table_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "r.zr"
    rows = dataset(path, 100)
    sums = path / _format.SUMS_FILE
    os.truncate(sums, _format.SUMS_HEADER.size + 60 * _format.SUMS_DTYPE.itemsize)

    def check() -> int:
        ds = Dataset(path, verify=True)
        if not np.array_equal(ds[:60], rows[:60]):
            return WRONG_DATA
        try:
            ds[70]
        except CorruptStoreError as e:
            return OK if "crc32c.chute" in str(e) and "truncated" in str(e) else UNEXPECTED
        return WRONG_DATA

    assert run_isolated(check) == OK
    r = run_cli("verify", str(path))
    assert r.returncode == 1
    assert "DAMAGED record 60" in r.stdout and "another tool" not in r.stdout
    assert "40 damaged" in r.stdout


def test_durable_store_syncs_the_directory_before_naming_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chute import _native
    from chute.store import _opening, _write

    monkeypatch.setattr(_format, "CHUNK_LIMIT", 10_000)
    path = tmp_path / "s.zr"
    synced: set[str] = set()
    named: list[int] = []
    real_fsync_dir, real_store_state = _write.fsync_dir, _native.store_state

    def fsync_dir(p: Path) -> None:
        synced.update(f.name for f in p.iterdir())
        real_fsync_dir(p)

    def store_state(buf: object, tail_chunk: int, offset: int, length: int) -> None:
        if _format.chunk_file(tail_chunk) not in synced:
            named.append(tail_chunk)
        real_store_state(buf, tail_chunk, offset, length)

    monkeypatch.setattr(_write, "fsync_dir", fsync_dir)
    monkeypatch.setattr(_opening, "fsync_dir", fsync_dir)
    monkeypatch.setattr(_native, "store_state", store_state)
    with RecordStore(path, mode="w", codec="raw", durable=True) as s:
        for k in range(12):
            s.append([bytes([k]) * 3000])
        assert s.stats()["chunks"] == 4
    assert named == []  # every chunk file was in a synced directory before the header named it


SIDECAR_DAMAGE: dict[str, Callable[[Path], object]] = {
    "flipped-magic": lambda sums: _flip_first_byte(sums),
    "emptied": lambda sums: os.truncate(sums, 0),
    "cut": lambda sums: os.truncate(sums, 10),  # shorter than its header
    "deleted": lambda sums: sums.unlink(),  # gen.chute still says chute wrote the store
}


@pytest.mark.parametrize("damage", SIDECAR_DAMAGE)
def test_a_damaged_or_lost_sidecar_is_damage_not_a_store_without_checksums(
    tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "r.zr"
    rows = np.arange(50 * 16, dtype=np.int32).reshape(50, 16)
    chute.write_dataset(path, rows, codec="raw").close()
    SIDECAR_DAMAGE[damage](path / _format.SUMS_FILE)
    _flip_first_byte(path / "0.zr")  # record 0 now reads as other data

    def check() -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # not "has no checksums (another tool)"
            try:
                Dataset(path, verify=True)[0]
            except CorruptStoreError as e:
                if "crc32c.chute" not in str(e):
                    return UNEXPECTED
            else:
                return WRONG_DATA
            with RecordStore(path) as store:  # without verify it opens; verify() says why
                try:
                    store.verify()
                except CorruptStoreError as e:
                    return OK if "crc32c.chute" in str(e) else UNEXPECTED
        return WRONG_DATA

    assert run_isolated(check) == OK
    r = run_cli("verify", str(path))
    assert r.returncode == 2 and "crc32c.chute" in r.stderr  # an error, not "unchecked"
    with pytest.warns(UserWarning, match="crc32c.chute is damaged or missing; rebuilding"):
        RecordStore(path, mode="a").close()  # a writer repairs it, and says what is lost


def test_a_store_loaderx_wrote_opens_with_a_warning_and_is_chutes_once_it_writes(
    tmp_path: Path,
) -> None:
    loaderx = pytest.importorskip("loaderx")
    path = tmp_path / "l.zr"
    rows = np.arange(50 * 16, dtype=np.int32).reshape(50, 16)
    loaderx.write_dataset(str(path), rows, codec="raw")
    with pytest.warns(UserWarning, match="has no checksums"):
        ds = Dataset(path, verify=True)
    assert np.array_equal(ds[:], rows)
    ds.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chute.write_dataset(path, rows[:5], mode="a").close()  # chute appends: now chute's
        with Dataset(path, verify=True) as ds:
            assert np.array_equal(ds[:], np.concatenate([rows, rows[:5]]))
            assert ds.store.verify()["unchecked"] == 50  # loaderx's records have no checksum
    assert {_format.SUMS_FILE, _format.GEN_FILE} <= {p.name for p in path.iterdir()}
    lds = loaderx.Dataset(str(path))  # and loaderx still reads it
    assert np.array_equal(lds[np.arange(55)], np.concatenate([rows, rows[:5]]))


def _flip_first_byte(file: Path) -> None:
    with open(file, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
