"""Reader: selectors, dtypes, aligned tables, helpers, live-run caching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute.metrics as cm


@pytest.fixture(params=["dir", "zip", "live"])
def run(request, tmp_path):
    w = cm.CompactingWriter(tmp_path, hotsize=6)
    for s in range(40):
        w.write(loss=np.float32(40 - s), walltime=100.0 + 2 * s, tok=s * 10)
        if s % 3 == 0:
            w.write(ev=np.float64(s / 10), note={"s": s})
        if s == 39:
            w.write(big=np.uint64(2**63 + 7))
        w.end_step()
    if request.param == "live":
        yield tmp_path
        w.close()
        return
    w.finish(zip=request.param == "zip")
    yield tmp_path


def test_selectors(run):
    with cm.Reader(run) as r:
        steps, vals = r.metric("loss", start=10, stop=12)
        assert steps.tolist() == [10, 11, 12] and vals.tolist() == [30.0, 29.0, 28.0]
        assert r.metric("ev", start=4, stop=10)[0].tolist() == [6, 9]
        assert r.metric("ev", start=100)[0].tolist() == []
        assert r.metric("loss", istart=-3)[0].tolist() == [37, 38, 39]
        assert r.metric("loss", istart=2, istop=4)[0].tolist() == [2, 3]
        assert r.metric("walltime", vstart=110.0, vstop=114.0)[0].tolist() == [5, 6, 7]
        assert r.metric("loss", vstop=2.0)[0].tolist() == [38, 39]
        with pytest.raises(ValueError, match="selector"):
            r.metric("loss", start=1, istart=2)
        with pytest.raises(TypeError):
            r.metric("loss", begin=3)
        with pytest.raises(ValueError):
            r.metric("note", vstart=1)
        assert r.metric_indices("ev", istart=-1).tolist() == [39]
        assert r.metric_values("tok", start=1, stop=2).tolist() == [10, 20]


def test_idx_and_dtypes(run):
    with cm.Reader(run) as r:
        step, value = r.metric("loss", idx=-1)
        assert (step, value) == (39, 1.0) and isinstance(step, np.uint32)
        assert isinstance(value, np.float32)
        assert r.metric("tok", idx=0) == (0, 0) and isinstance(r.metric("tok", idx=0)[1], np.int64)
        assert r.metric("note", idx=1)[1] == {"s": 3}
        with pytest.raises(IndexError):
            r.metric("loss", idx=40)
        with pytest.raises(KeyError, match="nope"):
            r.metric("nope")
        assert r.metric("tok")[1].dtype == np.int64
        assert r.metric("tok", dtype=np.float32)[1].dtype == np.float32
        assert r.metric("tok", dtype=np.int8, istop=5)[1].tolist() == [0, 10, 20, 30, 40]
        with pytest.raises(OverflowError):
            r.metric("tok", dtype=np.int8)
        with pytest.raises(ValueError, match="integral"):
            r.metric("ev", dtype=np.int32)
        with pytest.raises(OverflowError, match="int64"):
            r.metric("big")
        assert r.metric("big", dtype=np.uint64)[1].tolist() == [2**63 + 7]
        assert r.metric("big", dtype="storage")[1].dtype == np.uint64
        assert r.metric("ev")[1].dtype == np.float64
        assert r.metric_indices("loss").dtype == np.uint32
        assert r.metric("loss", dtype=np.float64, istart=5, istop=5)[1].dtype == np.float64


def test_table(run):
    with cm.Reader(run) as r:
        steps, cols = r.table(["loss", "ev"])
        assert steps.tolist() == list(range(0, 40, 3)) and steps.dtype == np.uint32
        assert cols["loss"].tolist() == [40.0 - s for s in range(0, 40, 3)]
        steps, cols = r.table(iter(["walltime", "ev"]), on="walltime", vstart=110.0, vstop=130.0)
        assert steps.tolist() == [6, 9, 12, 15]
        assert cols["walltime"].tolist() == [112.0, 118.0, 124.0, 130.0]
        steps, cols = r.table(["loss", "tok"], start=5, stop=7, dtype={"tok": np.float64})
        assert steps.tolist() == [5, 6, 7] and cols["tok"].dtype == np.float64
        assert cols["loss"].dtype == np.float32
        steps, _cols = r.table(["loss", "ev"], istart=-2)
        assert steps.tolist() == [36, 39]
        with pytest.raises(ValueError):
            r.table([])
        steps, cols = r.table(["loss"], on="ev", vstart=0.5)  # aligned on ev, not returned
        assert steps.tolist() == list(range(6, 40, 3)) and list(cols) == ["loss"]
        assert cols["loss"].tolist() == [40.0 - s for s in range(6, 40, 3)]
        with pytest.raises(ValueError):
            r.table(["loss"], vstart=1.0)


def test_metadata(run):
    with cm.Reader(run) as r:
        assert r.metrics() == ["big", "ev", "loss", "note", "tok", "walltime"]
        assert r.rows("ev") == 14 and r.rows("loss") == 40
        assert r.approx_max_rows() <= 40  # hot rows are not counted on a live run
        assert isinstance(r.when_exported(), str)
        assert set(r.manifest()) == {"big", "ev", "loss", "note", "tok", "walltime"}


def test_helpers(tmp_path):
    assert not cm.is_run(tmp_path) and cm.resolve_run_dir(tmp_path) is None
    w = cm.DirectWriter(tmp_path / "d")
    w.write(a=1)
    w.end_step()
    w.finish(zip=False)
    assert cm.is_run(tmp_path / "d") and cm.is_run_dir(tmp_path / "d")
    assert cm.resolve_run_dir(tmp_path / "d") == (tmp_path / "d" / "plattli").resolve()
    assert cm.resolve_run_dir(tmp_path / "d" / "plattli") == (tmp_path / "d" / "plattli").resolve()
    w = cm.DirectWriter(tmp_path / "z")
    w.write(a=1)
    w.end_step()
    w.finish()
    assert cm.is_run(tmp_path / "z") and cm.is_run(tmp_path / "z" / "metrics.plattli")
    assert not cm.is_run_dir(tmp_path / "z")
    with cm.Reader(tmp_path / "z" / "metrics.plattli", kind="zip") as r:
        assert r.metric("a")[1].tolist() == [1]
    with pytest.raises(FileNotFoundError):
        cm.Reader(tmp_path / "nothing")
    with pytest.raises(ValueError):
        cm.Reader(tmp_path / "d", kind="tar")


def test_live_reader_caches_until_refresh(tmp_path):
    w = cm.CompactingWriter(tmp_path, hotsize=1000)
    w.write(a=1.0)
    w.end_step()
    r = cm.Reader(tmp_path)
    assert r.metrics() == ["a"]
    w.write(a=2.0, b=3)
    w.end_step()
    assert r.metrics() == ["a"]  # cached
    r.refresh()
    assert r.metrics() == ["a", "b"] and r.metric("a")[1].tolist() == [1.0, 2.0]
    with cm.Reader(tmp_path, exclude_hot=True) as cold:
        assert cold.rows("a") == 0
    w.close()
    with cm.Reader(tmp_path, exclude_hot=True) as cold:
        assert cold.rows("a") == 2


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.one_of(st.floats(allow_nan=False, width=32), st.integers(-(2**40), 2**40)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_property_roundtrip_and_interop(tmp_path_factory, ops):
    """Random gaps and values: what is written reads back, in chute and in plattli."""
    import plattli

    path = tmp_path_factory.mktemp("prop")
    w = cm.DirectWriter(path)
    expect: list[tuple[int, float | int]] = []
    kind = type(ops[0][1])
    for gap, value in ops:
        for _ in range(gap):
            w.end_step()
        if isinstance(value, kind):
            w.write(x=value)
            expect.append((w.step, value))
        w.end_step()
    w.finish()
    with cm.Reader(path) as r, plattli.Reader(path) as p:
        steps, vals = r.metric("x", dtype=object)
        assert list(zip(steps.tolist(), vals.tolist(), strict=True)) == expect
        assert p.metric("x")[0].tolist() == steps.tolist()
        assert p.metric("x")[1].tolist() == r.metric("x")[1].tolist()


def test_deflated_archive_from_elsewhere_reads(tmp_path):
    import zipfile

    w = cm.DirectWriter(tmp_path / "a")
    for s in range(10):
        w.write(x=float(s), j={"s": s})
        w.end_step()
    w.finish()
    src = tmp_path / "a" / "metrics.plattli"
    dst = tmp_path / "b" / "metrics.plattli"
    dst.parent.mkdir()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
    with cm.Reader(tmp_path / "b") as r:
        assert r.metric("x")[1].tolist() == [float(s) for s in range(10)]
        assert r.metric("x", idx=-1) == (9, 9.0)
        assert r.metric("j", istart=-1)[1].tolist() == [{"s": 9}]


def test_corrupt_manifest_is_a_clear_error_and_untouched(tmp_path):
    w = cm.DirectWriter(tmp_path)
    w.write(x=1.0)
    w.end_step()
    w.close()
    manifest = tmp_path / "plattli" / "plattli.json"
    manifest.write_bytes(b'{"x": {"indi')
    with pytest.raises(ValueError, match="corrupt"):
        cm.Reader(tmp_path).metrics()
    with pytest.raises(ValueError, match="corrupt"):
        cm.DirectWriter(tmp_path, step=1)
    assert manifest.read_bytes() == b'{"x": {"indi'
    assert (tmp_path / "plattli" / "x.f64").stat().st_size == 8


def test_table_of_one_cadence_reads_each_index_file_against_the_last(tmp_path):
    """Columns whose index files hold the same steps share one steps array (compared a chunk
    at a time, never allocated twice); a file that differs anywhere, even past the first
    chunks or in its last item, is read for what it holds."""
    from .dashboard_util import raw_run

    n = 300_000  # 1.2 MB of steps: several compare chunks
    steps = np.arange(0, 2 * n, 2, dtype=np.uint32)
    late = steps.copy()
    late[200_000:] += 1  # differs past the first chunks
    last = steps.copy()
    last[-1] += 1  # differs in its last item only
    rng = np.random.default_rng(0)
    vals = {k: rng.random(n, dtype=np.float32) for k in "abcde"}
    cols = {"a": (steps, vals["a"]), "b": (steps, vals["b"]), "c": (late, vals["c"]),
            "d": (last, vals["d"]), "e": (steps, vals["e"])}  # fmt: skip
    raw_run(tmp_path / "r", cols)
    with cm.Reader(tmp_path / "r") as r:
        got_steps, got = r.table(["a", "b", "e"])
        assert np.array_equal(got_steps, steps)
        for k in "abe":
            assert np.array_equal(got[k], vals[k])
        for k, other in (("c", late), ("d", last)):
            both, pair = r.table(["a", k])
            want = np.intersect1d(steps, other)
            assert np.array_equal(both, want)
            assert np.array_equal(pair["a"], vals["a"][np.searchsorted(steps, want)])
            assert np.array_equal(pair[k], vals[k][np.searchsorted(other, want)])
            assert np.array_equal(r.metric(k)[0], other)  # its own steps, whole
        got_steps[:] = 0  # the caller's array: later reads do not see it
        assert np.array_equal(r.table(["a", "b"])[0], steps)


def test_step_arrays_are_taken_as_equal_only_where_they_are():
    # table() skips its join for columns whose steps are the same memory: two windows of
    # one array with the same length but different starts are not
    from chute.metrics._select import same_steps

    steps = np.arange(10, dtype=np.uint32)
    assert not same_steps(steps[0:5], steps[1:6])
    assert not same_steps(steps[0:5], steps[0:10:2])
    assert same_steps(steps[2:7], steps[2:7])
    assert same_steps(steps[0:5], steps.copy()[0:5])
    assert not same_steps(steps[0:5], steps[0:4])
