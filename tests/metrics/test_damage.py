"""Issue 8, metric log: no silent truncation on reopen, and damage is an error, never less data.

Crash-like cases run the writer in a child process that is killed with SIGKILL.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import plattli
import pytest

import chute.metrics as cm
from chute.errors import UnsafeFileError
from chute.metrics._cli import main

_CRASHING_WRITER = """
import sys
import chute.metrics as cm
kind, path, hotsize = sys.argv[1], sys.argv[2], int(sys.argv[3])
w = (cm.DirectWriter(path, step=0) if kind == "direct"
     else cm.CompactingWriter(path, step=0, hotsize=hotsize))
for s in range(10**9):
    w.write(loss=1.0 / (s + 1), walltime=1.7e9 + s)
    w.end_step()
    if s >= 20:
        print(s, flush=True)
"""


def _crash(kind, path, hotsize=4):
    """A writer killed with SIGKILL mid-run; returns a step it had completed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_CRASHING_WRITER), kind, str(path), str(hotsize)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    done = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    return done


@pytest.mark.parametrize("kind", ["direct", "compacting"])
def test_reopen_without_step_refuses_a_crashed_run(tmp_path, kind):
    done = _crash(kind, tmp_path)
    with cm.Reader(tmp_path) as r:
        rows = r.rows("loss")
        last = int(r.metric("loss", idx=-1)[0])
    assert rows == last + 1 and last >= done
    writer = cm.DirectWriter if kind == "direct" else cm.CompactingWriter
    kw = {} if kind == "direct" else {"hotsize": 4}
    with pytest.raises(cm.RunHasStepsError, match=rf"up to {last}; pass step={last + 1}") as e:
        writer(tmp_path, **kw)
    assert "step=0" in str(e.value) and isinstance(e.value, FileExistsError)
    with cm.Reader(tmp_path) as r:  # the refusal changed nothing
        assert r.rows("loss") == rows
    w = writer(tmp_path, step=last + 1, **kw)  # resume
    w.write(loss=0.0)
    w.end_step()
    w.close()
    with cm.Reader(tmp_path) as r:
        assert r.rows("loss") == rows + 1
    w = writer(tmp_path, step=0, **kw)  # explicit start over
    w.close()
    with cm.Reader(tmp_path) as r:
        assert r.metrics() == [] or r.rows("loss") == 0
    writer(tmp_path, **kw).close()  # an empty run opens without step=


def test_reopen_without_step_leaves_the_live_writer_of_this_process_alone(tmp_path):
    w = cm.CompactingWriter(tmp_path, hotsize=2)
    for s in range(5):
        w.write(a=s)
        w.end_step()
    with pytest.raises(cm.RunHasStepsError, match="step=5"):
        cm.DirectWriter(tmp_path)
    w.write(a=5)  # not taken over
    w.end_step()
    w.finish()
    with cm.Reader(tmp_path) as r:
        assert r.metric("a")[1].tolist() == list(range(6))


def test_reopen_without_step_refuses_a_finalized_run_before_unzipping(tmp_path):
    w = cm.DirectWriter(tmp_path)
    for s in range(3):
        w.write(a=s)
        w.end_step()
    w.finish()
    with pytest.raises(cm.RunHasStepsError, match="step=3"):
        cm.DirectWriter(tmp_path, allow_resume_finalized=True)
    assert (tmp_path / "metrics.plattli").exists() and not (tmp_path / "plattli").exists()


def test_python_float_timestamps_keep_their_precision(tmp_path):
    stamps = [1_764_600_000.0 + 0.1 * i for i in range(40)]
    for make in (
        lambda p: cm.DirectWriter(p),
        lambda p: cm.CompactingWriter(p, hotsize=7),
        lambda p: cm.BulkWriter(p),
    ):
        path = tmp_path / str(len(os.listdir(tmp_path)))
        w = make(path)
        for t in stamps:
            w.write(walltime=t)
            w.end_step()
        w.finish()
        for reader in (cm.Reader, plattli.Reader):
            with reader(path) as r:
                assert r.metric("walltime")[1].tolist() == stamps
                assert r.manifest()["walltime"]["dtype"] == "f64"


