"""Writers through the public API: dtypes, validation, resume, config, finish."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

from chute.metrics import (
    BulkWriter,
    CompactingWriter,
    DirectWriter,
    MetricValueError,
    MetricWrittenTwiceError,
    Reader,
    WriterClosedError,
)

WRITERS = {
    "direct": lambda p, **kw: DirectWriter(p, **kw),
    "compacting": lambda p, **kw: CompactingWriter(p, hotsize=3, **kw),
    "bulk": lambda p, **kw: BulkWriter(p, **kw),
}


@pytest.fixture(params=sorted(WRITERS))
def make(request):
    return WRITERS[request.param]


def manifest(run):
    with Reader(run) as r:
        return r.manifest()


def test_auto_dtypes_and_roundtrip(tmp_path, make):
    w = make(tmp_path)
    for s in range(5):
        w.write(f=0.5 * s, i=s - 2, b=s % 2 == 0, s=f"x{s}", j={"k": [s]}, u8=np.uint8(s))
        w.write(f4=np.float32(s))
        w.write({"detail/thing0": np.float64(s)})
        w.end_step()
    w.finish(optimize=False, zip=False)
    m = manifest(tmp_path)
    assert {k: v["dtype"] for k, v in m.items()} == {
        "f": "f64",  # a Python float is a double
        "f4": "f32",
        "i": "i64",
        "b": "jsonl",
        "s": "jsonl",
        "j": "jsonl",
        "u8": "u8",
        "detail/thing0": "f64",
    }
    assert (tmp_path / "plattli" / "detail" / "thing0.f64").exists()
    with Reader(tmp_path) as r:
        steps, vals = r.metric("j")
        assert steps.tolist() == [0, 1, 2, 3, 4]
        assert vals.tolist() == [{"k": [s]} for s in range(5)]
        assert r.metric("i")[1].dtype == np.int64
        assert r.metric("u8", dtype="storage")[1].dtype == np.uint8
        assert r.metric("b")[1].tolist() == [True, False, True, False, True]


@pytest.mark.parametrize(
    ("first", "second", "code"),
    [
        (np.uint8(1), 7, "i64"),
        (np.uint8(1), np.uint8(2), "u8"),
        (1.5, np.float64(2.5), "f64"),
        (np.float64(1.5), 2.5, "f64"),
        (1.5, 3, "f64"),
        (np.float32(1.5), 3, "f32"),
        (np.float32(1.5), 2.5, "f32"),
        (np.float32(1.5), 2**40 + 1, "f64"),
        (np.uint8(1), np.int8(-1), "i16"),
        (np.uint64(2**63 + 1), 5, "u64"),
        (-5, np.uint32(7), "i64"),
    ],
)
def test_widening(tmp_path, make, first, second, code):
    w = make(tmp_path)
    w.write(x=first)
    w.end_step()
    w.write(x=second)
    w.end_step()
    w.finish(optimize=False, zip=False)
    assert manifest(tmp_path)["x"]["dtype"] == code
    with Reader(tmp_path) as r:
        got = r.metric("x", dtype=object)[1].tolist()
    assert got == [first.item() if isinstance(first, np.generic) else first, second]


@pytest.mark.parametrize(
    ("first", "second", "exc"),
    [
        (1, 1.5, TypeError),
        (1.5, "s", TypeError),
        (1, None, TypeError),
        (2**63 + 5, -1, OverflowError),
        (np.float32(1.5), 2**70, OverflowError),
        (np.float32(1.0), 1e300, OverflowError),
    ],
)
def test_rejected_values_change_nothing(tmp_path, make, first, second, exc):
    w = make(tmp_path)
    w.write(x=first, y=1.0)
    w.end_step()
    with pytest.raises(exc):
        w.write(y=2.0, x=second, z=3)  # validated as a batch: y and z must not land
    w.write(y=4.0)
    w.end_step()
    w.finish(zip=False)
    with Reader(tmp_path) as r:
        assert r.metrics() == ["x", "y"]
        assert r.metric("y")[1].tolist() == [1.0, 4.0]
        assert r.metric_indices("x").tolist() == [0]


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/abs",
        "a//b",
        "a/./b",
        "../x",
        "a\\b",
        "a\0b",
        "step",
        "hot",
        "hot.compacting",
        "run_rows",
        "when_exported",
        3,
        "x" * 250,
        "d/" + "y" * 250,
    ],
)
def test_bad_names_rejected_before_anything_is_written(tmp_path, make, name):
    w = make(tmp_path)
    w.write(ok=1)
    with pytest.raises((ValueError, TypeError)):
        w.write({name: 1})
    w.end_step()
    w.finish(zip=False)
    with Reader(tmp_path) as r:
        assert r.metrics() == ["ok"]


def test_long_but_legal_name_resumes(tmp_path):
    name = "n" * 200
    with DirectWriter(tmp_path) as w:
        w.write({name: 1.0})
        w.end_step()
    with DirectWriter(tmp_path, step=1) as w:
        w.write({name: 2.0})
        w.end_step()
    with Reader(tmp_path) as r:
        assert r.metric(name)[1].tolist() == [1.0, 2.0]


def test_duplicate_write_in_step_and_bad_arguments(tmp_path, make):
    w = make(tmp_path)
    w.write(a=1)
    with pytest.raises(ValueError, match="already written"):
        w.write(a=2)
    with pytest.raises(RuntimeError, match="already written"):  # what plattli raises
        w.write(a=2)
    with pytest.raises(TypeError):
        w.write({"b": 1}, c=2)
    with pytest.raises(ValueError):
        w.write(arr=np.zeros(3))
    with pytest.raises(TypeError):
        w.write(h=np.complex64(1))
    with pytest.raises(TypeError):
        w.write(obj=object())


def test_json_captured_at_write(tmp_path, make):
    w = make(tmp_path)
    payload = {"a": [1, 2]}
    w.write(p=payload)
    payload["a"].append(3)
    w.end_step()
    w.finish(zip=False)
    with Reader(tmp_path) as r:
        assert r.metric("p")[1].tolist() == [{"a": [1, 2]}]


@pytest.mark.parametrize("step", [-1, 2**32, 1.0, True, "3"])
def test_step_range_checked_first(tmp_path, make, step):
    with pytest.raises((TypeError, ValueError)):
        make(tmp_path / "r", step=step)
    assert not (tmp_path / "r" / "plattli").exists()


def test_last_uint32_step(tmp_path):
    w = DirectWriter(tmp_path, step=np.uint32(2**32 - 1))
    w.write(a=1)
    w.end_step()
    with pytest.raises(ValueError, match="uint32"):
        w.write(a=2)
    w.finish(zip=False)
    with Reader(tmp_path) as r:
        assert r.metric("a")[0].tolist() == [2**32 - 1]


@pytest.mark.parametrize("kind", ["direct", "compacting"])
def test_resume_truncates_at_step(tmp_path, kind):
    make = WRITERS[kind]
    w = make(tmp_path)
    for s in range(10):
        w.write(a=s, b=float(s))
        if s >= 6:
            w.write(late=s)
        w.end_step()
    w.close()
    w = make(tmp_path, step=5)
    w.write(a=100)
    w.end_step()
    w.close()
    with Reader(tmp_path) as r:
        assert r.metric("a")[0].tolist() == [0, 1, 2, 3, 4, 5]
        assert r.metric("a")[1].tolist() == [0, 1, 2, 3, 4, 100]
        assert r.metric("b")[0].tolist() == [0, 1, 2, 3, 4]
        assert "late" not in r.metrics()


def test_resume_keeps_narrow_dtype_until_widened(tmp_path):
    w = DirectWriter(tmp_path)
    w.write(a=np.uint8(1), n=3)
    w.end_step()
    w.finish(zip=True)
    with pytest.raises(FileExistsError):
        DirectWriter(tmp_path, step=1)
    w = DirectWriter(tmp_path, step=1, allow_resume_finalized=True)
    assert not (tmp_path / "metrics.plattli").exists()
    assert manifest(tmp_path)["n"]["dtype"] == "u8"  # opening never widens
    w.write(a=np.uint8(2))
    w.end_step()
    assert manifest(tmp_path)["a"]["dtype"] == "u8"
    w.write(n=4)
    w.end_step()
    assert manifest(tmp_path)["n"]["dtype"] == "i64"
    w.close()
    with Reader(tmp_path) as r:
        assert r.metric("n")[1].tolist() == [3, 4]


def test_finish_optimizes_and_zips(tmp_path, make):
    w = make(tmp_path, config={"lr": 0.1})
    for s in range(0, 20):
        w.write(loss=1.0 / (s + 1), tok=s * 1000)
        if s % 5 == 0:
            w.write(ev=-s)
        w.end_step()
    w.finish(config_overrides={"done": True})
    assert sorted(os.listdir(tmp_path)) == ["metrics.plattli"]
    with zipfile.ZipFile(tmp_path / "metrics.plattli") as zf:
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
        names = zf.namelist()
        raw = json.loads(zf.read("plattli.json"))
    assert "loss.indices" not in names
    assert raw["run_rows"] == 20
    assert raw["tok"]["dtype"] == "u16" and raw["tok"]["monotonic"] == "inc"
    assert raw["ev"]["dtype"] == "i8" and raw["ev"]["monotonic"] == "dec"
    assert raw["ev"]["indices"] == [{"start": 0, "stop": 20, "step": 5}]
    assert raw["loss"]["monotonic"] == "dec"
    with Reader(tmp_path) as r:
        assert r.config() == {"lr": 0.1, "done": True}
        assert r.metric("tok")[1].dtype == np.int64
        assert r.metric("ev")[1].tolist() == [0, -5, -10, -15]
        assert r.approx_max_rows() == 20


@pytest.mark.parametrize("kind", ["direct", "compacting"])
def test_config_link_set_and_none(tmp_path, kind):
    make = WRITERS[kind]
    (tmp_path / "config.json").write_text('{"from": "file"}')
    w = make(tmp_path)
    link = tmp_path / "plattli" / "config.json"
    assert link.is_symlink()
    w.set_config({"new": 1})
    assert not link.is_symlink() and json.loads(link.read_text()) == {"new": 1}
    assert json.loads((tmp_path / "config.json").read_text()) == {"from": "file"}
    w.write(a=1)
    w.end_step()
    w.close()
    w = make(tmp_path, step=1, config=None)
    w.close()
    with Reader(tmp_path) as r:
        assert r.config() == {"new": 1}
    with pytest.raises(TypeError):
        make(tmp_path / "x", config={"bad": object()})
    with pytest.raises(TypeError):
        make(tmp_path / "y", config=5)


def test_finish_keeps_linked_config_target(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    w = DirectWriter(tmp_path)
    w.finish(zip=False, config_overrides={"b": 2})
    assert json.loads((tmp_path / "config.json").read_text()) == {"a": 1}
    with Reader(tmp_path) as r:
        assert r.config() == {"a": 1, "b": 2}


def test_closed_writer_refuses(tmp_path, make):
    w = make(tmp_path)
    w.write(a=1)
    w.end_step()
    w.finish(zip=False)
    with pytest.raises(WriterClosedError):
        w.write(a=2)


def test_bulk_overwrite_rules(tmp_path):
    w = DirectWriter(tmp_path)
    w.write(old=1)
    w.end_step()
    w.finish(zip=False)
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        BulkWriter(tmp_path)
    b = BulkWriter(tmp_path, overwrite=True)
    b.write(new=2.0)
    b.end_step()
    b.finish(zip=True)
    assert sorted(os.listdir(tmp_path)) == ["keep.txt", "metrics.plattli"]
    with Reader(tmp_path) as r:
        assert r.metrics() == ["new"]
    b = BulkWriter(tmp_path, overwrite=True)
    b.write(third=3)
    b.end_step()
    b.finish(zip=False)
    assert sorted(os.listdir(tmp_path)) == ["keep.txt", "plattli"]
    with Reader(tmp_path) as r:
        assert r.metrics() == ["third"]


def test_compacting_hot_log_and_flush(tmp_path):
    w = CompactingWriter(tmp_path, hotsize=5)
    with pytest.raises(ValueError):
        CompactingWriter(tmp_path / "x", hotsize=0)
    for s in range(3):
        w.write(a=s)
        w.end_step()
    hot = tmp_path / "plattli" / "hot.jsonl"
    assert hot.read_text().count("\n") == 3
    w.write(a=3, b="partial")
    w.write(flush=True)
    assert '"b":"partial"' in hot.read_text()
    with Reader(tmp_path) as r:
        assert r.metric("a")[0].tolist() == [0, 1, 2, 3]
        assert r.metric("b", idx=-1) == (3, "partial")
    w.end_step()
    assert hot.read_text().count('"step":3') == 1
    for s in range(4, 40):
        w.write(a=s)
        w.end_step()
    w.finish(zip=False)
    assert not hot.exists()
    with Reader(tmp_path) as r:
        assert r.metric("a")[1].tolist() == list(range(40))


def test_compacting_declares_new_metrics_and_makes_their_files_with_the_first_rows(tmp_path):
    w = CompactingWriter(tmp_path, hotsize=8)
    names = [f"m{i:03d}" for i in range(300)]
    w.write({n: 0.5 for n in names})
    w.end_step()
    pdir = tmp_path / "plattli"
    manifest = json.loads((pdir / "plattli.json").read_text())
    assert all(manifest[n]["dtype"] == "f64" for n in names)  # declared with their dtype
    assert not list(pdir.glob("m*.f64"))  # no file yet: the rows are in the hot log
    with Reader(tmp_path) as r:
        assert r.metric("m007")[1].tolist() == [0.5]
    for s in range(1, 20):
        w.write({n: float(s) for n in names})
        w.end_step()
    w.finish(zip=False)
    with Reader(tmp_path) as r:
        assert r.metric("m299")[1].tolist() == [0.5, *map(float, range(1, 20))]
    assert len(list(pdir.glob("m*.f64"))) == 300


@pytest.mark.parametrize("make", [DirectWriter, lambda p: CompactingWriter(p, hotsize=8)])
def test_a_batch_repeated_every_step_reads_back_and_is_still_checked(tmp_path, make):
    """The same names of one float kind, step after step (the writers' short path), then a
    batch breaking each of its conditions: every row reads back, every refusal holds."""
    w = make(tmp_path)
    rng = np.random.default_rng(0)
    want = {n: [] for n in ("a", "b", "c")}
    for _ in range(30):
        row = {n: np.float32(rng.normal()) for n in want}
        w.write(row)
        w.end_step()
        for n, v in row.items():
            want[n].append(float(v))
    with pytest.raises(MetricWrittenTwiceError):
        w.write(a=np.float32(1))
        w.write(a=np.float32(2))  # twice in one step, even on the short path
    w.write(b=np.float32(0), c=np.float32(0))
    w.end_step()
    w.write(a=np.float32(np.nan), b=np.float32(np.inf), c=np.float32(-1))  # non-finite
    w.end_step()
    w.write(a=np.float32(1), b=np.float32(2), c=3)  # an int among them: widened, not cast
    w.end_step()
    w.write(a=np.float32(1), b=np.float32(2), c=1.5)  # a Python float, checked to fit f32
    w.end_step()
    with pytest.raises(MetricValueError, match="overflows float32"):
        w.write(a=np.float32(1), b=np.float32(2), c=1e39)  # one that does not: refused whole
    w.end_step()
    w.finish(zip=False)
    with Reader(tmp_path) as r:
        a, b, c = (r.metric(n)[1] for n in "abc")
        assert a.dtype == np.float32 and c.dtype == np.float32
        assert a[:30].tolist() == want["a"] and c[:30].tolist() == want["c"]
        assert np.isnan(a[31]) and np.isinf(b[31]) and c[-2:].tolist() == [3.0, 1.5]
        assert r.metric("a")[0].tolist() == [*range(30), 30, 31, 32, 33]


def test_context_manager_flushes_without_finishing(tmp_path):
    with CompactingWriter(tmp_path, hotsize=100) as w:
        w.write(a=1.0)
        w.end_step()
        w.write(a=2.0)
    assert (tmp_path / "plattli" / "plattli.json").exists()
    assert not (tmp_path / "metrics.plattli").exists()
    with Reader(tmp_path) as r:
        assert r.metric("a")[1].tolist() == [1.0, 2.0]


def test_finish_removes_orphan_columns_and_keeps_unrelated_files(tmp_path):
    w = DirectWriter(tmp_path)
    w.write(a=np.float32(1.0))
    w.end_step()
    pdir = tmp_path / "plattli"
    (pdir / "ghost.f32").write_bytes(b"\0" * 8)  # a metric created just before a crash
    (pdir / "ghost.indices").write_bytes(b"\0" * 8)
    (pdir / "notes.txt").write_text("mine")
    w.finish(zip=False)
    assert not (pdir / "ghost.f32").exists() and not (pdir / "ghost.indices").exists()
    assert (pdir / "notes.txt").read_text() == "mine"
    assert (pdir / "a.f32").exists()


def test_compacting_promotion_mid_run_with_background_batches(tmp_path):
    w = CompactingWriter(tmp_path, hotsize=3)
    for s in range(20):
        w.write(x=np.float64(s + 0.1) if s == 11 else float(s), n=np.uint8(s) if s < 9 else s)
        w.end_step()
    w.close()
    assert manifest(tmp_path)["x"]["dtype"] == "f64"
    assert manifest(tmp_path)["n"]["dtype"] == "i64"
    with Reader(tmp_path) as r:
        x = r.metric("x")[1]
        assert x.dtype == np.float64 and x[11] == 11.1 and x[19] == 19.0
        assert r.metric("n")[1].tolist() == list(range(20))


@pytest.mark.parametrize("kind", ["direct", "compacting"])
def test_resume_with_default_config_keeps_the_runs_config(tmp_path, kind):
    make = WRITERS[kind]
    w = make(tmp_path, config={"lr": 0.1})
    w.write(a=1)
    w.end_step()
    w.finish()
    w = make(tmp_path, step=1, allow_resume_finalized=True)  # config="config.json", absent
    w.write(a=2)
    w.end_step()
    w.finish()
    with Reader(tmp_path) as r:
        assert r.config() == {"lr": 0.1}
    (tmp_path / "gone.json").write_text("{}")
    w = make(tmp_path, step=2, config="gone.json", allow_resume_finalized=True)
    (tmp_path / "gone.json").unlink()  # the link now dangles
    w.close()
    w = make(tmp_path, step=2)
    w.close()
    with Reader(tmp_path) as r:
        assert r.config() == {}


@pytest.mark.parametrize("kind", ["direct", "compacting"])
def test_the_clock_logs_every_step_and_its_elapsed_time_survives_a_resume(tmp_path, kind):
    import time

    from chute.metrics import CLOCK_ELAPSED, CLOCK_WALL

    before = time.time()
    w = WRITERS[kind](tmp_path / "run", clock=True)
    for _ in range(4):
        w.write(loss=1.0)
        time.sleep(0.02)
        w.end_step()
    w.close()
    with Reader(tmp_path / "run") as r:
        steps, first = r.metric(CLOCK_ELAPSED)
        wall = r.metric(CLOCK_WALL)[1]
    assert steps.tolist() == [0, 1, 2, 3] and first.dtype == np.float64
    assert (np.diff(first) > 0).all() and before <= wall[0] <= wall[-1] <= time.time()
    time.sleep(0.5)  # the job is down: not counted
    w = WRITERS[kind](tmp_path / "run", step=2, clock=True)  # resume at a checkpoint's step
    w.end_step()  # a step with nothing else written still has its clock
    w.finish()
    with Reader(tmp_path / "run") as r:
        steps, again = r.metric(CLOCK_ELAPSED)
    assert steps.tolist() == [0, 1, 2]
    assert first[1] < again[2] < first[1] + 0.45  # goes on from step 1, the downtime left out
    w = WRITERS[kind](tmp_path / "other", clock=True)
    w.write({CLOCK_WALL: 1.0})  # a value the caller wrote at this step stands
    w.end_step()
    w.finish()
    with Reader(tmp_path / "other") as r:
        assert r.metric(CLOCK_WALL)[1].tolist() == [1.0] and r.rows(CLOCK_ELAPSED) == 1
