"""Crash safety (kill -9 at random points), the run lock, and same-process takeover."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import chute.metrics as cm

from ..store.isolate import OK, run_isolated

_WRITER = """
import sys
import chute.metrics as cm
kind, path, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "direct":
    w = cm.DirectWriter(path, step=start)
else:
    w = cm.CompactingWriter(path, step=start, hotsize=7)
s = start
while True:
    w.write({"a": s, "b": s / 4, "c": f"s{s}", "d/e": [s]})
    if s % 3 == 0:
        w.write(sparse=float(s))
    if s % 7 in (0, 1, 3):  # irregular cadence: the column turns explicit
        w.write(irr=s)
    w.end_step()
    print(s, flush=True)  # step s is complete
    s += 1
"""


def _run_and_kill(kind, path, start, rng):
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WRITER), kind, str(path), str(start)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    target = rng.randint(1, 400)
    last = start - 1
    for line in proc.stdout:
        last = int(line)
        if last - start >= target:
            break
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()  # lines printed before the kill are completed steps too
    proc.wait()
    proc.stdout.close()
    for line in rest.split():
        last = int(line)
    return last


def _check(path, completed):
    """Every completed step reads back; a step cut by the kill may be partly there."""
    expect = {
        "a": lambda s: s,
        "b": lambda s: s / 4,
        "c": lambda s: f"s{s}",
        "d/e": lambda s: [s],
        "sparse": float,
        "irr": lambda s: s,
    }
    logged = {"sparse": lambda s: s % 3 == 0, "irr": lambda s: s % 7 in (0, 1, 3)}
    with cm.Reader(path) as r:
        for name, value in expect.items():
            steps, vals = r.metric(name)
            done = [s for s in steps.tolist() if s <= completed]
            when = logged.get(name, lambda s: True)
            assert done == [s for s in range(completed + 1) if when(s)], name
            assert len(steps) - len(done) <= 1, name  # at most the step being written
            assert vals.tolist() == [value(s) for s in steps.tolist()], name


@pytest.mark.parametrize("kind", ["direct", "compacting"])
def test_kill9_at_random_points_then_resume_earlier(tmp_path, kind):
    rng = random.Random(1234 + len(kind))
    start = 0
    for _trial in range(6):
        completed = _run_and_kill(kind, tmp_path, start, rng)
        _check(tmp_path, completed)
        # Resume at an earlier step: everything from there on is rewritten cleanly.
        start = rng.randint(max(0, completed - 50), completed + 1)
    w = cm.DirectWriter(tmp_path, step=start)
    w.finish()
    with cm.Reader(tmp_path) as r:
        assert r.metric("a")[0].tolist() == list(range(start))


_HOLDER = """
import sys, time
import chute.metrics as cm
w = cm.DirectWriter(sys.argv[1])
w.write(a=1)
w.end_step()
print("locked", flush=True)
time.sleep(60)
"""


def test_second_writer_in_another_process_is_refused(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLDER), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        for make in (
            lambda: cm.DirectWriter(tmp_path, step=1),
            lambda: cm.CompactingWriter(tmp_path, step=1, hotsize=2),
        ):
            with pytest.raises(cm.RunLockedError, match="another process"):
                make()
        with cm.Reader(tmp_path) as r:  # readers never lock and the data is untouched
            assert r.metric("a")[1].tolist() == [1]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    w = cm.DirectWriter(tmp_path, step=1)  # the lock died with its process
    w.finish()


def test_reopen_in_same_process_takes_over_background_work(tmp_path):
    w = cm.CompactingWriter(tmp_path, hotsize=5)
    for s in range(1003):
        w.write(a=s, b=np.float64(s))
        w.end_step()
    w.write(a=1003)  # pending, not ended
    w2 = cm.CompactingWriter(tmp_path, step=1004, hotsize=5)  # old one still compacting
    with pytest.raises(cm.WriterClosedError):
        w.write(b=1.0)
    with pytest.raises(cm.WriterClosedError):
        w.end_step()
    w2.write(a=1004)
    w2.end_step()
    w2.finish(zip=False)
    with cm.Reader(tmp_path) as r:
        assert r.metric("a")[1].tolist() == list(range(1005))
        assert r.metric("b")[0].tolist() == list(range(1003))


def test_dropped_writer_then_reopen_loses_nothing(tmp_path):
    def log():
        w = cm.DirectWriter(tmp_path)
        for s in range(50):
            w.write(x=float(s))
            w.end_step()
        # dropped here without close()

    log()
    w = cm.DirectWriter(tmp_path, step=50)
    w.write(x=50.0)
    w.end_step()
    w.close()
    with cm.Reader(tmp_path) as r:
        assert r.rows("x") == 51


def test_torn_tails_are_tolerated_and_repaired(tmp_path):
    w = cm.DirectWriter(tmp_path)
    for s in range(10):
        w.write(f=float(s), j={"s": s})
        w.end_step()
    w.close()
    pdir = tmp_path / "plattli"
    with open(pdir / "f.f32", "ab") as f:
        f.write(b"\x01\x02")  # half a value
    with open(pdir / "f.indices", "ab") as f:
        f.write(np.uint32(10).tobytes())  # index without a value
    with open(pdir / "j.jsonl", "ab") as f:
        f.write(b'{"s": 1')  # torn line
    (pdir / "hot.jsonl").write_bytes(b'{"step":10,"f":10.0}\n{"step":11,"f":1')
    with cm.Reader(tmp_path) as r:
        assert r.metric("f")[0].tolist() == list(range(11))
        assert r.rows("j") == 10
    w = cm.DirectWriter(tmp_path, step=11)
    w.write(f=11.0, j={"s": 11})
    w.end_step()
    w.close()
    with cm.Reader(tmp_path) as r:
        assert r.metric("f")[1].tolist() == [float(s) for s in range(12)]
        assert r.metric("j")[0].tolist() == [*range(10), 11]


def test_writer_promotion_visible_to_long_lived_reader(tmp_path):
    w = cm.DirectWriter(tmp_path)
    w.write(x=np.float32(1.5))
    w.end_step()
    r = cm.Reader(tmp_path)
    assert r.metric("x")[1].dtype == np.float32
    w.write(x=np.float64(2.5))
    w.end_step()
    _steps, vals = r.metric("x")  # the f32 file is gone: the reader refreshes and retries
    assert vals.tolist() == [1.5, 2.5] and vals.dtype == np.float64
    w.close()


# -- kill -9 while resuming a finished run ------------------------------------------------------
_CHANGES = {"os.truncate", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree"}
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC


def _changes_files(event, args):
    """Whether an audit event is a call that changes the filesystem (open for writing too)."""
    if event == "open":
        flags = args[2] if isinstance(args[2], int) else 0
        return bool(flags & _WRITES) or any(c in (args[1] or "") for c in "wax+")
    return event in _CHANGES


def _resume_killed_at(path, n):
    """Resume the run at `path` from step 60 in a forked child that SIGKILLs itself right before
    its `n`-th file-changing call; returns the child's exit (-9: it was killed)."""

    def child():
        calls = 0

        def hook(event, args):
            nonlocal calls
            if _changes_files(event, args):
                calls += 1
                if calls == n:
                    os.kill(os.getpid(), signal.SIGKILL)

        sys.addaudithook(hook)
        cm.DirectWriter(path, step=60, allow_resume_finalized=True).close()
        return OK

    return run_isolated(child)


