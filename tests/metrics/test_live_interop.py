"""A live run as another process sees it: plattli's reader follows a CompactingWriter's
widened column at once, and a long-lived reader that races `finish()` reads the archive
instead of calling the run damaged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import plattli
import pytest

import chute.metrics as cm
from chute.errors import RunFileMissingError

from ._util import assert_readers_agree

WIDEN = {
    "u8 then a Python int": (np.uint8(5), 7000, "i64"),
    "f32 then a double": (np.float32(0.5), np.float64(1e300), "f64"),
    "i8 then i16": (np.int8(-3), np.int16(-300), "i16"),
}


def _dtype(run, name):
    return json.loads((run / "plattli" / "plattli.json").read_text())[name]["dtype"]


@pytest.mark.parametrize("case", sorted(WIDEN))
@pytest.mark.parametrize("compacted", [0, 1, 5], ids=["hot only", "one row", "compacted"])
def test_plattli_reads_a_live_compacting_run_after_a_column_widens(tmp_path, case, compacted):
    narrow, wide, code = WIDEN[case]
    runs = {}
    for mod in (cm, plattli):
        run = tmp_path / ("ours" if mod is cm else "theirs")
        w = mod.CompactingWriter(run, hotsize=2 if compacted else 100)
        for _ in range(compacted + 1):
            w.write(x=narrow, other=1.0)
            w.end_step()
        w.write(x=wide)
        w.end_step()
        runs[mod] = (run, w)
    ours, w = runs[cm]
    assert _dtype(ours, "x") == _dtype(runs[plattli][0], "x") == code  # as plattli's writer does
    want = [narrow.item()] * (compacted + 1) + [wide.item() if hasattr(wide, "item") else wide]
    for reader in (plattli.Reader, cm.Reader):
        with reader(ours) as r:  # the writer is still live
            steps, values = r.metric("x")
            assert steps.tolist() == list(range(compacted + 2)), reader
            assert values.tolist() == want, reader
    w.write(x=narrow)  # narrow values keep joining the wide column
    w.end_step()
    with plattli.Reader(ours) as r:
        assert r.metric("x")[1].tolist() == [*want, narrow.item()]
    for mod, (_run, writer) in runs.items():
        writer.finish(zip=False) if mod is cm else writer.finish(optimize=False, zip=False)
    assert_readers_agree(ours)


_WIDEN_AND_DIE = """
import os, signal, sys
import numpy as np
import chute.metrics as cm
w = cm.CompactingWriter(sys.argv[1], hotsize=2)
for s in range(5):
    w.write(x=np.uint8(s))
    w.end_step()
w.write(x=70000)
w.end_step()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_after_a_widening_loses_no_completed_step(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WIDEN_AND_DIE), str(tmp_path)], check=False
    )
    assert proc.returncode == -9
    want = [0, 1, 2, 3, 4, 70000]
    for reader in (cm.Reader, plattli.Reader):
        with reader(tmp_path) as r:
            assert r.metric("x")[1].tolist() == want, reader
    with cm.CompactingWriter(tmp_path, step=6, hotsize=2) as w:
        w.write(x=np.uint8(6))
        w.end_step()
    with cm.Reader(tmp_path) as r:
        assert r.metric("x")[1].tolist() == [*want, 6]
        assert r.verify() == []


# -- a reader racing finish() -------------------------------------------------------------
def _live_run(path):
    w = cm.DirectWriter(path)
    for s in range(5):
        w.write(loss=float(s), note=f"n{s}")
        w.end_step()
    return w


@pytest.mark.parametrize("first", ["note.jsonl", "loss.f64", "plattli.json"])
def test_a_reader_racing_finish_reads_the_archive_not_damage(tmp_path, monkeypatch, first):
    """finish() writes metrics.plattli, then removes plattli/ a file at a time: a reader
    opened on the live folder (manifest cached) reads between the two."""
    w = _live_run(tmp_path)
    found = cm.Reader(tmp_path)  # found the folder itself: follows to the archive
    pinned = cm.Reader(tmp_path / "plattli", kind="dir")  # told to read the folder
    for r in (found, pinned):
        r.metric("note")
    seen: dict[str, object] = {}
    rmtree = shutil.rmtree

    def paused(path, *args, **kwargs):
        os.unlink(os.path.join(path, first))
        seen["steps"], seen["notes"] = found.metric("note")
        seen["loss"] = found.metric("loss", idx=-1)
        seen["rows"], seen["metrics"] = found.rows("loss"), found.metrics()
        seen["finished"], seen["verify"] = found.finished, found.verify()
        with pytest.raises(RunFileMissingError) as err:
            pinned.metric("note" if first != "loss.f64" else "loss")
            pinned.metric("loss")
        seen["pinned"] = str(err.value)
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", paused)
    w.finish()
    monkeypatch.undo()
    assert seen["steps"].tolist() == [0, 1, 2, 3, 4]
    assert seen["notes"].tolist() == [f"n{s}" for s in range(5)]
    assert seen["loss"] == (4, 4.0) and seen["rows"] == 5
    assert seen["metrics"] == ["loss", "note"] and seen["finished"] is True
    assert seen["verify"] == []
    assert "finalized" in seen["pinned"] and "damaged" not in seen["pinned"]
    found.close()
    pinned.close()


def test_a_file_missing_from_a_live_folder_is_still_damage(tmp_path):
    w = _live_run(tmp_path)
    w.close()
    with cm.Reader(tmp_path) as r:
        r.metric("note")
        os.unlink(tmp_path / "plattli" / "note.jsonl")
        with pytest.raises(RunFileMissingError, match="damaged"):
            r.metric("note")
