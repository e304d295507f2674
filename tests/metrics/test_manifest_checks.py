"""Manifest entries are checked the one way (reader and writer alike): damage is an error
naming the manifest and the metric, a resume touches nothing outside the run, a declared
step range is compared with the files before anything is made of it, and steps up to the
last uint32 read back as plattli writes and reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import plattli
import pytest

import chute.metrics as cm
from chute.errors import CorruptRunError
from chute.metrics._cli import main

from ..store.isolate import OK, WRONG_DATA, run_isolated
from ._util import assert_readers_agree

TOP = 2**32 - 1


def _finished(path, zip_=False):
    w = cm.DirectWriter(path)
    for s in range(5):
        w.write(loss=float(s), acc=float(s) / 10)
        w.end_step()
    w.finish(zip=zip_)
    return path


def _edit(path, change):
    mpath = path / "plattli" / "plattli.json"
    m = json.loads(mpath.read_text())
    change(m)
    mpath.write_text(json.dumps(m))
    return mpath


def _tree(root):
    """Every file under `root` with its bytes."""
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[p] = fh.read()
    return out


# -- 1: names from a manifest never lead out of the run ---------------------------------------
@pytest.mark.parametrize("writer", ["direct", "compacting"])
@pytest.mark.parametrize("shape", ["absolute", "dotdot"])
def test_resume_refuses_a_manifest_naming_files_outside_the_run(tmp_path, writer, shape):
    outside = tmp_path / "outside"
    outside.mkdir()
    for f, dt in (("victim.u8", "u1"), ("victim.f64", "<f8"), ("victim.i64", "<i8")):
        np.arange(100, dtype=dt).tofile(outside / f)
    run = tmp_path / "run"
    with cm.DirectWriter(run) as w:
        for s in range(10):
            w.write(a=s)
            w.end_step()
    name = str(outside / "victim") if shape == "absolute" else "../../outside/victim"
    entry = {"dtype": "f64", "indices": [{"start": 5, "step": 1}]}
    mpath = _edit(run, lambda m: m.update({name: entry}))
    before = _tree(tmp_path)
    open_writer = (
        (lambda: cm.DirectWriter(run, step=3))
        if writer == "direct"
        else (lambda: cm.CompactingWriter(run, step=3, hotsize=2))
    )
    with pytest.raises(CorruptRunError) as err:
        open_writer()
    assert err.value.path == str(mpath) and repr(name) in str(err.value)
    assert _tree(tmp_path) == before  # nothing cut, deleted or written, inside or out
    with cm.Reader(run) as r:
        assert name in r.metrics()
        assert r.metric("a")[1].tolist() == list(range(10))  # the sound metric still reads
        with pytest.raises(CorruptRunError, match="unsafe name"):
            r.metric(name)
        assert any(repr(name) in p for p in r.verify())
    assert _tree(tmp_path) == before


# -- 6: damaged entries -----------------------------------------------------------------------
def _seg(**kw):
    return lambda m: m["loss"].update(indices=[kw])


DAMAGE = {
    "indices is a word": lambda m: m["loss"].update(indices="foo"),
    "indices is a number": lambda m: m["loss"].update(indices=5),
    "indices missing": lambda m: m["loss"].pop("indices"),
    "segment without start": _seg(stop=5, step=1),
    "segment without step": _seg(start=0, stop=5),
    "fractional start": _seg(start=1.5, stop=6.5, step=1),
    "bool start": _seg(start=True, stop=6, step=1),
    "stop null": _seg(start=0, stop=None, step=1),
    "negative start": _seg(start=-1, stop=4, step=1),
    "zero step": _seg(start=0, stop=5, step=0),
    "empty segment": _seg(start=5, stop=5, step=1),
    "past the last step": _seg(start=TOP - 1, stop=TOP + 4, step=1),
    "segments out of order": lambda m: m["loss"].update(
        indices=[{"start": 3, "stop": 5, "step": 1}, {"start": 0, "stop": 3, "step": 1}]
    ),
    "open segment not last": lambda m: m["loss"].update(
        indices=[{"start": 0, "step": 1}, {"start": 10, "stop": 12, "step": 1}]
    ),
    "segment is a list": lambda m: m["loss"].update(indices=[[0, 5, 1]]),
    "entry is a list": lambda m: m.update(loss=["f64"]),
    "entry is null": lambda m: m.update(loss=None),
    "entry is a string": lambda m: m.update(loss="f64"),
    "unknown dtype": lambda m: m["loss"].update(dtype="f16"),
    "dtype is a list": lambda m: m["loss"].update(dtype=["f64"]),
    "bad monotonic flag": lambda m: m["loss"].update(monotonic="up"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_is_an_error_naming_manifest_and_metric(tmp_path, damage):
    run = _finished(tmp_path)
    mpath = _edit(run, DAMAGE[damage])
    before = _tree(tmp_path)
    with cm.Reader(run) as r:
        assert r.metrics() == ["acc", "loss"]  # listed, never dropped
        for read in (
            lambda: r.metric("loss"),
            lambda: r.metric("loss", idx=-1),
            lambda: r.metric("loss", istart=1),
            lambda: r.rows("loss"),
            r.manifest,
        ):
            with pytest.raises(CorruptRunError) as err:
                read()
            assert err.value.path == str(mpath) and "'loss'" in str(err.value)
        assert r.metric("acc")[1].tolist() == [0.0, 0.1, 0.2, 0.3, 0.4]
        problems = r.verify()
        assert len(problems) == 1 and str(mpath) in problems[0] and "'loss'" in problems[0]
    with pytest.raises(CorruptRunError) as err:
        cm.DirectWriter(run, step=2)
    assert err.value.path == str(mpath) and "'loss'" in str(err.value)
    assert _tree(tmp_path) == before
    assert main(["verify", str(run)]) == 1


def test_damage_in_an_archive_manifest_is_reported_the_same(tmp_path):
    import zipfile

    run = _finished(tmp_path, zip_=True)
    arc = run / "metrics.plattli"
    with zipfile.ZipFile(arc) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    m = json.loads(members["plattli.json"])
    m["loss"]["indices"] = [{"start": 0.5, "stop": 5, "step": 1}]
    members["plattli.json"] = json.dumps(m).encode()
    with zipfile.ZipFile(arc, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    with cm.Reader(run) as r:
        with pytest.raises(CorruptRunError, match="'loss'") as err:
            r.metric("loss")
        assert err.value.path == f"{arc}:plattli.json"
        assert r.metric("acc")[1].tolist() == [0.0, 0.1, 0.2, 0.3, 0.4]


def test_plattli_reads_what_the_checks_accept(tmp_path):
    """Legacy single-dict segments, an unaligned stop, and several segments still read."""
    run = _finished(tmp_path)
    _edit(
        run,
        lambda m: (
            m["loss"].update(indices={"start": 10, "stop": 19, "step": 2}),
            m["acc"].update(
                indices=[{"start": 0, "stop": 2, "step": 1}, {"start": 7, "stop": 14, "step": 3}]
            ),
        ),
    )
    with cm.Reader(run) as r:
        assert r.metric("loss")[0].tolist() == [10, 12, 14, 16, 18]
        assert r.metric("acc")[0].tolist() == [0, 1, 7, 10, 13]
        assert r.verify() == []
    assert_readers_agree(run)


# -- 3: a declared range is compared with the files before it is expanded ---------------------
def test_a_huge_declared_range_is_damage_not_an_allocation(tmp_path):
    run = _finished(tmp_path)
    _edit(run, lambda m: m["loss"].update(indices=[{"start": 0, "stop": 2**32, "step": 1}]))
    value_file = str(run / "plattli" / "loss.f64")

    def child() -> int:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # 16 GiB fails at once
        with cm.Reader(run) as r:
            for read in (
                lambda: r.rows("loss"),
                lambda: r.metric("loss"),
                lambda: r.metric("loss", idx=-1),
                lambda: r.metric("loss", istart=-2),
                lambda: r.table(["loss", "acc"]),
            ):
                try:
                    read()
                    return WRONG_DATA
                except CorruptRunError as e:
                    if e.path != value_file or "4294967296" not in str(e):
                        return WRONG_DATA
            if not any(value_file in p for p in r.verify()):
                return WRONG_DATA
        if main(["ls", str(run)]) != 1:
            return WRONG_DATA
        with cm.DirectWriter(run, step=2) as w:  # a resume keeps the rows the file holds
            w.write(loss=9.0)
            w.end_step()
        with cm.Reader(run) as r:
            ok = r.metric("loss")[1].tolist() == [0.0, 1.0, 9.0]
        return OK if ok else WRONG_DATA

    assert run_isolated(child, timeout=60) == OK


def test_a_live_range_ahead_of_its_file_reads_the_rows_written(tmp_path):
    """plattli's CompactingWriter may publish steps before their values land."""
    with cm.DirectWriter(tmp_path) as w:
        for s in range(3):
            w.write(loss=float(s))
            w.end_step()
    _edit(tmp_path, lambda m: m["loss"].update(indices=[{"start": 0, "stop": 2**32, "step": 1}]))

    def child() -> int:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        with cm.Reader(tmp_path) as r:
            steps = r.metric("loss")[0]
            ok = steps.tolist() == [0, 1, 2] and r.rows("loss") == 3
            ok = ok and int(r.metric("loss", idx=-1)[0]) == 2
        return OK if ok else WRONG_DATA

    assert run_isolated(child, timeout=60) == OK


