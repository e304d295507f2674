"""The dashboard's runs table and groups over HTTP: config columns, queries, config diffs,
last values, group curves (mean and min-max band) against a brute-force reference."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")

import contextlib

import chute.metrics as cm

from .dashboard_util import client, runs_by_name, write_run

SWEEP = [  # (name, lr, depth, seed)
    ("a", 1e-3, 6, 0),
    ("b", 1e-3, 6, 1),
    ("c", 3e-3, 12, 0),
    ("d", 3e-3, 12, 1),
]


def _sweep(root, steps=50):
    for name, lr, depth, seed in SWEEP:
        with cm.DirectWriter(root / name) as w:
            w.set_config({"lr": lr, "model": {"depth": depth, "act": "gelu"}, "seed": seed})
            for s in range(steps):
                w.write(loss=float(lr * 1000 + depth + seed + s / steps))
                w.end_step()
    return root


def _listing(c, **params):
    res = c.get("/api/runs", params=params)
    assert res.status_code == 200, res.text
    return res.json()


def test_rows_carry_the_differing_config_keys_flattened(tmp_path):
    with client(_sweep(tmp_path)) as c:
        answer = _listing(c)
        assert answer["total"] == 4 and len(answer["runs"]) == 4
        assert answer["differ"] == ["lr", "model.depth", "seed"]  # not model.act: all equal
        assert answer["keys"] == ["lr", "model.act", "model.depth", "seed"]
        row = {r["name"]: r for r in answer["runs"]}["c"]
        assert row["config"] == {"lr": 3e-3, "model.depth": 12, "seed": 0}
        asked = _listing(c, column="model.act")  # a column the user added
        assert {r["config"]["model.act"] for r in asked["runs"]} == {"gelu"}


def test_a_run_in_error_makes_no_config_key_differ(tmp_path):
    _sweep(tmp_path)
    broken = tmp_path / "broken" / "plattli"
    broken.mkdir(parents=True)
    (broken / "plattli.json").write_text("{not json")
    with client(tmp_path) as c:
        answer = _listing(c, where="run != 'a' and run != 'b'")
        assert len(answer["runs"]) == 3 and answer["differ"] == ["seed"]


def test_a_query_filters_the_rows_and_the_differing_keys_follow(tmp_path):
    with client(_sweep(tmp_path)) as c:
        answer = _listing(c, where="lr > 2e-3 and model.depth == 12")
        assert sorted(r["name"] for r in answer["runs"]) == ["c", "d"] and answer["total"] == 4
        assert answer["differ"] == ["seed"]  # among the listed runs only seed differs
        names = lambda q: sorted(r["name"] for r in _listing(c, where=q)["runs"])  # noqa: E731
        assert names("seed == 0 or run == 'b'") == ["a", "b", "c"]
        assert names("status == 'finished'") == []  # closed, not finished
        assert names("status == 'live' and step >= 49") == ["a", "b", "c", "d"]
        assert names("config.seed == 1") == ["b", "d"]
        assert names("run ~ '^[cd]$'") == ["c", "d"]
        assert names("") == ["a", "b", "c", "d"]


def test_a_bad_query_is_400_naming_the_problem(tmp_path):
    with client(_sweep(tmp_path)) as c:
        for q in ["lr >", "(seed == 1", "lr >> 2", "name ~ '('"]:
            res = c.get("/api/runs", params={"where": q})
            assert res.status_code == 400, q
            assert res.text and "Internal" not in res.text, q


def test_last_values_of_chosen_metrics_and_queries_on_them(tmp_path):
    w = write_run(tmp_path / "live", steps=20)
    try:
        with client(tmp_path) as c:
            (row,) = _listing(c, last=["loss", "note", "nope"])["runs"]
            with cm.Reader(tmp_path / "live") as r:
                assert row["last"]["loss"] == float(r.metric_values("loss")[-1])
            assert row["last"]["note"] == "eval 10" and "nope" not in row["last"]
            assert len(_listing(c, where="loss < 10", last="loss")["runs"]) == 1
            w.write(loss=123.0, walltime=1.0, lr=1.0)
            w.end_step()
            w.flush()
            (row,) = _listing(c, last="loss")["runs"]
            assert row["last"]["loss"] == 123.0  # the run changed: read again
    finally:
        w.close()


def test_non_finite_config_values_list_as_text(tmp_path):
    with cm.DirectWriter(tmp_path / "r") as w:
        w.set_config({"clip": float("inf"), "wd": float("nan"), "betas": [0.9, 0.95]})
        w.write(loss=1.0)
        w.end_step()
    write_run(tmp_path / "other", steps=3).close()
    with client(tmp_path) as c:
        rows = {r["name"]: r for r in _listing(c)["runs"]}
        assert rows["r"]["config"] == {"clip": "inf", "wd": "nan", "betas": [0.9, 0.95]}


def test_config_diff_of_chosen_runs(tmp_path):
    with client(_sweep(tmp_path)) as c:
        ids = {n: r["id"] for n, r in runs_by_name(c).items()}
        res = c.get("/api/diff", params={"run": [ids["a"], ids["c"]]}).json()
        assert res["runs"] == ["a", "c"]
        assert {k["key"]: k["values"] for k in res["keys"]} == {
            "lr": [1e-3, 3e-3],
            "model.depth": [6, 12],
        }
        same = c.get("/api/diff", params={"run": [ids["a"], ids["a"]]}).json()
        assert same["keys"] == []
        assert c.get("/api/diff").status_code == 400
        assert c.get("/api/diff", params={"run": "r999"}).status_code == 404


def test_config_diff_says_which_configs_cannot_be_read(tmp_path):
    """A run whose config.json is damaged counts for no key: its cells are unreadable (with
    the error), never "absent"."""
    root = _sweep(tmp_path)
    damaged = next(root.glob("b/**/config.json"))
    damaged.write_text("{nope")
    with client(root) as c:
        ids = {n: r["id"] for n, r in runs_by_name(c).items()}
        res = c.get("/api/diff", params={"run": [ids["a"], ids["b"], ids["c"]]}).json()
        assert res["config_errors"][0] is None and res["config_errors"][2] is None
        assert "config" in res["config_errors"][1] or "json" in res["config_errors"][1].lower()
        keys = {k["key"]: k for k in res["keys"]}
        assert set(keys) == {"lr", "model.depth"}  # a and c differ there; b does not count
        assert all(k["unreadable"] == [False, True, False] for k in keys.values())


def test_a_group_of_a_name_no_run_can_hold_is_not_served(tmp_path):
    with client(_sweep(tmp_path)) as c:
        ids = [r["id"] for r in runs_by_name(c).values()]
        assert c.get("/api/group", params={"run": ids, "metric": "../x"}).status_code == 404


def _group(c, ids, metric="loss", **params):
    res = c.get("/api/group", params={"run": ids, "metric": metric, **params})
    assert res.status_code == 200, res.text
    return res.json()["series"][metric]


def _reference(columns, width):
    """Per bucket over the shared span: mean over runs of each run's mean, min, max, count."""
    lo = min(x[0] for x, _ in columns)
    hi = max(x[-1] for x, _ in columns)
    edges = np.linspace(lo, hi, width + 1)
    out = {"x": [], "mean": [], "min": [], "max": [], "n": []}
    for b in range(width):
        means, xs, values = [], [], []
        for x, y in columns:
            inb = (x >= edges[b]) & ((x < edges[b + 1]) if b < width - 1 else (x <= hi))
            if inb.any():
                means.append(y[inb].mean())
                xs.append(x[inb].mean())
                values.append(y[inb])
        if means:
            out["x"].append(np.mean(xs))
            out["mean"].append(np.mean(means))
            out["min"].append(np.concatenate(values).min())
            out["max"].append(np.concatenate(values).max())
            out["n"].append(len(means))
    return out


