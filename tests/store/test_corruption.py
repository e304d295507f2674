"""Damaged stores give Python exceptions that name the problem: never a signal, a hang, or
bytes that were not written. Every case runs in a forked child."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import chute
from chute import ChecksumError, ChuteError, CorruptStoreError, Dataset

from .isolate import OK, UNEXPECTED, WRONG_DATA, run_isolated

N, SHAPE = 64, (4, 32)
CODECS = ["raw", "zstd", "zstd_dict"]


def source() -> np.ndarray:
    rng = np.random.default_rng(11)
    base = np.sin(np.linspace(0, 12, SHAPE[0] * SHAPE[1])) * 8 + 8
    return (base + rng.integers(0, 3, (N, base.size))).astype(np.uint8).reshape(N, *SHAPE)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pristine")
    return {c: chute.write_dataset(root / f"{c}.zr", source(), codec=c).store.path for c in CODECS}


def damaged_copy(pristine: dict[str, Path], codec: str, tmp_path: Path) -> Path:
    dst = tmp_path / f"{codec}.zr"
    shutil.copytree(pristine[codec], dst)
    return dst


def read_all(path: Path, *, verify: bool, expect_clean: bool) -> Callable[[], int]:
    """A child's check: read everything; correct data or a clean exception are both fine,
    but under ``verify`` returned data must equal what was written."""

    def check() -> int:
        want = source()
        try:
            ds = Dataset(path, verify=verify)
            got = ds[:]
            batch = ds[[N - 1, 0, N // 2]]
        except (ChuteError, IndexError, ValueError, TypeError) as e:
            assert str(e)
            return OK if not expect_clean else UNEXPECTED
        if verify and not (
            np.array_equal(got, want) and np.array_equal(batch, want[[N - 1, 0, N // 2]])
        ):
            return WRONG_DATA
        return OK

    return check


def expect_error(
    fn: Callable[[], object], exc: type[BaseException], match: str
) -> Callable[[], int]:
    def check() -> int:
        try:
            fn()
        except exc as e:
            return OK if match in str(e) else UNEXPECTED
        return WRONG_DATA

    return check


def flip(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ (1 << bit)]))


def set_loc(store: Path, index: int, **fields: int) -> None:
    """Overwrite fields of one RecordLoc in meta.zr."""
    names = ["offset", "phys_length", "logic_length", "chunk_id", "codec", "reserved"]
    with open(store / "meta.zr", "r+b") as f:
        f.seek(16 + 16 * index)
        loc = dict(zip(names, struct.unpack("<IIIHBB", f.read(16)), strict=True))
        loc.update(fields)
        f.seek(16 + 16 * index)
        f.write(struct.pack("<IIIHBB", *(loc[n] for n in names)))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(
    ("file", "size", "message"),
    [
        ("meta.zr", 0, "truncated"),
        ("meta.zr", 10, "truncated"),
        ("meta.zr", 16 + 16 * 10, "truncated"),
        ("0.zr", 0, "past the end"),
        ("0.zr", 100, "past the end"),
    ],
)
def test_truncated_files(
    pristine: dict[str, Path], tmp_path: Path, codec: str, file: str, size: int, message: str
) -> None:
    path = damaged_copy(pristine, codec, tmp_path)
    os.truncate(path / file, size)
    assert run_isolated(expect_error(lambda: Dataset(path)[:], CorruptStoreError, message)) == OK


def test_truncated_or_missing_dict(pristine: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(pristine, "zstd_dict", tmp_path)
    os.truncate(path / "dict.zr", 40)
    assert run_isolated(expect_error(lambda: Dataset(path)[:], CorruptStoreError, "dict")) == OK
    (path / "dict.zr").unlink()
    assert (
        run_isolated(expect_error(lambda: Dataset(path)[:], CorruptStoreError, "no dict.zr")) == OK
    )


DICT_DAMAGE: dict[str, Callable[[Path], object]] = {
    "37-bytes-appended": lambda d: d.write_bytes(d.read_bytes() + bytes(range(37))),
    "last-byte-cut": lambda d: os.truncate(d, d.stat().st_size - 1),
    "byte-flipped": lambda d: flip(d, d.stat().st_size // 2, 2),
}


@pytest.mark.parametrize("damage", DICT_DAMAGE)
@pytest.mark.parametrize("verify", [False, True])
def test_a_damaged_dictionary_is_caught_at_open_not_decoded_as_data(
    pristine: dict[str, Path], tmp_path: Path, damage: str, verify: bool
) -> None:
    """zstd takes any bytes as a dictionary: only the size and CRC-32C chute wrote beside
    it (dict.chute) tell a damaged dict.zr from the one the records were compressed with."""
    path = damaged_copy(pristine, "zstd_dict", tmp_path)
    DICT_DAMAGE[damage](path / "dict.zr")
    check = expect_error(
        lambda: Dataset(path, verify=verify)[:], CorruptStoreError, "/dict.zr is damaged"
    )
    assert run_isolated(check) == OK


def test_a_damaged_dictionary_record_is_damage(pristine: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(pristine, "zstd_dict", tmp_path)
    flip(path / "dict.chute", 0)
    assert run_isolated(expect_error(lambda: Dataset(path), CorruptStoreError, "dict.chute")) == OK
    os.truncate(path / "dict.chute", 0)
    assert run_isolated(expect_error(lambda: Dataset(path), CorruptStoreError, "dict.chute")) == OK


def test_a_dictionary_record_without_its_dictionary_is_cleared(tmp_path: Path) -> None:
    """A train_dict killed between dict.chute and dict.zr: readers ignore the record, the
    next writer removes it and trains anew; a reset removes both."""
    path = tmp_path / "s.zr"
    chute.write_dataset(path, source(), codec="zstd").close()
    (path / "dict.chute").write_bytes(b"ZDCT" + bytes(12))
    assert np.array_equal(Dataset(path)[:], source())
    rows = source().reshape(N, -1)
    with chute.RecordStore(path, mode="a") as store:
        assert not (path / "dict.chute").exists()
        store.train_dict(rows)
        store.append(rows[:3], codec="zstd_dict")
    with chute.RecordStore(path) as store:
        assert np.array_equal(store.gather([N, N + 2]), rows[[0, 2]])
    chute.RecordStore(path, mode="w").close()
    assert not (path / "dict.zr").exists() and not (path / "dict.chute").exists()


def test_a_writer_refuses_a_tail_chunk_cut_short(tmp_path: Path) -> None:
    """Appending past a cut would fill the gap with zeros and the lost records would read as
    zeros: the writer refuses to open such a store; replacing it is still possible."""
    path = tmp_path / "s.zr"
    rows = np.arange(100 * 64, dtype=np.uint32).reshape(100, 64) + 1
    chute.write_dataset(path, rows, codec="raw").close()
    os.truncate(path / "0.zr", os.path.getsize(path / "0.zr") // 2)
    with pytest.raises(CorruptStoreError, match="cut"):
        chute.write_dataset(path, rows[:1], mode="a")
    assert os.path.getsize(path / "0.zr") == rows.nbytes // 2  # nothing was written
    with Dataset(path) as ds, pytest.raises(CorruptStoreError):
        ds[np.arange(100)]
    with chute.write_dataset(path, rows[:3], overwrite=True) as ds:
        assert np.array_equal(ds[np.arange(3)], rows[:3])


@pytest.mark.parametrize("shards", [None, 10])
def test_a_raw_record_with_two_lengths_is_damage_not_a_size_mismatch(
    tmp_path: Path, shards: int | None
) -> None:
    """A table entry whose logical length differs from its stored one, for a raw record, is
    damage, named as such before its size is compared with the batch's slot."""
    path = tmp_path / "d"
    chute.write_dataset(path, np.arange(100 * 64, dtype=np.uint32).reshape(100, 64),
                        codec="raw", shard_records=shards).close()  # fmt: skip
    meta = path / ("part-00001.zr" if shards else ".") / "meta.zr"
    with open(meta, "r+b") as f:  # record 5's logical length
        f.seek(16 + 16 * 5 + 8)
        f.write(struct.pack("<I", 3))
    hit = 15 if shards else 5
    with Dataset(path) as ds:
        for idx in (np.arange(100), np.array([hit]), np.array([hit, 3])):
            with pytest.raises(CorruptStoreError, match="record 5"):
                ds[idx]


