"""RecordStore behaviour through its public API."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chute import (
    OutBufferError,
    RecordStore,
    StoreClosedError,
    StoreError,
    StoreLockedError,
    StoreNotFoundError,
)
from chute.store import _format

from .conftest import record

CODECS = ["raw", "zstd", "zstd_dict"]


def fill(store: RecordStore, n: int, codec: str) -> list[bytes]:
    recs = [record(i) for i in range(n)]
    if codec == "zstd_dict" and not store.has_dict:
        store.train_dict(recs)
    store.append(recs, codec=codec)
    return recs


@pytest.mark.parametrize("codec", CODECS)
def test_roundtrip_every_codec(store_path: Path, codec: str) -> None:
    with RecordStore(store_path, mode="w") as s:
        recs = fill(s, 200, codec)
        values, offsets = s.gather_packed(np.arange(200)[::-1])
        got = [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(200)]
        assert got == recs[::-1]
        counts = s.stats()["codecs"]
        assert counts[codec] > 0 and sum(counts.values()) == 200
    with RecordStore(store_path) as r:
        assert len(r) == 200
        assert r.lengths([0, 5]).tolist() == [len(recs[0]), len(recs[5])]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    recs=st.lists(st.binary(max_size=600), max_size=40),
    codec=st.sampled_from(["raw", "zstd"]),
    picks=st.lists(st.integers(0, 1000), max_size=60),
)
def test_gather_matches_records(
    tmp_path: Path, recs: list[bytes], codec: str, picks: list[int]
) -> None:
    path = tmp_path / f"h{os.getpid()}-{abs(hash((tuple(recs), codec)))}.zr"
    with RecordStore(path, mode="w", codec=codec) as s:
        s.append(recs)
        if not recs:
            assert len(s) == 0
            return
        idx = [p % len(recs) for p in picks]
        values, offsets = s.gather_packed(idx)
        assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(len(idx))] == [
            recs[i] for i in idx
        ]


def test_gather_into_caller_buffer(store_path: Path) -> None:
    rows = np.arange(50 * 24, dtype=np.uint8).reshape(50, 24)
    with RecordStore(store_path, mode="w") as s:
        s.append(rows)
        out = np.empty((3, 2, 3), np.float32)  # 24 bytes per row, any dtype/shape
        assert s.gather([4, 0, 49], out) is out
        assert out.view(np.uint8).reshape(3, 24).tolist() == rows[[4, 0, 49]].tolist()
        assert s.gather([1, 2]).tolist() == rows[[1, 2]].tolist()
        with pytest.raises(ValueError, match="slot"):
            s.gather([0], np.empty(10, np.uint8))


def test_zero_length_records_are_valid(store_path: Path) -> None:
    with RecordStore(store_path, mode="w") as s:
        s.append([b"", b"x", b""])
        values, offsets = s.gather_packed([0, 1, 2])
        assert values.tobytes() == b"x" and offsets.tolist() == [0, 0, 1, 1]
        assert s.gather([0, 2]).shape == (2, 0)


def test_incompressible_records_are_stored_raw(store_path: Path) -> None:
    noise = np.random.default_rng(0).integers(0, 256, (10, 4096), dtype=np.uint8)
    with RecordStore(store_path, mode="w", codec="zstd") as s:
        s.append(noise)
        assert s.stats()["codecs"] == {"raw": 10, "zstd": 0, "zstd_dict": 0}
        assert np.array_equal(s.gather(np.arange(10)), noise)


def test_delete_swaps_last_into_hole(store_path: Path) -> None:
    with RecordStore(store_path, mode="w") as s:
        s.append([bytes([i]) * 3 for i in range(10)])
        s.delete([2, 2, 9, 0])  # duplicates and any order
        assert len(s) == 7
        values, offsets = s.gather_packed(range(7))
        got = [values[offsets[k]] for k in range(7)]
        # descending: 9 drops off the end, 2 <- 8, 0 <- 7
        assert got == [7, 1, 8, 3, 4, 5, 6]
        with pytest.raises(IndexError):
            s.delete([7])
        assert s.stats()["reclaimable"] > 0


@pytest.mark.parametrize("codec", CODECS)
def test_compact_reclaims_and_keeps_records(store_path: Path, codec: str) -> None:
    with RecordStore(store_path, mode="w") as s:
        recs = fill(s, 300, codec)
        order = list(range(300))
        rng = np.random.default_rng(1)
        victims = rng.choice(300, 120, replace=False)
        for v in sorted(victims.tolist(), reverse=True):
            order[v] = order[-1]
            order.pop()
        s.delete(victims)
        before = s.stats()
        freed = s.compact()
        after = s.stats()
        assert freed == before["chunk_bytes"] - after["chunk_bytes"] > 0
        assert after["chunk_bytes"] == after["live_bytes"]
        values, offsets = s.gather_packed(range(len(s)))
        assert [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(len(s))] == [
            recs[i] for i in order
        ]
        assert s.verify()["damaged"] == []
        assert s.compact() == 0  # nothing left to do


def test_chunks_roll_over_and_compact_drops_files(
    store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_format, "CHUNK_LIMIT", 10_000)
    recs = [record(i, 3000) for i in range(12)]
    with RecordStore(store_path, mode="w", codec="raw") as s:
        s.append(recs)
        assert s.stats()["chunks"] == 4  # three 3000-byte records per 10000-byte chunk
        assert sorted(os.listdir(store_path)).count("3.zr") == 1
        s.delete(range(6))
        s.compact()
        assert s.stats()["chunks"] == 2
        assert not (store_path / "2.zr").exists()
        got = {bytes(s.gather_packed([k])[0]) for k in range(6)}
        assert got == set(recs[6:])


def test_modes_and_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        RecordStore(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreNotFoundError, match=r"no meta\.zr"):
        RecordStore(tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []  # reading never creates files
    with pytest.raises(ValueError, match="mode"):
        RecordStore(tmp_path / "x", mode="rw")  # type: ignore[arg-type]
    with RecordStore(tmp_path / "s", mode="a") as s:
        s.append([b"abc"])
    with RecordStore(tmp_path / "s", mode="a") as s:
        assert len(s) == 1
    with RecordStore(tmp_path / "s", mode="w") as s:
        assert len(s) == 0


def test_read_only_and_closed(store_path: Path) -> None:
    RecordStore(store_path, mode="w").close()
    r = RecordStore(store_path)
    with pytest.raises(StoreError, match="read-only"):
        r.append([b"x"])
    r.close()
    r.close()
    with pytest.raises(StoreClosedError):
        len(r)
    with pytest.raises(StoreClosedError):
        r.gather([0])


def test_bad_input(store_path: Path) -> None:
    with RecordStore(store_path, mode="w") as s:
        s.append([b"abc"])
        with pytest.raises(ValueError, match="1 MiB"):
            s.append([bytes((1 << 20) + 1)])
        with pytest.raises(StoreError, match="train_dict"):
            s.append([b"abc"], codec="zstd_dict")
        with pytest.raises(ValueError, match="unknown codec"):
            s.append([b"abc"], codec="lz4")
        with pytest.raises(IndexError, match="out of range"):
            s.gather_packed([1])
        with pytest.raises(IndexError):
            s.gather([-1])
        with pytest.raises(TypeError, match="integers"):
            s.gather_packed([0.5])  # type: ignore[list-item]
        for lengths in ([2**64 - 1, 1], [2**70, 1], [1.5, 0.5], [True, False]):
            with pytest.raises(TypeError, match="record lengths must be integers"):
                s.append_packed(np.zeros(2, np.uint8), lengths)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="1 MiB"):
            s.append_packed(np.zeros(2, np.uint8), np.array([2**63, 2], np.uint64))
        assert len(s) == 1  # nothing half-written
        s.train_dict([record(i) for i in range(50)])
        with pytest.raises(StoreError, match="already has a dictionary"):
            s.train_dict([b"abc"])


def test_one_writer_at_a_time(store_path: Path) -> None:
    with RecordStore(store_path, mode="w") as s:
        s.append([b"a"])
        with pytest.raises(StoreLockedError):
            RecordStore(store_path, mode="a")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # a fork with the pool running
            pid = os.fork()
        if pid == 0:  # another process
            try:
                RecordStore(store_path, mode="a")
                os._exit(1)
            except StoreLockedError:
                os._exit(0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with RecordStore(store_path) as r:  # readers are always welcome
            assert len(r) == 1
    with RecordStore(store_path, mode="a") as s:  # the lock went with the writer
        assert len(s) == 1


def test_reader_sees_consistent_prefix_while_writer_appends(store_path: Path) -> None:
    recs = [record(i, 500 + i % 300) for i in range(2000)]
    writer = RecordStore(store_path, mode="w")
    reader = RecordStore(store_path)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for k in range(0, 2000, 25):
                writer.append(recs[k : k + 25])
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=write)
    t.start()
    seen = 0
    while t.is_alive() or seen < 2000:
        n = len(reader)
        assert n >= seen and n % 25 == 0
        if n:
            idx = np.arange(n)[-50:]
            values, offsets = reader.gather_packed(idx)
            for k, i in enumerate(idx.tolist()):
                assert values[offsets[k] : offsets[k + 1]].tobytes() == recs[i]
        seen = n
        if not t.is_alive() and seen == 2000:
            break
    t.join()
    assert not errors and seen == 2000
    writer.close()
    reader.close()


def test_verify_reports_flipped_bit(store_path: Path) -> None:
    rows = np.tile(np.arange(256, dtype=np.uint8), (20, 4))
    with RecordStore(store_path, mode="w", codec="raw") as s:
        s.append(rows)
    with open(store_path / "0.zr", "r+b") as f:
        f.seek(5 * 1024 + 17)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x04]))
    with RecordStore(store_path) as r:
        assert r.gather([5])[0, 17] != rows[5, 17]  # unverified reads see the damage
        report = r.verify()
        assert [i for i, _ in report["damaged"]] == [5]
    from chute import ChecksumError

    with RecordStore(store_path, verify=True) as r:
        assert np.array_equal(r.gather([4, 6]), rows[[4, 6]])
        with pytest.raises(ChecksumError) as e:
            r.gather([4, 5, 6])
        assert e.value.index == 5


def test_stats_fields(store_path: Path) -> None:
    with RecordStore(store_path, mode="w") as s:
        s.append([record(i, 1000) for i in range(10)])
        st_ = s.stats()
        assert st_["records"] == 10
        assert st_["logical_bytes"] == 10_000
        assert st_["live_bytes"] == st_["chunk_bytes"] < 10_000
        assert st_["ratio"] > 1
    # apparent size stays close to the data (no sparse multi-GiB preallocation)
    total = sum(f.stat().st_size for f in store_path.iterdir())
    assert total < st_["live_bytes"] + 64 * 1024


def test_durable_mode_round_trips(store_path: Path) -> None:
    with RecordStore(store_path, mode="w", durable=True) as s:
        s.append([record(i) for i in range(30)])
        s.delete([3])
        s.compact()
        s.sync()
    with RecordStore(store_path) as r:
        assert len(r) == 29 and r.verify()["damaged"] == []


def test_threads_share_a_store(store_path: Path) -> None:
    """Appends from several threads land whole; readers on other threads see whole records."""
    writer = RecordStore(store_path, mode="w")
    reader = RecordStore(store_path)
    errors: list[BaseException] = []

    def append(t: int) -> None:
        try:
            for k in range(40):
                writer.append([bytes([t]) * (100 + k)] * 5)
        except BaseException as e:
            errors.append(e)

    def read() -> None:
        try:
            for _ in range(200):
                n = len(reader)
                if n:
                    values, offsets = reader.gather_packed(np.arange(n))
                    for k in range(n):
                        rec = values[offsets[k] : offsets[k + 1]]
                        assert rec.size >= 100 and (rec == rec[0]).all()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=append, args=(t,)) for t in range(4)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(writer) == 4 * 40 * 5
    writer.close()
    reader.close()


def test_exit_with_stores_open_and_threads_gathering(store_path: Path) -> None:
    """Interpreter exit while daemon threads are inside gather, stores never closed."""
    import subprocess
    import sys

    with RecordStore(store_path, mode="w") as s:
        s.append(np.arange(200 * 4096, dtype=np.uint8).reshape(200, 4096) % 7)
    script = f"""
