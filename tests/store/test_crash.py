"""kill -9 at random points of append, delete and compact: the store still opens, every
committed record reads back intact, and the operation can be run again."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from chute import RecordStore

WRITER = r"""
import struct, sys, numpy as np
from chute import RecordStore

def rec(i):
    n = 200 + (i * 7919) % 1800
    return struct.pack('<I', i) + ((np.arange(n) + i) % 251 // 3).astype(np.uint8).tobytes()

op, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
s = RecordStore(path, mode='a', codec=['raw', 'zstd'][seed % 2])
if op == 'append':
    while True:
        first = len(s)
        s.append([rec(first + k) for k in range(int(rng.integers(1, 64)))])
        print(len(s), flush=True)
elif op == 'delete':
    print('ready', flush=True)
    while len(s) > 64:
        idx = rng.choice(len(s), int(rng.integers(1, 32)), replace=False)
        ids = [struct.unpack('<I', bytes(s.gather_packed([int(i)])[0][:4]))[0] for i in idx]
        print(' '.join(map(str, ids)), flush=True)
        s.delete(idx)
elif op == 'compact':
    print('ready', flush=True)
    s.compact()
    print('done', flush=True)
"""


def rec(i: int) -> bytes:
    n = 200 + (i * 7919) % 1800
    return struct.pack("<I", i) + ((np.arange(n) + i) % 251 // 3).astype(np.uint8).tobytes()


def start(op: str, path: Path, seed: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, op, str(path), str(seed)],
        stdout=subprocess.PIPE,
        text=True,
    )


def kill_after_first_line(proc: subprocess.Popen[str], delay: float) -> list[str]:
    assert proc.stdout is not None
    lines = [proc.stdout.readline().strip()]
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    lines += [ln.strip() for ln in proc.stdout.read().splitlines()]
    proc.wait()
    return [ln for ln in lines if ln]


def all_records(path: Path) -> list[bytes]:
    with RecordStore(path, verify=True) as s:
        values, offsets = s.gather_packed(np.arange(len(s)))
        assert s.verify()["damaged"] == []
    return [values[offsets[k] : offsets[k + 1]].tobytes() for k in range(len(offsets) - 1)]


def ids(records: list[bytes]) -> list[int]:
    return [struct.unpack("<I", r[:4])[0] for r in records]


def prepare(path: Path, n: int) -> None:
    with RecordStore(path, mode="w", codec="zstd") as s:
        s.append([rec(i) for i in range(n)])


@pytest.mark.parametrize("trial", range(8))
def test_kill_during_append(tmp_path: Path, trial: int) -> None:
    path = tmp_path / "s.zr"
    acked = kill_after_first_line(start("append", path, trial), 0.01 + 0.03 * trial)
    committed = int(acked[-1])
    records = all_records(path)
    assert len(records) >= committed
    assert records == [rec(i) for i in range(len(records))]
    with RecordStore(path, mode="a") as s:  # appending again continues cleanly
        s.append([rec(len(s))])
    assert all_records(path) == [rec(i) for i in range(len(records) + 1)]


@pytest.mark.parametrize("trial", range(6))
def test_kill_during_delete(tmp_path: Path, trial: int) -> None:
    path = tmp_path / "s.zr"
    prepare(path, 3000)
    lines = kill_after_first_line(start("delete", path, trial), 0.005 + 0.02 * trial)
    asked = {int(x) for ln in lines[1:] for x in ln.split()}
    records = all_records(path)
    got = ids(records)
    assert all(r == rec(i) for r, i in zip(records, got, strict=True))
    assert set(range(3000)) - asked <= set(got)  # every record not asked to go is there


@pytest.mark.parametrize("trial", range(6))
def test_kill_during_compact(tmp_path: Path, trial: int) -> None:
    path = tmp_path / "s.zr"
    prepare(path, 20000)
    with RecordStore(path, mode="a") as s:
        s.delete(np.arange(0, 20000, 3 + trial % 2))
        values, offsets = s.gather_packed(np.arange(len(s)))
        survivors = sorted(
            values[offsets[:-1].astype(np.int64)[:, None] + np.arange(4)].view("<u4").ravel()
        )
    lines = kill_after_first_line(start("compact", path, trial), 0.002 + 0.015 * trial)
    for _ in range(2):  # after the kill, and again after finishing the job
        records = all_records(path)
        assert sorted(ids(records)) == survivors
        assert all(r == rec(i) for r, i in zip(records, ids(records), strict=True))
        with RecordStore(path, mode="a") as s:
            s.compact()
            stats = s.stats()
        assert stats["chunk_bytes"] == stats["live_bytes"]
    assert lines[0] == "ready"


_KILLED_IN_DELETE = r"""
import os, signal, sys
from chute import RecordStore
import chute.store._write as write

with RecordStore(sys.argv[1], mode="a") as s:
    real = write._native.store_state

    def killed(buf, *state):  # the tail entry is in the hole; the length never drops
        if buf is s._files.meta:
            os.kill(os.getpid(), signal.SIGKILL)
        real(buf, *state)

    write._native.store_state = killed
    s.delete([0])
"""


def test_compacting_after_a_delete_killed_part_way_keeps_every_record(tmp_path: Path) -> None:
    """A delete killed between copying the tail entry into the hole and dropping the length
    leaves the tail record named twice; compacting then moves those bytes once, for both
    entries, and overwrites no record that has not moved yet (the deleted record being
    smaller than the duplicated one, with a record after it)."""
    path = tmp_path / "s.zr"
    records = [bytes([65 + i]) * n for i, n in enumerate([10, 100, 100, 100, 100, 100])]
    with RecordStore(path, mode="w", codec="raw") as s:
        s.append(records)
        s.delete([1])
        s.compact()
    done = subprocess.run([sys.executable, "-c", _KILLED_IN_DELETE, str(path)], check=False)
    assert done.returncode == -signal.SIGKILL
    twice = [records[4], records[5], records[2], records[3], records[4]]
    assert all_records(path) == twice  # the tail (E) in the hole, and still at the end
    with RecordStore(path, mode="a") as s:
        s.compact()
    assert all_records(path) == twice
    with RecordStore(path, mode="a") as s:
        s.delete([4])
        s.compact()
        assert s.stats()["chunk_bytes"] == s.stats()["live_bytes"]
    assert all_records(path) == twice[:4]