def test_missing_chunk_and_bad_header(pristine: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(pristine, "zstd", tmp_path)
    (path / "0.zr").unlink()
    assert run_isolated(expect_error(lambda: Dataset(path), CorruptStoreError, "missing")) == OK
    path = damaged_copy(pristine, "raw", tmp_path / "b")
    flip(path / "meta.zr", 1)
    assert run_isolated(expect_error(lambda: Dataset(path), CorruptStoreError, "bad magic")) == OK
    path = damaged_copy(pristine, "raw", tmp_path / "c")
    with open(path / "meta.zr", "r+b") as f:  # length beyond the table
        f.seek(12)
        f.write(struct.pack("<I", 1 << 23))
    assert run_isolated(expect_error(lambda: Dataset(path), CorruptStoreError, "truncated")) == OK


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"offset": 0xFFFF0000}, "past the end"),
        ({"phys_length": 1 << 21}, "1 MiB"),
        ({"chunk_id": 9}, "chunk 9"),
        ({"codec": 7}, "codec tag 7"),
        ({"codec": 2}, "no dict.zr"),
        ({"logic_length": 5}, "slot"),
    ],
)
def test_bad_table_entries(
    pristine: dict[str, Path], tmp_path: Path, fields: dict[str, int], message: str
) -> None:
    path = damaged_copy(pristine, "zstd", tmp_path)
    set_loc(path, 7, **fields)
    exc: type[BaseException] = ValueError if message == "slot" else CorruptStoreError
    assert run_isolated(expect_error(lambda: Dataset(path)[[3, 7]], exc, message)) == OK
    assert run_isolated(expect_error(lambda: Dataset(path)[7], exc, message)) == OK