import threading, numpy as np
from chute import RecordStore
store = RecordStore({str(store_path)!r})
writer_dir = {str(store_path.parent / "w.zr")!r}
w = RecordStore(writer_dir, mode="w")
w.append([b"x" * 100])
def spin():
    idx = np.arange(200)
    while True:
        store.gather(idx)
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
store.gather(np.arange(200))
"""
    for _ in range(5):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode()


def test_gather_into_padded_slots(store_path: Path) -> None:
    with RecordStore(store_path, mode="w") as s:
        s.append([b"ab", b"", b"wxyz"])
        out = np.full((3, 5), ord("."), np.uint8)
        s.gather_into([2, 0, 1], out, [0, 5, 10])
        assert out.tobytes() == b"wxyz.ab..........."[:15]
        with pytest.raises(ValueError, match="offsets"):
            s.gather_into([0], out, [0, 1])
        with pytest.raises(OutBufferError, match="does not fit in out at byte 13"):
            s.gather_into([2], out, [13])  # 4 bytes do not fit at byte 13 of 15


def test_reader_sees_a_dictionary_trained_after_it_opened(store_path: Path) -> None:
    recs = [record(i, 2000) for i in range(200)]
    with RecordStore(store_path, mode="w") as w, RecordStore(store_path) as r:
        w.append(recs[:10])
        assert len(r) == 10 and not r.has_dict
        w.train_dict(recs)
        w.append(recs[10:], codec="zstd_dict")
        values, offsets = r.gather_packed([0, 150])  # refreshes: finds dict.zr
        assert values[: offsets[1]].tobytes() == recs[0]
        assert values[offsets[1] :].tobytes() == recs[150] and r.has_dict