# -- 2: steps up to the last uint32 -----------------------------------------------------------
HIGH = {
    "cadence to the top": [TOP - 2000, TOP - 1000, TOP],
    "two rows far apart": [0, 4_000_000_000],
    "the last step alone": [TOP],
    "a stride past half the range": [5, TOP],
}

#: (writer, how the run ends): a BulkWriter only writes finished runs.
ENDS = [
    (w, e)
    for w in ("direct", "compacting", "bulk")
    for e in ("live", "folder", "zip")
    if (w, e) != ("bulk", "live")
]


def _log(w, steps):
    for s in steps:
        w.step = s
        w.write(x=float(s), n=s)
        w.end_step()


@pytest.mark.parametrize("case", sorted(HIGH))
@pytest.mark.parametrize(("writer", "end"), ENDS)
def test_steps_near_the_top_read_back_in_both_packages(tmp_path, case, writer, end):
    steps = HIGH[case]
    w = {
        "direct": lambda: cm.DirectWriter(tmp_path),
        "compacting": lambda: cm.CompactingWriter(tmp_path, hotsize=2),
        "bulk": lambda: cm.BulkWriter(tmp_path),
    }[writer]()
    _log(w, steps)
    if end == "live":
        w.close()
    else:
        w.finish(zip=end == "zip")
    for reader in (cm.Reader, plattli.Reader):
        with reader(tmp_path) as r:
            assert r.metric("x")[0].tolist() == steps, reader
            assert r.metric("n", dtype="storage")[1].tolist() == steps
            assert int(r.metric("x", idx=-1)[0]) == steps[-1]
    assert_readers_agree(tmp_path)
    with cm.Reader(tmp_path) as r:
        assert r.verify() == []
        assert r.rows("x") == len(steps)
    assert main(["ls", str(tmp_path)]) == 0
    assert main(["verify", str(tmp_path)]) == 0
    assert main(["tail", str(tmp_path)]) == 0
    # and resume: the last row is cut and written again
    w = cm.DirectWriter(tmp_path, step=steps[-1], allow_resume_finalized=True)
    w.write(x=float(steps[-1]), n=steps[-1])
    w.end_step()
    w.finish()
    with cm.Reader(tmp_path) as r, plattli.Reader(tmp_path) as p:
        assert r.metric("x")[0].tolist() == p.metric("x")[0].tolist() == steps