def test_a_group_is_the_mean_of_its_runs_with_a_min_max_band_of_real_rows(tmp_path):
    rng = np.random.default_rng(0)
    columns = []
    for i, (every, steps) in enumerate([(1, 3000), (3, 2400), (7, 3500)]):
        x = np.arange(0, steps, every)
        y = rng.normal(i, 1.0, len(x))
        with cm.DirectWriter(tmp_path / f"r{i}") as w:
            values = dict(zip(x.tolist(), y.tolist(), strict=True))
            for s in range(steps):
                if s in values:
                    w.write(loss=values[s])
                w.end_step()
        columns.append((x.astype(float), y))
    with client(tmp_path) as c:
        ids = [r["id"] for r in runs_by_name(c).values()]
        got = _group(c, ids, width=50)
        want = _reference(columns, 50)
        assert got["runs"] == 3 and got["rows"] == sum(len(x) for x, _ in columns)
        for key in ("x", "mean", "min", "max"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-9, err_msg=key)
        assert got["n"] == want["n"] and max(got["n"]) == 3 and min(got["n"]) == 1
        one = _group(c, ids[:1], width=50)
        assert one["runs"] == 1 and one["n"] == [1] * len(one["x"])


def test_a_group_leaves_out_runs_that_cannot_draw_and_names_them(tmp_path):
    _sweep(tmp_path)
    with cm.DirectWriter(tmp_path / "textual") as w:
        w.write(loss="high")
        w.end_step()
    with client(tmp_path) as c:
        ids = {n: r["id"] for n, r in runs_by_name(c).items()}
        got = _group(c, [ids["a"], ids["textual"]])
        assert got["runs"] == 1 and "holds text" in got["errors"]["textual"]
        by_x = _group(c, [ids["a"], ids["b"]], x="walltime")
        assert by_x["runs"] == 0 and by_x["x"] == [] and set(by_x["errors"]) == {"a", "b"}
        assert c.get("/api/group", params={"run": ids["a"]}).status_code == 400