def test_damaged_zstd_frame(pristine: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(pristine, "zstd", tmp_path)
    with open(path / "meta.zr", "rb") as f:
        f.seek(16 + 16 * 3)
        (offset,) = struct.unpack("<I", f.read(4))
    for k in range(4):  # the frame header: magic and descriptor
        flip(path / "0.zr", offset + k, 3)
    assert (
        run_isolated(expect_error(lambda: Dataset(path)[3], CorruptStoreError, "zstd frame")) == OK
    )


def test_flipped_bit_in_raw_record_under_verify(pristine: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(pristine, "raw", tmp_path)
    flip(path / "0.zr", 128 * 9 + 5, 6)
    assert (
        run_isolated(expect_error(lambda: Dataset(path, verify=True)[9], ChecksumError, "checksum"))
        == OK
    )
    assert run_isolated(read_all(path, verify=True, expect_clean=False)) == OK


def test_table_damage_under_verify_is_caught(pristine: dict[str, Path], tmp_path: Path) -> None:
    path = damaged_copy(pristine, "raw", tmp_path)
    set_loc(path, 4, offset=128 * 5)  # points at record 5's bytes: same size, valid data
    assert (
        run_isolated(
            expect_error(
                lambda: Dataset(path, verify=True)[4], CorruptStoreError, "meta.zr is damaged"
            )
        )
        == OK
    )


@pytest.mark.parametrize("codec", CODECS)
def test_random_truncations_and_bit_flips(
    pristine: dict[str, Path], tmp_path: Path, codec: str
) -> None:
    """A seeded sweep over every file of the store: truncate or flip at random positions."""
    rng = np.random.default_rng(["raw", "zstd", "zstd_dict"].index(codec))
    files = sorted(f.name for f in pristine[codec].iterdir())
    assert "schema.json" in files and "gen.chute" in files
    failures = []
    for trial in range(60):
        path = damaged_copy(pristine, codec, tmp_path / str(trial))
        target = path / files[trial % len(files)]
        size = target.stat().st_size
        if size and rng.random() < 0.6:
            for _ in range(int(rng.integers(1, 4))):
                flip(target, int(rng.integers(0, size)), int(rng.integers(0, 8)))
            action = "flip"
        else:
            os.truncate(target, int(rng.integers(0, max(size, 1))))
            action = "truncate"
        for verify in (False, True):
            code = run_isolated(read_all(path, verify=verify, expect_clean=False))
            if code != OK:
                failures.append((trial, target.name, action, verify, code))
        shutil.rmtree(path)
    assert not failures, failures


def test_isolation_sees_signals_and_hangs() -> None:
    """The harness itself: a segfault and a hang in the child are failures, not passes."""
    import signal
    import time

    assert run_isolated(lambda: os.kill(os.getpid(), signal.SIGSEGV) or 0) == -signal.SIGSEGV
    with pytest.raises(AssertionError, match="hung"):
        run_isolated(lambda: time.sleep(10) or 0, timeout=0.3)