@pytest.mark.parametrize("case", sorted(HIGH))
@pytest.mark.parametrize("writer", ["DirectWriter", "CompactingWriter"])
def test_chute_writes_the_manifest_plattli_writes_for_high_steps(tmp_path, case, writer):
    steps = HIGH[case]
    kw = {"hotsize": 2} if writer == "CompactingWriter" else {}
    runs = {}
    for mod in (cm, plattli):
        run = tmp_path / ("theirs" if mod is plattli else "ours")
        w = getattr(mod, writer)(run, **kw)
        for s in steps:
            w.step = s
            w.write(x=np.float32(s))
            w.end_step()
        w.finish(zip=False)
        runs[mod] = json.loads((run / "plattli" / "plattli.json").read_text())["x"]
        with cm.Reader(run) as r:  # plattli's too
            assert r.metric("x")[0].tolist() == steps
    if len(steps) > 1 or writer == "CompactingWriter":  # one row: a documented difference
        assert runs[cm] == runs[plattli]


def test_plattli_runs_with_high_steps_resume_in_chute(tmp_path):
    steps = HIGH["cadence to the top"]
    w = plattli.DirectWriter(tmp_path)
    _log(w, steps)
    w.finish()
    with cm.Reader(tmp_path) as r:
        assert r.metric("x")[0].tolist() == steps
    with cm.CompactingWriter(tmp_path, step=steps[1], hotsize=2, allow_resume_finalized=True) as w:
        w.write(x=1.0, n=steps[1])
        w.end_step()
    with cm.Reader(tmp_path) as r, plattli.Reader(tmp_path) as p:
        assert r.metric("x")[0].tolist() == p.metric("x")[0].tolist() == steps[:2]


