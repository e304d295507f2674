"""Same calls against plattli 0.19.0 and chute.metrics: results and exception classes agree.

Where chute deliberately differs, the test pins both behaviours (docs/coming-from-plattli.md).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import zipfile

import jax.numpy as jnp
import numpy as np
import plattli
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chute.metrics as cm
from chute.errors import ChuteError
from chute.metrics._cli import main

from ._util import assert_readers_agree

try:
    import torch
except ImportError:  # no CPU build of torch for this Python here (make test-all)
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

LIBS = [plattli, cm]


def _writer(lib, kind, path, **kw):
    if kind == "compacting":
        return lib.CompactingWriter(path, hotsize=3, **kw)
    return getattr(lib, f"{kind.capitalize()}Writer")(path, **kw)


def _raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("no exception")


def _both(tmp_path, fn):
    """fn(lib, folder) for each library; returns (plattli's, chute's) results."""
    return [fn(lib, tmp_path / name) for lib, name in zip(LIBS, ("ref", "ours"), strict=True)]


# -- writer.step ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["direct", "compacting", "bulk"])
def test_step_assignment_jumps_ahead_like_plattli(tmp_path, kind):
    def run(lib, path):
        w = _writer(lib, kind, path, step=0)
        for _ in range(2):
            w.write(a=w.step)
            w.end_step()
        w.step = 1000
        w.write(a=1000, b=np.float32(0.5))
        w.end_step()
        w.step = w.step + 5
        w.write(a=1006)
        w.end_step()
        assert w.step == 1007
        w.finish(zip=False)
        with plattli.Reader(path) as r:
            return r.metric("a")[0].tolist(), r.metric("a")[1].tolist(), r.metric("b")[0].tolist()

    ref, ours = _both(tmp_path, run)
    assert ours == ref == ([0, 1, 1000, 1006], [0, 1, 1000, 1006], [1000])


@pytest.mark.parametrize("kind", ["direct", "compacting"])
def test_step_assignment_back_over_written_steps_is_refused(tmp_path, kind):
    # plattli's CompactingWriter fails with ValueError only at finish; DirectWriter writes
    # steps out of order. chute refuses at the assignment, with the same base class.
    w = plattli.CompactingWriter(tmp_path / "p", hotsize=2)
    for s in (0, 1, 10):
        w.step = s
        w.write(a=s)
        w.end_step()
    w.step = 5
    w.write(a=9)
    w.end_step()
    ref = _raised(lambda: w.finish())
    assert isinstance(ref, ValueError)

    w = _writer(cm, kind, tmp_path / "c")
    for s in range(3):
        w.write(a=s)
        w.end_step()
    with pytest.raises(ValueError, match="already written") as e:
        w.step = 1
    assert isinstance(e.value, cm.StepOrderError)
    w.write(a=3)
    with pytest.raises(cm.StepOrderError, match="end_step"):
        w.step = 10  # a half-written step cannot move
    with pytest.raises(TypeError):
        w.step = "7"
    w.end_step()
    w.step = 3 + 1  # forward is fine
    w.finish(zip=False)
    with cm.Reader(tmp_path / "c") as r:
        assert r.metric("a")[0].tolist() == [0, 1, 2, 3]


# -- exception classes --------------------------------------------------------------------------
def _finished_run(lib, path):
    w = lib.DirectWriter(path, step=0)
    w.write(a=1.0)
    w.end_step()
    w.finish()
    return path


CONDITIONS = {
    "written twice in a step": lambda lib, p: _twice(lib, p),
    "resume finalized, no flag (direct)": lambda lib, p: lib.DirectWriter(
        _finished_run(lib, p), step=0
    ),
    "resume finalized, no flag (compacting)": lambda lib, p: lib.CompactingWriter(
        _finished_run(lib, p), step=0, hotsize=2
    ),
    "non-scalar array": lambda lib, p: lib.DirectWriter(p, step=0).write(a=np.zeros(3)),
    "bad reader kind": lambda lib, p: lib.Reader(_finished_run(lib, p), kind="tar"),
    "negative step": lambda lib, p: lib.DirectWriter(p, step=-1),
    "bool step": lambda lib, p: lib.CompactingWriter(p, step=True, hotsize=2),
    "missing run": lambda lib, p: lib.Reader(p / "nope"),
    "unknown metric": lambda lib, p: lib.Reader(_finished_run(lib, p)).metric("zz"),
    "idx out of range": lambda lib, p: lib.Reader(_finished_run(lib, p)).metric("a", idx=9),
    "nprobes bool": lambda lib, p: lib.Reader(_finished_run(lib, p)).approx_max_rows(True),
    "nprobes negative": lambda lib, p: lib.Reader(_finished_run(lib, p)).approx_max_rows(-1),
    "nprobes float": lambda lib, p: lib.Reader(_finished_run(lib, p)).approx_max_rows(1.5),
    "table of nothing": lambda lib, p: lib.Reader(_finished_run(lib, p)).table([]),
    "table on unknown": lambda lib, p: lib.Reader(_finished_run(lib, p)).table(["a"], on="zz"),
    "zip without plattli.json": lambda lib, p: lib.Reader(_zip_without_manifest(p)).metrics(),
    "float into an int metric": lambda lib, p: _mix(lib, p, 1, 1.5),
    "string into a float metric": lambda lib, p: _mix(lib, p, 1.5, "x"),
    "a list into a float metric": lambda lib, p: _mix(lib, p, 1.5, [1.0, 2.0]),
    "an int past 64 bits": lambda lib, p: _mix(lib, p, 1, 2**70),
    "an archive that is not a zip": lambda lib, p: lib.Reader(_junk_archive(p)),
}
if torch is not None:
    CONDITIONS["non-scalar tensor"] = lambda lib, p: lib.DirectWriter(p, step=0).write(
        a=torch.zeros(2)
    )


def _twice(lib, path):
    w = lib.DirectWriter(path, step=0)
    w.write(a=1)
    w.write(a=2)


def _mix(lib, path, first, second):
    w = lib.DirectWriter(path, step=0)
    w.write(a=first)
    w.end_step()
    w.write(a=second)


def _junk_archive(path):
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.plattli").write_bytes(b"not a zip")
    return path


def _zip_without_manifest(path):
    path.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path / "metrics.plattli", "w") as zf:
        zf.writestr("a.f32", b"\0\0\0\0")
    return path / "metrics.plattli"


@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_exceptions_are_instances_of_what_plattli_raises(tmp_path, condition):
    make = CONDITIONS[condition]
    ref, ours = _both(tmp_path, lambda lib, p: _raised(lambda: make(lib, p)))
    assert isinstance(ours, type(ref)), (condition, ref, ours)
    if type(ours).__module__.startswith("chute"):
        assert isinstance(ours, ChuteError)


# -- reader ------------------------------------------------------------------------------------
@pytest.fixture
def cadenced(tmp_path):
    """The same run written by each library (wall every step, acc every 2nd)."""

    def write(lib, path):
        w = lib.DirectWriter(path, step=0)
        for s in range(20):
            w.write(wall=np.float64(s * 10), loss=np.float32(1.0 / (s + 1)))
            if s % 2 == 0:
                w.write(acc=np.float32(s / 10))
            w.end_step()
        w.finish(zip=False)
        return path

    return _both(tmp_path, write)


@pytest.mark.parametrize(
    ("names", "kw"),
    [
        (["loss"], {"on": "wall", "vstart": 20.0, "vstop": 60.0}),
        (["loss", "acc"], {"on": "wall"}),
        (["loss"], {"on": "acc", "istart": -3}),
        (["loss", "loss", "acc"], {}),
        (["loss", "wall"], {"on": "wall", "vstop": 35.0}),
    ],
)
def test_table_on_a_metric_not_among_names(cadenced, names, kw):
    got = []
    for lib, path in zip(LIBS, cadenced, strict=True):
        with lib.Reader(path) as r:
            steps, cols = r.table(names, **kw)
            got.append((steps.tolist(), {k: v.tolist() for k, v in cols.items()}))
    assert got[0] == got[1]


def test_resolve_run_dir_returns_a_resolved_path(tmp_path, monkeypatch):
    w = cm.DirectWriter(tmp_path / "run", step=0)
    w.close()
    os.symlink(tmp_path / "run", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    for arg in ("run", "link", tmp_path / "run" / "plattli", "link/plattli", "nope", "."):
        ref, ours = plattli.resolve_run_dir(arg), cm.resolve_run_dir(arg)
        assert ours == ref and type(ours) is type(ref), arg


@pytest.mark.parametrize("nprobes", [0, 1, 12, np.int64(3)])
def test_approx_max_rows_agrees(cadenced, nprobes):
    pairs = zip(LIBS, cadenced, strict=True)
    got = [lib.Reader(path).approx_max_rows(nprobes=nprobes) for lib, path in pairs]
    assert got[0] == got[1] == 20


# -- monotonic metadata -----------------------------------------------------------------------
_SEQS = {
    "up": [1, 2, 2, 3, 4],
    "down": [3.0, 2.0, 2.0, 1.0, 0.5],
    "flat": [1, 1, 1, 1, 1],
    "nan": [1.0, float("nan"), 2.0, 3.0, 4.0],
    "zigzag": [1, 2, 1, 2, 3],
    "flat_then_down": [2, 2, 1, 0, -1],
    "walltime": [1e9 + s for s in range(5)],
}


def _flags(lib, path):
    with lib.Reader(path) as r:
        return {k: v.get("monotonic") for k, v in r.manifest().items()}


@pytest.mark.parametrize("optimize", [False, True])
def test_monotonic_flags_match_during_run_resume_and_finish(tmp_path, optimize):
    def run(lib, path):
        seen = []
        w = lib.DirectWriter(path, step=0)
        for i in range(5):
            w.write({n: v[i] for n, v in _SEQS.items()})
            w.end_step()
            seen.append(_flags(lib, path))
        del w
        w = lib.DirectWriter(path, step=2)  # resume: flags recomputed from the kept rows
        seen.append(_flags(lib, path))
        w.write(up=0, down=np.float64(5.0))
        w.end_step()
        seen.append(_flags(lib, path))
        w.finish(optimize=optimize, zip=False)
        seen.append(_flags(lib, path))
        return seen

    ref, ours = _both(tmp_path, run)
    assert ours == ref


def test_plattli_value_range_reads_on_a_live_chute_run(tmp_path):
    w = cm.DirectWriter(tmp_path, step=0)
    for s in range(50):
        w.write(wall=1000.0 + s, loss=np.float32(50 - s), zig=s % 7)
        w.end_step()
        if s % 10 == 9:  # plattli binary-searches flagged columns of a live folder
            with plattli.Reader(tmp_path) as theirs, cm.Reader(tmp_path) as ours:
                for name, sel in (
                    ("wall", (1010.0, 1020.5)),
                    ("loss", (5.0, 30.0)),
                    ("zig", (2, 4)),
                ):
                    a = theirs.metric(name, vstart=sel[0], vstop=sel[1])
                    b = ours.metric(name, vstart=sel[0], vstop=sel[1])
                    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    w.close()


@pytest.mark.parametrize("kind", ["compacting", "bulk"])
def test_monotonic_flags_other_writers(tmp_path, kind):
    def run(lib, path):
        w = _writer(lib, kind, path, step=0)
        for i in range(5):
            w.write({n: v[i] for n, v in _SEQS.items()})
            w.end_step()
        w.finish(optimize=False, zip=False)
        return _flags(lib, path)

    ref, ours = _both(tmp_path, run)
    assert ours == ref


# -- finish and the hot log --------------------------------------------------------------------
@pytest.mark.parametrize(
    "flow",
    ["nothing", "flush only", "pending row", "pending flushed", "ended", "batch in flight"],
)
@pytest.mark.parametrize("zip_", [False, True])
def test_finish_leaves_no_hot_log(tmp_path, flow, zip_):
    def run(lib, path):
        w = lib.CompactingWriter(path, step=0, hotsize=2)
        steps = {"ended": 1, "batch in flight": 2}.get(flow, 0)
        for s in range(steps):
            w.write(x=s)
            w.end_step()
        if flow in ("pending row", "pending flushed"):
            w.write(x=7, flush=flow == "pending flushed")
        elif flow == "flush only":
            w.write(flush=True)
        w.finish(zip=zip_)
        return sorted(str(p.relative_to(path)) for p in path.rglob("*"))

    ref, ours = _both(tmp_path, run)
    assert ours == ref
    assert not any("hot" in f for f in ours)


# -- values a training loop logs ---------------------------------------------------------------
TORCH_FLOATS = (
    [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]
    if torch is not None
    else []
)


@needs_torch
@pytest.mark.parametrize("kind", ["direct", "compacting", "bulk"])
def test_torch_numpy_and_0d_values(tmp_path, kind):
    w = _writer(cm, kind, tmp_path, step=0)
    grad = torch.tensor(0.25, requires_grad=True)
    for s in range(3):
        row = {f"t/{str(dt)[6:]}": torch.tensor(1.5 + s, dtype=dt) for dt in TORCH_FLOATS}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            row["autocast"] = (torch.ones(2, 2) @ torch.ones(2, 2)).mean()  # a bf16 loss
        row.update(
            grad=grad * (s + 1),
            ti=torch.tensor(s, dtype=torch.int32),
            tu=torch.tensor(s, dtype=torch.uint8),
            np16=np.float16(0.5 * s),
            np32=np.float32(s),
            np64=np.float64(s),
            npi=np.int16(-s),
            zero_d=np.array(2.5 * s),
            zero_d32=np.array(s, dtype=np.float32),
            jax_bf16=jnp.array(0.5 + s, dtype=jnp.bfloat16),
        )
        w.write(row)
        w.end_step()
    w.finish(optimize=False, zip=False)  # keep the logged dtypes (no integer tightening)
    expect = {
        **{f"t/{str(dt)[6:]}": ("f64" if dt == torch.float64 else "f32") for dt in TORCH_FLOATS},
        "autocast": "f32",
        "grad": "f32",
        "ti": "i32",
        "tu": "u8",
        "np16": "f32",
        "np32": "f32",
        "np64": "f64",
        "npi": "i16",
        "zero_d": "f64",
        "zero_d32": "f32",
        "jax_bf16": "f32",
    }
    assert_readers_agree(tmp_path)
    with plattli.Reader(tmp_path) as r:
        assert {k: v["dtype"] for k, v in r.manifest().items()} == expect
        assert r.metric("t/bfloat16")[1].tolist() == [1.5, 2.5, 3.5]
        assert r.metric("autocast")[1].tolist() == [2.0, 2.0, 2.0]
        assert r.metric("grad")[1].tolist() == [0.25, 0.5, 0.75]
        assert r.metric("np16")[1].tolist() == [0.0, 0.5, 1.0]
        assert r.metric("jax_bf16")[1].tolist() == [0.5, 1.5, 2.5]


@pytest.mark.parametrize(
    "value",
    [
        np.float32(1.5),
        np.float64(1.5),
        np.int8(-3),
        np.uint16(9),
        np.array(2.5),
        np.array(3, dtype=np.int32),
    ]
    + (
        [torch.tensor(1.5), torch.tensor(1.5, dtype=torch.float64), torch.tensor(4)]
        if torch is not None
        else []
    ),
)
def test_values_plattli_supports_store_the_same(tmp_path, value):
    def run(lib, path):
        w = lib.DirectWriter(path, step=0)
        w.write(v=value)
        w.end_step()
        w.finish(zip=False)
        with plattli.Reader(path) as r:
            return r.manifest()["v"]["dtype"], r.metric("v", dtype="storage")[1].tolist()

    ref, ours = _both(tmp_path, run)
    assert ours == ref


def test_python_floats_are_doubles_and_plattli_reads_them(tmp_path):
    # plattli stores a Python float as f32: 40 timestamps a second apart collapse.
    stamps = [1_700_000_000.0 + 0.25 * i for i in range(40)]

    def run(lib, path):
        w = lib.DirectWriter(path, step=0)
        for t in stamps:
            w.write(walltime=t)
            w.end_step()
        w.finish()
        with plattli.Reader(path) as r:
            return r.manifest()["walltime"]["dtype"], r.metric("walltime")[1].tolist()

    (ref_code, ref_vals), (code, vals) = _both(tmp_path, run)
    assert ref_code == "f32" and len(set(ref_vals)) < 5
    assert code == "f64" and vals == stamps
    # An f32 column stays f32; explicit np.float32 asks for it.
    w = cm.DirectWriter(tmp_path / "f32", step=0)
    w.write(a=np.float32(1.0))
    w.end_step()
    w.write(a=2.5)
    w.end_step()
    w.finish(zip=False)
    with plattli.Reader(tmp_path / "f32") as r:
        assert r.manifest()["a"]["dtype"] == "f32" and r.metric("a")[1].tolist() == [1.0, 2.5]


@pytest.mark.parametrize("kind", ["direct", "compacting", "bulk"])
def test_finish_without_optimize_is_finished_like_plattli(tmp_path, kind, capsys):
    def log(lib, path):
        w = _writer(lib, kind, path)
        for s in range(7):
            w.write(loss=float(s))
            if s % 2 == 0:
                w.write(ev=s)
            if s in (0, 1, 5):
                w.write(irr=s)
            w.end_step()
        w.finish(optimize=False, zip=False)
        raw = json.loads((path / "plattli" / "plattli.json").read_bytes())
        with cm.Reader(path) as r:
            return r.finished, raw.get("run_rows"), [raw[n]["indices"] for n in r.metrics()]

    ref, ours = _both(tmp_path, log)
    assert ref[:2] == ours[:2] == (True, 7)
    for spec in ours[2]:  # no open segment left: every step is fixed
        assert spec == "indices" or all("stop" in seg for seg in spec), spec
    assert_readers_agree(tmp_path / "ours")
    assert main(["ls", str(tmp_path)]) == 0  # the folder of both runs
    states = [ln.split()[:2] for ln in capsys.readouterr().out.splitlines()[1:]]
    assert states == [["ours", "finished"], ["ref", "finished"]]


# -- command line ------------------------------------------------------------------------------
def test_tail_follow_exits_when_the_run_finishes(tmp_path, capsys):
    w = cm.CompactingWriter(tmp_path, step=0, hotsize=3)
    w.write(a=0)
    w.end_step()

    def finish_soon():
        time.sleep(0.5)
        for s in range(1, 4):
            w.write(a=s)
            w.end_step()
        w.finish()

    t = threading.Thread(target=finish_soon)
    t.start()
    # No --idle-exit: only the finished run ends the loop.
    assert main(["tail", str(tmp_path), "-f", "--interval", "0.1"]) == 0
    t.join()
    assert capsys.readouterr().out.splitlines() == [f"{s}: a={s}" for s in range(4)]


def test_ls_on_a_folder_of_runs(tmp_path, capsys):
    for name, finish in (("exp/a", True), ("exp/b", False), ("exp/sub/c", True)):
        w = cm.DirectWriter(tmp_path / name, step=0)
        for s in range(3):
            w.write(x=s)
            w.end_step()
        w.finish() if finish else w.close()
    w = plattli.DirectWriter(tmp_path / "exp" / "p", step=0)
    w.write(y=1)
    w.end_step()
    w.finish()
    os.replace(tmp_path / "exp" / "p" / "metrics.plattli", tmp_path / "exp" / "loose.plattli")
    assert main(["ls", str(tmp_path / "exp")]) == 0
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    assert lines[0] == ["run", "state", "metrics", "rows", "exported"]
    assert [ln[:4] for ln in lines[1:]] == [
        ["a", "finished", "1", "3"],
        ["b", "live", "1", "3"],
        ["loose.plattli", "finished", "1", "1"],
        ["sub/c", "finished", "1", "3"],
    ]
    assert main(["ls", str(tmp_path / "exp" / "p")]) == 1  # an empty folder: no runs


def test_damage_errors_are_instances_of_plattlis(tmp_path):
    def missing_column(lib, path):
        w = cm.DirectWriter(path, step=0)
        w.write(a=np.float32(1))
        w.end_step()
        w.close()
        os.unlink(path / "plattli" / "a.f32")
        return _raised(lambda: lib.Reader(path).metric("a"))

    def junk_hot_line(lib, path):
        w = plattli.CompactingWriter(path, hotsize=100)
        for s in range(4):
            w.write(a=s)
            w.end_step()
        hot = path / "plattli" / "hot.jsonl"
        lines = hot.read_bytes().split(b"\n")
        lines[1] = b"{bad"
        hot.write_bytes(b"\n".join(lines))
        return _raised(lambda: lib.Reader(path).metric("a"))

    for case in (missing_column, junk_hot_line):
        ref, ours = _both(tmp_path / case.__name__, case)
        assert isinstance(
            ours, type(ref).__mro__[1] if type(ref).__name__ == "JSONDecodeError" else type(ref)
        ), (case, ref, ours)
        assert isinstance(ours, cm.CorruptRunError)


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(
        st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -0.5, float("nan"), 2.0])),
        min_size=1,
        max_size=12,
    )
)
def test_monotonic_flags_match_plattli_on_random_columns(tmp_path_factory, values):
    def run(lib, path):
        w = lib.DirectWriter(path, step=0)
        floats = any(isinstance(u, float) for u in values)
        for v in values:
            w.write(x=float(v) if floats else v)
            w.end_step()
        live = _flags(lib, path)
        w.finish(optimize=False, zip=False)
        return live, _flags(lib, path)

    ref, ours = _both(tmp_path_factory.mktemp("mono"), run)
    assert ours == ref


def test_layout_a_range_is_a_segment_and_a_single_row_a_closed_one(tmp_path):
    """The on-disk difference docs/coming-from-plattli.md lists, pinned on both sides."""

    def write(lib, path, finish):
        w = lib.DirectWriter(path, step=0)
        for s in range(10):
            w.write(loss=np.float32(s))
            if s % 3 == 0:
                w.write(acc=np.float32(s))
            if s == 4:
                w.write(once=np.float32(1))
            if s in (1, 2, 7):
                w.write(irregular=np.float32(s))
            w.end_step()
        if finish:
            w.finish(zip=False, optimize=True)
        return json.loads((path / "plattli" / "plattli.json").read_text()), sorted(
            f.name for f in (path / "plattli").glob("*.indices")
        )

    for finish in (False, True):
        (_, ref_files), (ours, our_files) = _both(
            tmp_path / str(finish), functools.partial(write, finish=finish)
        )
        # live, only the broken cadence has an index file; optimize makes segments of it
        assert our_files == ([] if finish else ["irregular.indices"])
        # plattli: an index file a metric live, and still one for the single row
        want = (
            ["once.indices"]
            if finish
            else [f"{m}.indices" for m in ("acc", "irregular", "loss", "once")]
        )
        assert ref_files == want
        assert ours["once"]["indices"] == (
            [{"start": 4, "stop": 5, "step": 1}] if finish else [{"start": 4, "step": 1}]
        )
        assert ours["acc"]["indices"][0]["step"] == 3
    for lib in LIBS:  # each reads the other's folder
        other = cm if lib is plattli else plattli
        path = tmp_path / f"by-{other.__name__}"
        write(other, path, finish=False)
        assert lib.Reader(path).metric("once")[0].tolist() == [4]
