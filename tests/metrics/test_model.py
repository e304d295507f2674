"""Random write / end_step / resume / finish sequences against a plain-Python model."""

from __future__ import annotations

import plattli
from hypothesis import given, settings
from hypothesis import strategies as st

import chute.metrics as cm

NAMES = ["loss", "acc", "d/x", "note"]
VALUE = {
    "loss": st.floats(-1e6, 1e6, width=32),
    "acc": st.integers(-(2**31), 2**31),
    "d/x": st.integers(0, 255),
    "note": st.text(max_size=5),
}
OP = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(NAMES), st.data()),
    st.tuples(st.just("end"), st.integers(1, 3)),
    st.tuples(st.just("resume"), st.integers(0, 40)),
)


def _open(kind, path, step):
    if kind == "direct":
        return cm.DirectWriter(path, step=step, allow_resume_finalized=True)
    return cm.CompactingWriter(path, step=step, hotsize=3, allow_resume_finalized=True)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["direct", "compacting"]),
    ops=st.lists(OP, max_size=60),
    finish=st.sampled_from([None, "dir", "zip"]),
)
def test_writers_match_model(tmp_path_factory, kind, ops, finish):
    path = tmp_path_factory.mktemp("model")
    model: dict[str, list[tuple[int, object]]] = {}
    w = _open(kind, path, 0)
    written: set[str] = set()
    for op in ops:
        if op[0] == "write":
            name = op[1]
            if name in written:
                continue
            value = op[2].draw(VALUE[name])
            w.write({name: value})
            written.add(name)
            model.setdefault(name, []).append((w.step, value))
        elif op[0] == "end":
            for _ in range(op[1]):
                w.end_step()
            written = set()
        else:
            step = min(op[1], w.step)
            w.close()
            w = _open(kind, path, step)
            written = set()
            model = {n: [(s, v) for s, v in rows if s < step] for n, rows in model.items()}
    if finish is None:
        w.close()
    else:
        w.finish(zip=finish == "zip")
    expected = {n: rows for n, rows in model.items() if rows}
    with cm.Reader(path) as r, plattli.Reader(path) as p:
        assert r.metrics() == sorted(expected)
        for name, rows in expected.items():
            steps, vals = r.metric(name, dtype=object)
            assert steps.tolist() == [s for s, _ in rows], name
            assert vals.tolist() == [v for _, v in rows], name
            assert p.metric(name)[0].tolist() == steps.tolist(), name
            assert p.metric(name)[1].tolist() == r.metric(name)[1].tolist(), name