def _columns(path):
    with cm.Reader(path) as r:
        return r.finished, {n: [a.tolist() for a in r.metric(n)] for n in r.metrics()}


@pytest.mark.parametrize("layout", ["archive", "optimized folder", "folder"])
def test_kill9_at_every_point_of_resuming_a_finished_run_reads_consistently(tmp_path, layout):
    template = tmp_path / "finished"
    w = cm.DirectWriter(template)
    for s in range(120):
        w.write(loss=float(s), note={"s": s})
        if s % 2 == 0:
            w.write(ev=s)
        if s % 7 in (0, 1, 3):  # irregular: explicit steps
            w.write(irr=s)
        w.end_step()
    w.finish(optimize=layout != "folder", zip=layout == "archive")
    finished, full = _columns(template)
    assert finished and len(full["loss"][0]) == 120
    kept = {name: sum(s < 60 for s in steps) for name, (steps, _v) in full.items()}
    states = set()
    for n in range(1, 500):
        run = tmp_path / f"kill{n}"
        shutil.copytree(template, run)
        code = _resume_killed_at(run, n)
        assert code in (OK, -signal.SIGKILL), code
        finished, seen = _columns(run)  # any state a kill leaves reads without an error
        states.add((finished, len(seen["loss"][0])))
        assert seen.keys() == full.keys(), n
        with cm.Reader(run) as r:
            assert r.verify() == [], n
        for name, (steps, values) in seen.items():
            if finished:  # untouched: all 120 rows
                assert [steps, values] == full[name], (n, name)
            else:  # live: every row below step 60, and beyond it only rows not cut yet
                rows = len(steps)
                assert rows >= kept[name], (n, name)
                assert [steps, values] == [full[name][0][:rows], full[name][1][:rows]], (n, name)
        cm.DirectWriter(run, step=60, allow_resume_finalized=True).finish()  # resume again
        assert _columns(run)[1] == {
            name: [steps[: kept[name]], values[: kept[name]]]
            for name, (steps, values) in full.items()
        }
        if code == OK:  # the resume ran to the end: every point before it was a kill
            break
    else:
        raise AssertionError("the resume never completed")
    assert {(True, 120), (False, 120), (False, 60)} <= states  # before, between, after cuts