def test_a_smoothed_group_is_computed_over_each_runs_smoothed_rows(tmp_path):
    from chute.metrics._smooth import ema

    _sweep(tmp_path, steps=40)
    with client(tmp_path) as c:
        ids = {n: r["id"] for n, r in runs_by_name(c).items()}
        got = _group(c, [ids["a"], ids["b"]], smooth=0.8, width=40)
        cols = []
        for n in ("a", "b"):
            with cm.Reader(tmp_path / n) as r:
                steps, y = r.metric("loss")
            cols.append((steps.astype(float), ema(y, 0.8)[0]))
        np.testing.assert_allclose(got["mean"], _reference(cols, 40)["mean"], rtol=1e-9)


def test_chart_readers_open_at_once_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr("chute.metrics.dashboard._runs.MAX_OPEN", 2)
    for i in range(5):
        write_run(tmp_path / f"r{i}", steps=20, finish=True)

    here = os.path.realpath(tmp_path) + os.sep  # readers of earlier tests may await collection

    def archives_open():  # distinct runs with their archive open
        fds = os.listdir("/proc/self/fd")
        links = []
        for fd in fds:
            with contextlib.suppress(OSError):
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
        return len({x for x in links if x.startswith(here) and x.endswith("metrics.plattli")})

    with client(tmp_path) as c:
        for run in runs_by_name(c).values():
            res = c.get(f"/api/runs/{run['id']}/series", params={"metric": "loss"}).json()
            assert len(res["series"]["loss"]["y"]) == 20
        assert archives_open() <= 2
        body = json.dumps(_listing(c))
        assert "NaN" not in body


def test_a_damaged_archive_lists_as_a_run_in_error_not_as_nothing(tmp_path):
    write_run(tmp_path / "good", steps=5, finish=True)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.plattli").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "loose.plattli").write_bytes(b"garbage")
    with client(tmp_path) as c:
        runs = runs_by_name(c)
        assert runs["good"]["status"] == "finished"
        for name in ("bad", "loose.plattli"):
            assert runs[name]["status"] == "error" and "zip" in runs[name]["error"].lower()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    where=st.text(st.sampled_from("ab.() =!<>~'\"`[],-1e3 andornotin\\*+?"), max_size=60),
    columns=st.lists(st.text(max_size=12), max_size=4),
)
def test_any_query_or_column_answers_200_or_400_never_500(tmp_path, where, columns):
    """Hostile runs-table parameters: a clear 400 or a listing, never a server error."""
    if not (tmp_path / "a").exists():
        _sweep(tmp_path, steps=3)
    with client(tmp_path) as c:
        res = c.get("/api/runs", params={"where": where, "column": columns, "last": columns})
        assert res.status_code in (200, 400), (where, res.status_code, res.text)
        if res.status_code == 400:
            assert res.text
        else:
            json.dumps(res.json())


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    metric=st.lists(
        st.sampled_from(["loss", "", "..", "/etc/passwd", "nope", "a/../b"]), max_size=3
    ),
    x=st.sampled_from(["step", "loss", "nope", "", "../x"]),
    width=st.sampled_from(["1", "800", "-5", "1e9", "wide"]),
    smooth=st.sampled_from(["0", "0.9", "1", "-1", "nan", "x"]),
    runs=st.lists(st.sampled_from(["r0", "r1", "r99", "", "../r0"]), max_size=3),
)
def test_any_group_request_answers_without_a_server_error(tmp_path, metric, x, width, smooth, runs):
    if not (tmp_path / "a").exists():
        _sweep(tmp_path, steps=3)
    with client(tmp_path) as c:
        params = {"metric": metric, "x": x, "width": width, "smooth": smooth, "run": runs}
        res = c.get("/api/group", params=params)
        assert res.status_code in (200, 400, 404), (params, res.status_code, res.text)
        if res.status_code == 200:
            assert "error" not in res.json(), res.json()
