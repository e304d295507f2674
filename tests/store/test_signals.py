"""No signal from any input or any race: object buffers and dtypes are refused, a reader
racing a delete, a compaction or an appender in another process (or a chunk rollover in
another thread) sees a consistent state or `StoreChangedError`. Every case runs in a forked
child, so a SIGSEGV or SIGBUS fails the test instead of killing the run."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import chute
from chute import ChuteError, CorruptStoreError, Dataset, RecordStore, StoreChangedError
from chute.store import _format

from .isolate import OK, UNEXPECTED, WRONG_DATA, run_isolated


def tagged(i: int, size: int = 3000) -> bytes:
    """Record i: its id, then bytes derived from it, so any read can be checked alone."""
    body = ((np.arange(size - 8, dtype=np.uint32) * (i + 3)) % 251).astype(np.uint8)
    return struct.pack("<II", i, size) + body.tobytes()


def is_whole(record: bytes) -> bool:
    i, size = struct.unpack("<II", record[:8])
    return len(record) == size and record == tagged(i, size)


# ---- out= buffers and dtypes that hold pointers -------------------------------------------


@pytest.mark.parametrize(
    "out",
    [
        lambda: np.empty(2, dtype=object),
        lambda: np.empty(2, dtype=[("a", "<u1", 3), ("b", "O")]),
        lambda: np.empty((2, 8), np.uint8)[:, ::2],  # not contiguous
        lambda: np.frombuffer(bytes(8), np.uint8).reshape(2, 4),  # read-only
    ],
)
def test_gather_refuses_an_out_buffer_it_must_not_write(tmp_path: Path, out: object) -> None:
    path = tmp_path / "s.zr"
    with RecordStore(path, mode="w", codec="raw") as s:
        s.append([b"\x01" * 4, b"\x02" * 4])

    def check() -> int:
        buf = out()  # type: ignore[operator]
        with RecordStore(path) as r:
            for call in (lambda: r.gather([0, 1], buf), lambda: r.gather_into([0], buf, [0])):
                try:
                    call()
                except (TypeError, ValueError) as e:
                    if "out" not in str(e):
                        return UNEXPECTED
                else:
                    return WRONG_DATA
        return OK

    assert run_isolated(check) == OK


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("|O", [8]), ({"names": ["a", "b"], "formats": ["<i8", "|O"]}, [4]), ("T", [4])],
)
def test_schema_naming_an_object_dtype_is_damage(
    tmp_path: Path, dtype: object, shape: list[int]
) -> None:
    """Each dtype makes rows of the stored 64 bytes, so an unchecked read would write the
    records' bytes over object pointers."""
    path = tmp_path / "d.zr"
    chute.write_dataset(path, np.arange(64, dtype=np.int64).reshape(8, 8)).close()
    schema = json.loads((path / "schema.json").read_text())
    schema["dtype"], schema["shape"] = dtype, shape
    (path / "schema.json").write_text(json.dumps(schema))

    def check() -> int:
        try:
            Dataset(path)[0]
        except CorruptStoreError as e:
            return OK if "schema.json" in str(e) else UNEXPECTED
        return WRONG_DATA

    assert run_isolated(check) == OK


def test_writers_refuse_object_dtypes(tmp_path: Path) -> None:
    def check() -> int:
        bad = np.empty((4, 2), dtype=[("x", "<i4"), ("y", "O")])
        for write in (
            lambda: chute.write_dataset(tmp_path / "a.zr", bad),
            lambda: chute.write_ragged(tmp_path / "b.zr", [bad]),
            lambda: RecordStore(tmp_path / "c.zr", mode="w").append(np.empty((2, 2), object)),
        ):
            try:
                write()
            except TypeError as e:
                if "Python objects" not in str(e):
                    return UNEXPECTED
            else:
                return WRONG_DATA
        return OK

    assert run_isolated(check) == OK


# ---- a reader while another process deletes and compacts ----------------------------------

EDITOR = r"""
import sys, numpy as np
from chute import RecordStore
path, rounds = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
for _ in range(rounds):
    with RecordStore(path, mode="a") as s:
        if len(s) > 40:
            s.delete(rng.choice(len(s), len(s) // 3, replace=False))
        s.compact()
print("done", flush=True)
"""


def edit(path: Path, rounds: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", EDITOR, str(path), str(rounds)], stdout=subprocess.PIPE, text=True
    )


def make_store(path: Path, n: int) -> None:
    with RecordStore(path, mode="w", codec="raw") as s:
        s.append([tagged(i) for i in range(n)])