def test_an_open_segment_holding_rows_past_the_last_step_is_damage(tmp_path):
    with cm.DirectWriter(tmp_path) as w:
        for s in range(4):
            w.write(x=float(s))
            w.end_step()
    _edit(tmp_path, lambda m: m["x"].update(indices=[{"start": TOP - 1, "step": 1}]))
    with cm.Reader(tmp_path) as r, pytest.raises(CorruptRunError, match="passes the last"):
        r.metric("x")


# -- 5: names the filesystem could not hold -----------------------------------------------------
WRITERS = {
    "direct": lambda p, **kw: cm.DirectWriter(p, **kw),
    "compacting": lambda p, **kw: cm.CompactingWriter(p, hotsize=2, **kw),
    "bulk": lambda p, **kw: cm.BulkWriter(p, **kw),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("a", "a.f64/b"),  # a folder where a's file is
        ("a.f64/b", "a"),  # a's file where a folder is
        ("a", "a.indices/b"),
        ("x/a", "x/a.jsonl/b"),
        (None, "hot.jsonl/x"),  # the run's own files
        (None, "plattli.json/x"),
        (None, "config.json/x"),
    ],
)
def test_names_whose_paths_clash_are_refused_at_write(tmp_path, writer, first, second):
    w = WRITERS[writer](tmp_path)
    if first is not None:
        w.write({first: "t" if first.startswith("x/") else 1.0})
        w.end_step()
    w.write(ok=1.0)
    with pytest.raises(ValueError, match="folder"):
        w.write({second: 2.0})
    with pytest.raises(ValueError, match="folder"):  # in one batch: nothing of it applied
        w.write({"late": 3.0, second: 2.0} if first else {second: 2.0, "late": 3.0})
    w.write(late=3.0)
    w.end_step()
    if first is not None:
        w.write({first: "u" if first.startswith("x/") else 4.0})
    w.end_step()
    end = w.step
    w.finish(zip=False)
    with cm.Reader(tmp_path) as r:
        assert second not in r.metrics() and r.verify() == []
        assert r.metric("late")[1].tolist() == [3.0]
    assert_readers_agree(tmp_path)
    if writer != "bulk":  # resumable, and the clash is still refused
        w = WRITERS[writer](tmp_path, step=end)
        if first is not None:
            with pytest.raises(ValueError, match="folder"):
                w.write({second: 2.0})
        w.write(late=5.0)
        w.end_step()
        w.close()
        with cm.Reader(tmp_path) as r:
            assert r.metric("late")[1].tolist() == [3.0, 5.0]


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_name_that_is_not_utf8_text_is_refused_at_write(tmp_path, writer):
    w = WRITERS[writer](tmp_path)
    w.write(ok=1.0)
    for bad in ("a\ud800", "x/\udc80y"):
        with pytest.raises(ValueError, match="surrogate"):
            w.write({bad: 1.0})
    w.end_step()
    w.write(ok=2.0)
    w.end_step()
    w.finish()
    with cm.Reader(tmp_path) as r:
        assert r.metrics() == ["ok"] and r.metric("ok")[1].tolist() == [1.0, 2.0]


def test_a_manifest_holding_a_clash_refuses_a_resume_and_reads_what_it_can(tmp_path):
    run = _finished(tmp_path)
    mpath = _edit(run, lambda m: m.update({"loss.f64/b": {"dtype": "f64", "indices": "indices"}}))
    before = _tree(tmp_path)
    with pytest.raises(CorruptRunError, match="clashes") as err:
        cm.DirectWriter(run, step=2)
    assert err.value.path == str(mpath)
    assert _tree(tmp_path) == before
    with cm.Reader(run) as r:
        assert r.metric("loss")[1].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        with pytest.raises(CorruptRunError, match="missing"):
            r.metric("loss.f64/b")


def test_from_jsonl_refuses_clashing_keys(tmp_path, capsys):
    run = tmp_path / "exp" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0, "a": 1.0, "a.f64/b": 2.0}\n')
    assert main(["from-jsonl", str(tmp_path / "exp"), "-w", "1"]) == 1
    assert "needs a folder 'a.f64'" in capsys.readouterr().err
    assert not (run / "metrics.plattli").exists()


def test_the_cli_names_a_damaged_entry(tmp_path):
    run = _finished(tmp_path)
    _edit(run, lambda m: m.update(loss=None))
    out = subprocess.run(
        [sys.executable, "-m", "chute.metrics", "ls", str(run)], capture_output=True, text=True
    )
    assert out.returncode == 1 and "plattli.json" in out.stderr and "'loss'" in out.stderr
