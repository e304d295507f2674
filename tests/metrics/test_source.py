"""The files a Reader opens: only regular files that resolve inside the run, read with a bound.

A run is a folder someone else may have written: its links and special files must not make
a reader (the dashboard, the CLI) read what lies outside it, block, or read without end.
"""

from __future__ import annotations

import json
import os

import pytest

import chute.metrics as cm
from chute.errors import UnsafeFileError
from chute.metrics import _source

from ..store.isolate import OK, WRONG_DATA, run_isolated


def _run(path, steps=5, finish=False):
    with cm.DirectWriter(path) as w:
        w.set_config({"lr": 0.1})
        for s in range(steps):
            w.write(loss=float(s))
            w.end_step()
        if finish:
            w.finish()
    return path


@pytest.fixture
def secret(tmp_path):
    """An outside folder with a JSON file and a run of its own, neither to be read."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.json").write_text(json.dumps({"token": "hunter2"}))
    _run(out / "run", steps=50)
    _run(out / "done", steps=50, finish=True)
    return out


def test_a_config_linked_out_of_the_run_is_refused(tmp_path, secret):
    run = _run(tmp_path / "r")
    cfg = run / "plattli" / "config.json"
    cfg.unlink()
    cfg.symlink_to(secret / "secret.json")
    with cm.Reader(run) as r, pytest.raises(UnsafeFileError, match="outside") as e:
        r.config()
    assert "hunter2" not in str(e.value)


def test_a_config_linked_inside_the_run_is_read(tmp_path):
    (tmp_path / "config.json").write_text('{"from": "the run folder"}')
    with cm.DirectWriter(tmp_path, config="config.json") as w:  # the writers' default link
        w.write(loss=1.0)
        w.end_step()
    assert os.path.islink(tmp_path / "plattli" / "config.json")
    for path in (tmp_path, tmp_path / "plattli"):
        with cm.Reader(path) as r:
            assert r.config() == {"from": "the run folder"}


@pytest.mark.parametrize("rel", ["hot.jsonl", "loss.f64", "plattli.json"])
def test_run_files_linked_out_are_refused(tmp_path, secret, rel):
    run = _run(tmp_path / "r")
    target = secret / "run" / "plattli" / ("loss.f64" if rel == "loss.f64" else "plattli.json")
    if rel == "hot.jsonl":
        target = secret / "secret.json"
    (run / "plattli" / rel).unlink(missing_ok=True)
    (run / "plattli" / rel).symlink_to(target)
    with pytest.raises(UnsafeFileError, match="outside"), cm.Reader(run) as r:
        r.metric("loss")


def test_an_index_file_linked_out_is_refused(tmp_path, secret):
    w = cm.DirectWriter(tmp_path / "r")
    for s in range(6):
        if s in (0, 1, 5):  # an irregular cadence: an explicit loss.indices
            w.write(loss=float(s))
        w.end_step()
    w.close()
    pdir = tmp_path / "r" / "plattli"
    assert (pdir / "loss.indices").exists()
    (pdir / "loss.indices").unlink()
    (pdir / "loss.indices").symlink_to(secret / "run" / "plattli" / "plattli.json")
    with cm.Reader(tmp_path / "r") as r:
        for read in (lambda: r.rows("loss"), lambda: r.metric("loss", idx=-1), r.verify):
            with pytest.raises(UnsafeFileError):
                read()


def test_a_plattli_folder_or_archive_linked_out_is_not_read(tmp_path, secret):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "plattli").symlink_to(secret / "run" / "plattli")
    with pytest.raises(UnsafeFileError, match="outside"), cm.Reader(tmp_path / "a") as r:
        r.metric("loss")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.plattli").symlink_to(secret / "done" / "metrics.plattli")
    assert not cm.is_run(tmp_path / "b")
    with pytest.raises(UnsafeFileError, match="outside"):
        cm.Reader(tmp_path / "b")
    # a path the caller names itself is followed: it is the run they asked for
    with cm.Reader(tmp_path / "b" / "metrics.plattli") as r:
        assert r.rows("loss") == 50


def test_whole_file_reads_stop_at_the_formats_bound(tmp_path, monkeypatch):
    w = cm.CompactingWriter(tmp_path / "r", hotsize=1000)
    for s in range(50):
        w.write(loss=float(s))
        w.end_step()  # each step a line of hot.jsonl, not yet compacted
    try:
        monkeypatch.setitem(_source.LIMITS, "hot.jsonl", 100)
        with pytest.raises(UnsafeFileError, match="more than the 100 bytes"):
            cm.Reader(tmp_path / "r").metrics()
    finally:
        w.close()


@pytest.mark.parametrize("rel", ["hot.jsonl", "config.json", "plattli.json", "loss.f64"])
def test_a_fifo_in_a_run_is_refused_without_blocking(tmp_path, rel):
    run = _run(tmp_path / "r")
    (run / "plattli" / rel).unlink(missing_ok=True)
    os.mkfifo(run / "plattli" / rel)

    def child() -> int:
        try:
            with cm.Reader(run / "plattli", kind="dir") as r:
                r.metrics()
                r.config()
                r.metric("loss")
        except UnsafeFileError as e:
            return OK if "is a FIFO" in str(e) else WRONG_DATA
        return WRONG_DATA

    assert run_isolated(child, timeout=60) == OK


def test_a_file_linked_to_dev_zero_is_refused(tmp_path):
    run = _run(tmp_path / "r")
    for rel in ("hot.jsonl", "config.json"):
        (run / "plattli" / rel).unlink(missing_ok=True)
        (run / "plattli" / rel).symlink_to("/dev/zero")

    def child() -> int:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # the original read /dev/zero
        with cm.Reader(run) as r:
            for read in (r.metrics, r.config):
                try:
                    read()
                    return WRONG_DATA
                except UnsafeFileError:
                    pass
        return OK

    assert run_isolated(child, timeout=60) == OK


def test_positional_reads_read_only_their_rows(tmp_path, monkeypatch):
    n = 10_000
    w = cm.DirectWriter(tmp_path / "r")
    for s in range(n + 1):
        if s != 3:  # a gap: explicit indices
            w.write(loss=float(s))
        w.end_step()
    w.close()
    counts: list[int] = []
    real = _source.DirSource.array

    def spy(self, rel, dtype, start, count):
        out = real(self, rel, dtype, start, count)
        counts.append(len(out))
        return out

    monkeypatch.setattr(_source.DirSource, "array", spy)
    with cm.Reader(tmp_path / "r") as r:
        steps, values = r.metric("loss", istart=5000, istop=5100)
        assert values.tolist() == [float(s) for s in range(5001, 5101)]
        assert steps.tolist() == list(range(5001, 5101))
    assert counts and max(counts) <= 100