def _closed_run(path, finish=False, zip_=True):
    w = cm.DirectWriter(path)
    for s in range(10):
        w.write(loss=np.float32(s), note={"s": s})
        if s % 3 == 0:
            w.write(sparse=s)
        w.end_step()
    if finish:
        w.finish(zip=zip_)
    else:
        w.close()
    return path


@pytest.mark.parametrize("victim", ["loss.f32", "sparse.indices", "note.jsonl"])
def test_missing_column_file_in_a_folder_is_damage(tmp_path, victim):
    _closed_run(tmp_path)
    if victim == "sparse.indices":  # make the column explicit first
        w = cm.DirectWriter(tmp_path, step=10)
        w.write(sparse=11)
        w.end_step()
        w.close()
    os.unlink(tmp_path / "plattli" / victim)
    name = victim.rsplit(".", 1)[0]
    with cm.Reader(tmp_path) as r, pytest.raises(cm.RunFileMissingError, match=victim):
        r.metric(name)
    with pytest.raises(cm.RunFileMissingError, match=victim):
        cm.DirectWriter(tmp_path, step=5)  # never silently dropped on resume either


def test_missing_member_and_manifest_of_an_archive_are_damage(tmp_path):
    _closed_run(tmp_path, finish=True)
    z = tmp_path / "metrics.plattli"
    with zipfile.ZipFile(z) as zin:
        members = {n: zin.read(n) for n in zin.namelist()}
    for drop, err, match in (
        ("loss.f32", cm.RunFileMissingError, "loss.f32"),
        ("plattli.json", cm.RunFileMissingError, "plattli.json"),
    ):
        with zipfile.ZipFile(z, "w") as zout:
            for n, data in members.items():
                if n != drop:
                    zout.writestr(n, data)
        with pytest.raises(err, match=match), cm.Reader(tmp_path) as r:
            r.metric("loss")
        assert not cm.is_run(tmp_path) or drop != "plattli.json"
    z.write_bytes(b"PK not really a zip")
    with pytest.raises(cm.CorruptRunError, match="zip"):
        cm.Reader(z)


def test_junk_line_in_the_middle_of_the_hot_log_is_damage(tmp_path):
    _crash("compacting", tmp_path, hotsize=10**6)  # every row is still in the hot log
    hot = tmp_path / "plattli" / "hot.jsonl"
    lines = hot.read_bytes().split(b"\n")
    lines[2] = lines[2][:-5]  # a torn line that is not the last one
    hot.write_bytes(b"\n".join(lines))
    with cm.Reader(tmp_path) as r, pytest.raises(cm.CorruptRunError, match=r"hot.jsonl:3") as e:
        r.metric("loss")
    assert e.value.line == 3 and e.value.path.endswith("hot.jsonl")
    with pytest.raises(cm.CorruptRunError, match=r"hot.jsonl:3"):  # resuming must not drop it
        cm.CompactingWriter(tmp_path, step=5, hotsize=100)
    assert hot.read_bytes() == b"\n".join(lines)  # and leaves the evidence alone


def test_torn_last_line_after_a_crash_is_tolerated(tmp_path):
    done = _crash("compacting", tmp_path)
    hot = tmp_path / "plattli" / "hot.jsonl"
    if hot.exists():
        with open(hot, "ab") as f:
            f.write(b'{"step": 999999, "loss": 0.')  # what a kill mid-append leaves
    with cm.Reader(tmp_path) as r:
        steps = r.metric("loss")[0]
    assert steps.tolist() == list(range(len(steps))) and len(steps) > done
    w = cm.CompactingWriter(tmp_path, step=len(steps), hotsize=4)
    w.finish()
    with cm.Reader(tmp_path, verify=True) as r:
        assert r.rows("loss") == len(steps)