def test_reader_open_across_delete_and_compact_raises_store_changed(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    make_store(path, 3000)

    def check() -> int:
        with RecordStore(path) as r:
            before = r.gather_packed(np.arange(len(r)))
            assert len(before[1]) == 3001
            proc = edit(path)
            assert proc.communicate(timeout=60)[0].strip() == "done"
            for read in (
                lambda: r.gather_packed([0, 2999]),  # the chunk shrank under the old mapping
                lambda: r.gather_packed([5]),
                lambda: len(r),
                lambda: r.verify(),
            ):
                try:
                    read()
                except StoreChangedError as e:
                    if "reopen" not in str(e):
                        return UNEXPECTED
                else:
                    return WRONG_DATA  # deleted records, silently
        with RecordStore(path) as fresh:  # reopening sees the new state
            values, offsets = fresh.gather_packed(np.arange(len(fresh)))
            assert len(fresh) == 2000
            assert all(is_whole(bytes(values[offsets[k] : offsets[k + 1]])) for k in range(2000))
        return OK

    assert run_isolated(check, timeout=90) == OK


def test_reader_racing_repeated_compactions_never_gets_a_signal(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    make_store(path, 4000)

    def check() -> int:
        proc = edit(path, rounds=12)
        changed = reads = 0
        r = RecordStore(path)
        while proc.poll() is None or reads == 0:
            try:
                n = len(r)
                idx = np.random.default_rng(reads).integers(0, n, 64)
                values, offsets = r.gather_packed(idx)
                reads += 1
                for k in range(len(idx)):
                    if not is_whole(bytes(values[offsets[k] : offsets[k + 1]])):
                        return WRONG_DATA
            except StoreChangedError:
                changed += 1
                r.close()
                r = RecordStore(path)
        r.close()
        proc.wait(timeout=60)
        return OK if changed and reads else UNEXPECTED

    assert run_isolated(check, timeout=120) == OK


# ---- verify=True while another process appends --------------------------------------------

APPENDER = r"""
import sys, struct, time, numpy as np
from chute import RecordStore
sys.path.insert(0, sys.argv[3])
from tests.store.test_signals import tagged
path, seconds = sys.argv[1], float(sys.argv[2])
with RecordStore(path, mode="a", codec="zstd") as s:
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # one small record per commit: as many commits as can be
        first = len(s)
        s.append([tagged(first, 64 + first % 200)])
"""


def test_verifying_reader_racing_an_appender_sees_no_false_damage(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    with RecordStore(path, mode="w") as s:
        s.append([tagged(i, 64 + i % 200) for i in range(10)])
    root = Path(__file__).parents[2]

    def check() -> int:
        proc = subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(path), "6", str(root)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        r = RecordStore(path, verify=True)
        seen = 0
        while proc.poll() is None:
            n = len(r)
            idx = np.arange(max(0, n - 4), n)
            values, offsets = r.gather_packed(idx)  # CorruptStoreError here is the bug
            for k in range(len(idx)):
                if not is_whole(bytes(values[offsets[k] : offsets[k + 1]])):
                    return WRONG_DATA
            seen = max(seen, n)
        r.close()
        return OK if seen > 10 else UNEXPECTED

    assert run_isolated(check, timeout=60) == OK


# ---- a gather racing a chunk rollover in the same process ---------------------------------


def test_gather_racing_a_chunk_rollover_in_another_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_format, "CHUNK_LIMIT", 16_000)  # a rollover every few appends
    path = tmp_path / "s.zr"

    def check() -> int:
        s = RecordStore(path, mode="w", codec="raw")
        s.append([tagged(0, 700)])
        stop = threading.Event()
        failures: list[BaseException] = []

        def write() -> None:
            try:
                for k in range(1, 1200, 4):
                    s.append([tagged(k + j, 700) for j in range(4)])
            except BaseException as e:
                failures.append(e)
            finally:
                stop.set()

        t = threading.Thread(target=write)
        t.start()
        while not stop.is_set():
            n = len(s)
            try:
                values, offsets = s.gather_packed(np.arange(max(0, n - 8), n))
            except ChuteError as e:
                failures.append(e)
                break
            for k in range(len(offsets) - 1):
                if not is_whole(bytes(values[offsets[k] : offsets[k + 1]])):
                    return WRONG_DATA
        t.join()
        s.close()
        if failures:
            print(failures)
        return UNEXPECTED if failures else OK

    assert run_isolated(check, timeout=60) == OK


def test_gather_racing_a_delete_in_another_thread(tmp_path: Path) -> None:
    path = tmp_path / "s.zr"
    make_store(path, 3000)

    def check() -> int:
        s = RecordStore(path, mode="a")
        done = threading.Event()

        def delete() -> None:
            for _ in range(40):
                s.delete(np.arange(0, len(s), 7))
                time.sleep(0.001)
            done.set()

        t = threading.Thread(target=delete)
        t.start()
        while not done.is_set():
            try:
                values, offsets = s.gather_packed(np.arange(0, len(s), 5))
            except (StoreChangedError, IndexError):
                continue  # overlapped a delete: reported, not returned
            for k in range(len(offsets) - 1):
                if not is_whole(bytes(values[offsets[k] : offsets[k + 1]])):
                    return WRONG_DATA
        t.join()
        s.close()
        return OK

    assert run_isolated(check, timeout=60) == OK


def test_header_state_is_published_in_one_step() -> None:
    """The primitive under the reader/appender fix: another process hammering the header
    never lets a reader see a length from one commit with a frontier from another."""
    import mmap
    import os

    from chute import _native

    shared = mmap.mmap(-1, mmap.PAGESIZE)  # MAP_SHARED: the child's stores show here

    def check() -> int:
        pid = os.fork()
        if pid == 0:
            k = 0
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                k = (k + 0x10001) & 0xFFFFFFFF  # changes bytes in both halves of each u32
                _native.store_state(shared, k & 0xFFFF, k, k)
            os._exit(0)
        torn = reads = 0
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            _, offset, length = _native.load_state(shared)
            torn += offset != length
            reads += 1
        return OK if torn == 0 and reads > 1000 else WRONG_DATA

    assert run_isolated(check, timeout=30) == OK


def test_reader_of_a_store_without_gen_file_still_notices_a_delete(tmp_path: Path) -> None:
    """A store another tool wrote has no gen.chute; the chute writer that later deletes
    creates it, and a reader that opened before picks it up."""
    path = tmp_path / "s.zr"
    make_store(path, 100)
    (path / _format.GEN_FILE).unlink()

    def check() -> int:
        with RecordStore(path) as r:
            assert len(r) == 100
            with RecordStore(path, mode="a") as w:
                w.delete([0])
            try:
                r.gather_packed([5])
            except StoreChangedError:
                return OK
            return WRONG_DATA

    assert run_isolated(check) == OK
