"""Files move both ways between chute and plattli 0.19.0 (its own Reader and writers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import plattli
import pytest

import chute.metrics as cm

from ._util import assert_readers_agree, same

ALL_DTYPES = [
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
]


def wait_compacted(run, timeout=10.0):
    """Wait until no background compaction is in flight (its file is gone)."""
    deadline = time.monotonic() + timeout
    while (run / "plattli" / "hot.compacting.jsonl").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def log_everything(w, steps=30, hot_tail=True):
    """Every dtype, JSON values, sparse cadences (step ranges) and slash names."""
    for s in range(steps):
        row = {f"t/{np.dtype(t).name}": t(s % 100) for t in ALL_DTYPES}
        row.update(loss=1.0 / (s + 1), count=s * 7, note=f"n{s}", flag=s % 3 == 0)
        if s % 4 == 0:
            row["sparse"] = -s
            row["obj"] = {"s": s, "l": [s, "x"]}
        if s in (3, 4, 5, 17, 18, 29):
            row["irregular"] = float(s)
        w.write(row)
        w.end_step()
    if hot_tail:
        w.write(loss=float("nan"), extra=np.float64(2.5))


@pytest.mark.parametrize("writer", ["direct", "compacting"])
@pytest.mark.parametrize("zip_", [False, True])
def test_plattli_written_runs_read_identically(tmp_path, writer, zip_):
    if writer == "direct":
        w = plattli.DirectWriter(tmp_path, config={"lr": 3e-4})
    else:
        w = plattli.CompactingWriter(tmp_path, hotsize=7, config={"lr": 3e-4})
    log_everything(w)
    w.end_step()
    wait_compacted(tmp_path)
    assert_readers_agree(tmp_path)  # live, hot log included
    w.finish(zip=zip_)
    assert_readers_agree(tmp_path)
    if zip_:
        assert_readers_agree(tmp_path / "metrics.plattli", kind="zip")
    else:
        assert_readers_agree(tmp_path / "plattli", kind="dir")
    with cm.Reader(tmp_path) as r, plattli.Reader(tmp_path) as p:
        names = ["loss", "sparse", "t/uint8", "irregular", "count"]
        for kw in (
            {},
            {"start": 4, "stop": 20},
            {"istart": -2},
            {"on": "count", "vstart": 30, "vstop": 120},
            {"on": "sparse", "dtype": {"loss": np.float64}},
        ):
            s1, c1 = r.table(names, **kw)
            s2, c2 = p.table(names, **kw)
            assert same(s1, s2) and all(same(c1[n], c2[n]) for n in names), kw
        assert r.approx_max_rows() == p.approx_max_rows()


@pytest.mark.parametrize("writer", ["direct", "compacting", "bulk"])
@pytest.mark.parametrize("zip_", [False, True])
def test_chute_written_runs_read_identically_in_plattli(tmp_path, writer, zip_):
    if writer == "direct":
        w = cm.DirectWriter(tmp_path, config={"lr": 3e-4})
    elif writer == "compacting":
        w = cm.CompactingWriter(tmp_path, hotsize=7, config={"lr": 3e-4})
    else:
        w = cm.BulkWriter(tmp_path, config={"lr": 3e-4})
    log_everything(w)
    w.end_step()
    if writer != "bulk":
        wait_compacted(tmp_path)
        assert_readers_agree(tmp_path)
    w.finish(zip=zip_)
    assert_readers_agree(tmp_path)
    with cm.Reader(tmp_path) as r, plattli.Reader(tmp_path) as p:
        assert r.manifest() == p.manifest()


def test_a_live_compacting_run_before_its_first_compaction_reads_in_plattli(tmp_path):
    """New metrics are declared in the manifest with no file until their rows are compacted:
    plattli's reader takes that state (its own CompactingWriter publishes it too)."""
    w = cm.CompactingWriter(tmp_path, hotsize=1000)
    for s in range(3):
        w.write(loss=1.0 / (s + 1), acc=np.float32(s), note=f"n{s}")
        w.end_step()
    assert not list((tmp_path / "plattli").glob("loss.*"))  # declared, no file yet
    with cm.Reader(tmp_path) as r, plattli.Reader(tmp_path) as p:
        assert sorted(r.metrics()) == sorted(p.metrics()) == ["acc", "loss", "note"]
        for name in ("loss", "acc", "note"):
            a, b = r.metric(name), p.metric(name)
            assert a[0].tolist() == b[0].tolist() == [0, 1, 2], name
            assert list(a[1]) == list(b[1]), name
    w.close()


def test_resume_across_libraries(tmp_path):
    with plattli.CompactingWriter(tmp_path, hotsize=5) as w:  # exit waits for its compaction
        for s in range(12):
            w.write(a=s, b=float(s))
            w.end_step()
    w = cm.DirectWriter(tmp_path, step=8)
    for s in range(8, 15):
        w.write(a=s * 10)
        w.end_step()
    w.close()
    assert_readers_agree(tmp_path)
    w2 = plattli.DirectWriter(tmp_path, step=10)
    w2.write(a=-1)
    w2.end_step()
    w2.finish()
    with cm.Reader(tmp_path) as r:
        assert r.metric("a")[1].tolist() == [*range(8), 80, 90, -1]
        assert r.metric("b")[0].tolist() == list(range(8))


_LIVE_WRITER = """
import sys, time
import numpy as np
lib, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if lib == "plattli":
    import plattli as m
else:
    import chute.metrics as m
w = m.CompactingWriter(path, hotsize=5)
print("ready", flush=True)
for s in range(n):
    w.write(a=s, b=float(s) / 2, c=f"s{s}")
    if s % 7 in (0, 1, 3) or s > n // 2:  # cadence changes: regular, then explicit steps
        w.write(x=s)
    w.end_step()
    if s % 50 == 0:
        time.sleep(0.001)
w.finish(zip=False)
"""


@pytest.mark.parametrize(
    ("writer_lib", "reader_lib"), [("plattli", "chute"), ("chute", "plattli"), ("chute", "chute")]
)
def test_live_run_read_while_other_library_writes(tmp_path, writer_lib, reader_lib):
    n = 1500
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_LIVE_WRITER), writer_lib, str(tmp_path), str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    open_reader = cm.Reader if reader_lib == "chute" else plattli.Reader
    reads = 0
    while proc.poll() is None or reads == 0:
        try:
            r = open_reader(tmp_path)
        except (FileNotFoundError, ValueError):
            continue
        with r:
            if "a" not in r.metrics():
                continue
            steps, vals = r.metric("a")
            # Every read is a consistent prefix: steps 0..k-1 with a == step.
            assert steps.tolist() == list(range(len(steps)))
            assert vals.tolist() == steps.tolist()
            if reader_lib == "chute" and "x" in r.metrics():
                steps, vals = r.metric("x")
                assert vals.tolist() == steps.tolist()
                assert all(s % 7 in (0, 1, 3) or s > n // 2 for s in steps.tolist())
            reads += 1
    assert proc.wait() == 0
    assert reads > 0
    assert_readers_agree(tmp_path)
    with cm.Reader(tmp_path) as r:
        assert r.rows("a") == n