def test_junk_line_in_a_jsonl_column_is_damage(tmp_path):
    _closed_run(tmp_path)
    col = tmp_path / "plattli" / "note.jsonl"
    lines = col.read_bytes().split(b"\n")
    lines[4] = b'{"s": 4'
    col.write_bytes(b"\n".join(lines))
    with cm.Reader(tmp_path) as r, pytest.raises(cm.CorruptRunError, match=r"note.jsonl:5"):
        r.metric("note")


def _verify(path):
    with cm.Reader(path) as r:
        return r.verify()


def _flip(path, rng):
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(rng.choice(["loss.f32", "note.jsonl", "sparse.u8"]))
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    pos = start + rng.randrange(info.file_size)
    data[pos] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return info.filename


@pytest.mark.parametrize("seed", range(12))
def test_verify_finds_bit_flips_in_a_finished_archive(tmp_path, seed):
    _closed_run(tmp_path, finish=True)
    assert _verify(tmp_path) == []
    member = _flip(tmp_path / "metrics.plattli", random.Random(seed))
    problems = _verify(tmp_path)
    assert any(member in p and "CRC-32" in p for p in problems), problems
    with pytest.raises(cm.CorruptRunError, match=member):
        cm.Reader(tmp_path, verify=True)
    assert main(["verify", str(tmp_path)]) == 1


def test_verify_cli_and_folder_checks(tmp_path, capsys):
    _closed_run(tmp_path / "a", finish=True, zip_=False)
    assert main(["verify", str(tmp_path / "a")]) == 0
    assert "ok (3 metrics checked)" in capsys.readouterr().out
    with open(tmp_path / "a" / "plattli" / "loss.f32", "ab") as f:
        f.write(b"\0\0\0\0")  # a finished folder whose value file outgrew its steps
    assert main(["verify", str(tmp_path / "a")]) == 1
    assert "loss.f32" in capsys.readouterr().out
    _closed_run(tmp_path / "b")
    hot = tmp_path / "b" / "plattli" / "hot.jsonl"
    hot.write_bytes(b'{"step": 10, "loss": 1.0}\nnot json\n{"step": 11, "loss": 2.0}\n')
    assert main(["verify", str(tmp_path / "b")]) == 1
    assert "hot.jsonl:2" in capsys.readouterr().out


def _finished_run(path, optimize, zip_):
    """loss: 39 rows (a gap at step 5: explicit steps); note, ev: every other step (20 rows)."""
    w = cm.DirectWriter(path)
    for s in range(40):
        if s != 5:
            w.write(loss=np.float32(s))
        if s % 2 == 0:
            w.write(note={"s": s}, ev=s)
        w.end_step()
    w.finish(optimize=optimize, zip=zip_)


def _cut(path, member, keep):
    """Keep the first `keep` bytes of a column file of a folder, or of an archive's member;
    `keep` may be a function of the file's bytes."""
    z = path / "metrics.plattli"
    if not z.exists():
        f = path / "plattli" / member
        data = f.read_bytes()
        f.write_bytes(data[: keep(data) if callable(keep) else keep])
        return
    with zipfile.ZipFile(z) as zin:
        members = {n: zin.read(n) for n in zin.namelist()}
    data = members[member]
    members[member] = data[: keep(data) if callable(keep) else keep]
    with zipfile.ZipFile(z, "w") as zout:
        for n, data in members.items():
            zout.writestr(n, data)


def _lines(n, extra=0):
    """Where line `n` (from 0) of a file starts, plus `extra` bytes."""
    return lambda data: len(b"".join(data.split(b"\n")[:n])) + n + extra


_CUTS = {  # victim: [(file, bytes kept)], the metric read, what the error names
    "values": ([("loss.f32", 20 * 4)], "loss", "loss.f32"),
    "torn value": ([("loss.f32", 20 * 4 + 2)], "loss", "loss.f32"),
    "json lines": ([("note.jsonl", _lines(10))], "note", "note.jsonl"),
    "torn json": ([("note.jsonl", _lines(10, 3))], "note", "note.jsonl"),
    # Both files of the longest column cut alike: only run_rows tells.
    "values and steps": ([("loss.f32", 20 * 4), ("loss.indices", 20 * 4)], "ev", "run_rows"),
}


@pytest.mark.parametrize(
    ("victim", "layout"),
    [
        (victim, layout)
        for victim in sorted(_CUTS)
        for layout in ("optimized", "folder", "archive")
        # Optimizing turns every column's steps into ranges: no step file left to cut.
        if layout == "folder" or victim != "values and steps"
    ],
)
def test_cut_column_of_a_finished_run_is_damage_not_fewer_rows(tmp_path, victim, layout):
    cuts, name, named = _CUTS[victim]
    _finished_run(tmp_path, optimize=layout == "optimized", zip_=layout == "archive")
    assert _verify(tmp_path) == []
    for member, keep in cuts:
        _cut(tmp_path, member, keep)
    with cm.Reader(tmp_path) as r:
        assert r.finished
        for read in (
            lambda: r.metric(name),
            lambda: r.rows(name),
            lambda: r.metric(name, idx=-1),
            lambda: r.table([name, "ev"]),
        ):
            with pytest.raises(cm.CorruptRunError, match=named):
                read()
        problems = r.verify()
    assert [p for p in problems if named in p], problems
    with pytest.raises(cm.CorruptRunError, match=named):
        cm.Reader(tmp_path, verify=True)
    assert main(["verify", str(tmp_path)]) == 1


def test_cut_files_of_a_live_run_still_read_as_their_committed_rows(tmp_path):
    """A live run's tails may be torn or not yet indexed (a writer is appending, or crashed)."""
    w = cm.DirectWriter(tmp_path)
    for s in range(40):
        if s != 5:
            w.write(loss=np.float32(s))
        if s % 2 == 0:
            w.write(note={"s": s}, ev=s)
        w.end_step()
    w.close()  # not finished
    _cut(tmp_path, "loss.f32", 20 * 4 + 2)
    _cut(tmp_path, "note.jsonl", _lines(10, 3))
    with cm.Reader(tmp_path) as r:
        assert not r.finished
        assert r.rows("loss") == 20 and r.rows("note") == 10 and r.rows("ev") == 20
        assert r.verify() == []


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "[" * 100_000])
def test_a_corrupt_manifest_is_a_corrupt_run_error_naming_it(tmp_path, text):
    """Junk, a JSON non-object or a nesting deep enough to recurse out: the reader and a
    writer resuming the run both name plattli.json, and nothing is changed."""
    run = tmp_path / "run"
    with cm.DirectWriter(str(run)) as w:
        w.write(loss=0.5)
        w.end_step()
    manifest = run / "plattli" / "plattli.json"
    manifest.write_text(text)
    for attempt in (
        lambda: cm.Reader(str(run)).metrics(),
        lambda: cm.DirectWriter(str(run), step=0),
    ):
        with pytest.raises(cm.CorruptRunError) as caught:
            attempt()
        assert caught.value.path == str(manifest)
    assert manifest.read_text() == text


@pytest.mark.parametrize("writer", ["direct", "compacting"])
@pytest.mark.parametrize("victim", ["loss.f64", "hot.jsonl"])
def test_a_writer_never_writes_through_a_link_out_of_its_run(tmp_path, writer, victim):
    """A column file or hot log planted as a link to a file elsewhere is refused: the writer
    truncated or appended to the file it pointed at."""
    run, outside = tmp_path / "run", tmp_path / "victim"
    outside.write_bytes(b"keep")
    (run / "plattli").mkdir(parents=True)
    (run / "plattli" / victim).symlink_to(outside)
    if writer == "direct" and victim == "hot.jsonl":
        pytest.skip("DirectWriter keeps no hot log")
    with pytest.raises(UnsafeFileError, match=r"is a link|outside"):
        w = (
            cm.DirectWriter(str(run))
            if writer == "direct"
            else cm.CompactingWriter(str(run), hotsize=1)
        )
        w.write(loss=2.0)
        w.end_step()
        w.close()
    assert outside.read_bytes() == b"keep"
