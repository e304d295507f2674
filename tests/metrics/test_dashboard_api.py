"""The dashboard's HTTP API, in process: discovery, summaries, curves, live reads, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

import chute.metrics as cm
from chute.metrics import _source
from chute.metrics._smooth import ema
from chute.metrics.dashboard import create_app

from .dashboard_util import client, raw_run, runs_by_name, write_run


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "exp"
    write_run(root / "a", finish=True)
    w = write_run(root / "group" / "b", steps=120)
    yield root, w
    w.close()


def test_finds_runs_recursively_with_status_and_last_step(tree):
    root, _w = tree
    with client(root) as c:
        runs = runs_by_name(c)
        assert set(runs) == {"a", "group/b"}
        a, b = runs["a"], runs["group/b"]
        assert (a["kind"], a["status"], a["last_step"], a["metrics"]) == ("zip", "finished", 299, 5)
        assert (b["kind"], b["status"], b["last_step"]) == ("dir", "live", 119)
        assert abs(b["last_write"] - time.time()) < 600
        assert "error" not in a and "error" not in b
        cfg = c.get(f"/api/runs/{a['id']}/config").json()
        assert cfg["seed"] == 0 and cfg["lr"] == 1e-3


def test_unfinished_run_without_writes_for_long_is_idle(tmp_path):
    write_run(tmp_path / "r", steps=5).close()
    old = time.time() - 3600
    for dirpath, _dirs, files in os.walk(tmp_path / "r"):
        for f in files:
            os.utime(os.path.join(dirpath, f), (old, old))
    with client(tmp_path) as c:
        (run,) = runs_by_name(c).values()
        assert run["status"] == "idle" and abs(run["last_write"] - old) < 1


def test_runs_created_later_appear_on_a_later_listing(tmp_path, monkeypatch):
    monkeypatch.setattr("chute.metrics.dashboard._runs._RESCAN_S", 0.0)
    write_run(tmp_path / "first", steps=5).close()
    with client(tmp_path) as c:
        assert set(runs_by_name(c)) == {"first"}
        write_run(tmp_path / "later" / "second", steps=5).close()
        runs = runs_by_name(c)
        assert set(runs) == {"first", "later/second"}
        assert runs["later/second"]["last_step"] == 4


def test_a_run_path_given_directly_and_a_named_archive(tmp_path):
    write_run(tmp_path / "solo", steps=20, finish=True)
    os.rename(tmp_path / "solo" / "metrics.plattli", tmp_path / "renamed.plattli")
    write_run(tmp_path / "direct", steps=10).close()
    with client(tmp_path / "renamed.plattli", tmp_path / "direct") as c:
        runs = runs_by_name(c)
        assert set(runs) == {"renamed.plattli", "direct"}
        assert runs["renamed.plattli"]["last_step"] == 19
        assert runs["direct"]["last_step"] == 9


def test_metrics_list_carries_dtype_and_monotonic_flags(tree):
    root, _w = tree
    with client(root) as c:
        a = runs_by_name(c)["a"]
        ms = {m["name"]: m for m in c.get(f"/api/runs/{a['id']}/metrics").json()["metrics"]}
        assert set(ms) == {"acc", "loss", "lr", "note", "walltime"}
        assert ms["note"]["dtype"] == "jsonl"
        assert ms["walltime"]["monotonic"] == "inc"
        assert ms["loss"]["monotonic"] is None


def test_series_whole_then_tail_of_a_live_run(tree):
    root, w = tree
    with client(root) as c:
        b = runs_by_name(c)["group/b"]
        url = f"/api/runs/{b['id']}/series"
        full = c.get(url, params={"metric": ["loss", "acc"], "width": 800}).json()["series"]
        with cm.Reader(root / "group" / "b") as r:
            steps, loss = r.metric("loss")
        assert full["loss"]["x"] == steps.tolist()
        assert np.allclose(full["loss"]["y"], loss)
        assert full["loss"]["last_step"] == 119 and full["loss"]["rows"] == 120
        assert full["acc"]["x"] == list(range(0, 120, 10))
        for s in range(120, 125):
            w.write(loss=0.5, walltime=100.0 + s)
            w.end_step()
        w.flush()
        assert runs_by_name(c)["group/b"]["last_step"] == 124
        tail = c.get(url, params={"metric": ["loss", "acc"], "after": [119, 110]}).json()["series"]
        assert tail["loss"]["x"] == [120, 121, 122, 123, 124]
        assert tail["loss"]["y"] == [0.5] * 5
        assert tail["acc"]["x"] == [] and tail["acc"]["last_step"] == 110


def test_last_step_follows_the_busiest_metric(tmp_path):
    w = cm.DirectWriter(tmp_path / "r")
    for s in range(301):  # at step 300 the sparse 'acc' and the dense 'loss' tie
        w.write(loss=1.0, **({"acc": 0.5} if s % 100 == 0 else {}))
        w.end_step()
    w.flush()
    try:
        with client(tmp_path) as c:
            assert runs_by_name(c)["r"]["last_step"] == 300
            for _ in range(5):
                w.write(loss=2.0)
                w.end_step()
            w.flush()
            assert runs_by_name(c)["r"]["last_step"] == 305
    finally:
        w.close()


def test_a_new_metric_of_a_live_run_shows_up(tree):
    root, w = tree
    with client(root) as c:
        b = runs_by_name(c)["group/b"]
        names = lambda: {m["name"] for m in c.get(f"/api/runs/{b['id']}/metrics").json()["metrics"]}  # noqa: E731
        assert "grad" not in names()
        time.sleep(0.01)  # a distinct manifest mtime on coarse clocks
        w.write(grad=1.5)
        w.end_step()
        w.flush()
        assert "grad" in names()
        s = c.get(f"/api/runs/{b['id']}/series", params={"metric": "grad"}).json()["series"]
        assert s["grad"]["x"] == [120] and s["grad"]["y"] == [1.5]


def test_hot_rows_of_a_compacting_writer_are_served(tmp_path):
    w = cm.CompactingWriter(tmp_path / "hot", hotsize=1000)
    for s in range(7):
        w.write(loss=float(s), tag="x")
        w.end_step()
    w.flush()
    try:
        with client(tmp_path) as c:
            (run,) = runs_by_name(c).values()
            assert run["last_step"] == 6 and run["status"] == "live"
            ms = {
                m["name"]: m["dtype"]
                for m in c.get(f"/api/runs/{run['id']}/metrics").json()["metrics"]
            }
            assert ms["tag"] == "jsonl" and ms["loss"] != "jsonl"
            s = c.get(f"/api/runs/{run['id']}/series", params={"metric": ["loss", "tag"]}).json()
            assert s["series"]["loss"]["y"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
            assert "text" in s["series"]["tag"]["error"]
    finally:
        w.close()


def test_a_run_finished_while_served_is_read_from_its_archive(tree):
    root, w = tree
    with client(root) as c:
        b = runs_by_name(c)["group/b"]
        assert b["kind"] == "dir"
        w.finish()
        b = runs_by_name(c)["group/b"]
        assert (b["kind"], b["status"], b["last_step"]) == ("zip", "finished", 119)
        s = c.get(f"/api/runs/{b['id']}/series", params={"metric": "loss"}).json()["series"]
        assert s["loss"]["rows"] == 120


def test_a_run_deleted_while_served_is_an_error_row(tmp_path):
    import shutil

    write_run(tmp_path / "keep", steps=5).close()
    write_run(tmp_path / "gone", steps=5).close()
    with client(tmp_path) as c:
        assert runs_by_name(c)["gone"]["last_step"] == 4
        shutil.rmtree(tmp_path / "gone")
        runs = runs_by_name(c)
        assert "is gone" in runs["gone"]["error"] and runs["keep"]["last_step"] == 4


def test_a_long_metric_is_thinned_keeping_its_extremes(tmp_path):
    n = 200_000
    rng = np.random.default_rng(1)
    y = rng.normal(0, 1, n).astype(np.float32)
    y[123_457], y[54_321] = 40.0, -35.0
    raw_run(tmp_path / "big", {"loss": (np.arange(n) * 2, y)})
    with client(tmp_path) as c:
        (run,) = runs_by_name(c).values()
        s = c.get(f"/api/runs/{run['id']}/series", params={"metric": "loss", "width": 500}).json()
        s = s["series"]["loss"]
        assert s["rows"] == n and len(s["x"]) <= 4 * 500 and len(s["x"]) > 500
        assert s["x"] == sorted(s["x"]) and s["x"][0] == 0 and s["x"][-1] == 2 * (n - 1)
        assert max(s["y"]) == 40.0 and min(s["y"]) == -35.0
        assert 2 * 123_457 in s["x"] and 2 * 54_321 in s["x"]
        # every kept point is a real row: its value is the row's value at that step
        pos = np.asarray(s["x"]) // 2
        assert np.array_equal(np.asarray(s["y"], np.float32), y[pos])


def test_smoothing_carries_the_ema_and_its_state(tmp_path):
    y = np.linspace(0, 1, 100) ** 2
    y[10] = np.nan
    raw_run(tmp_path / "r", {"m": (np.arange(100), y)})
    with client(tmp_path) as c:
        (run,) = runs_by_name(c).values()
        url = f"/api/runs/{run['id']}/series"
        s = c.get(url, params={"metric": "m", "smooth": 0.9}).json()["series"]["m"]
        ref = ema(y, 0.9)[0]
        assert s["y"][10] is None and s["s"][10] == pytest.approx(ref[10])
        assert np.allclose(s["s"], ref)
        acc, weight = s["ema"]
        assert acc / weight == pytest.approx(ref[-1])
        plain = c.get(url, params={"metric": "m"}).json()["series"]["m"]
        assert "s" not in plain and "ema" not in plain


def test_x_axis_can_be_a_monotonic_metric(tree):
    root, _w = tree
    with client(root) as c:
        a = runs_by_name(c)["a"]
        url = f"/api/runs/{a['id']}/series"
        s = c.get(url, params={"metric": "acc", "x": "walltime"}).json()["series"]["acc"]
        assert s["x"] == [100.0 + k for k in range(0, 300, 10)]
        same = c.get(url, params={"metric": "walltime", "x": "walltime"}).json()["series"]
        assert same["walltime"]["x"] == same["walltime"]["y"] == [100.0 + k for k in range(300)]
        bad = c.get(url, params={"metric": "walltime", "x": "loss"}).json()["series"]["walltime"]
        assert "does not increase" in bad["error"]
        lacking = c.get(url, params={"metric": "acc", "x": "tokens"}).json()["series"]["acc"]
        assert lacking["error"] == "this run has no metric 'tokens' for the x axis"
        txt = c.get(url, params={"metric": "note"}).json()["series"]["note"]
        assert "text" in txt["error"]


def test_malformed_runs_are_errors_in_their_rows(tmp_path):
    write_run(tmp_path / "good", steps=10).close()
    bad = tmp_path / "bad" / "plattli"
    bad.mkdir(parents=True)
    (bad / "plattli.json").write_text("{not json")
    badcol = raw_run(tmp_path / "badcol", {"loss": (np.arange(3), np.ones(3, np.float32))})
    manifest = json.loads((badcol / "plattli" / "plattli.json").read_text())
    manifest["loss"]["dtype"] = "f99"
    (badcol / "plattli" / "plattli.json").write_text(json.dumps(manifest))
    (tmp_path / "junk.plattli").write_bytes(b"PK\x03\x04 not really a zip")
    with client(tmp_path) as c:
        runs = runs_by_name(c)
        assert runs["bad"]["status"] == "error" and "corrupt" in runs["bad"]["error"]
        assert "f99" in runs["badcol"]["error"]
        assert runs["good"]["last_step"] == 9 and "error" not in runs["good"]
        assert "error" in c.get(f"/api/runs/{runs['bad']['id']}/metrics").json()
        assert "error" in c.get(f"/api/runs/{runs['bad']['id']}/series?metric=loss").json()
        assert c.get(f"/api/runs/{runs['good']['id']}/metrics").status_code == 200


def test_traversal_and_unknown_names_are_404(tmp_path):
    root = tmp_path / "root"
    write_run(root / "a", steps=10).close()
    outside = tmp_path / "outside"
    write_run(outside / "secret", steps=10).close()
    os.symlink(outside / "secret", root / "link-out")
    # a metric of a served run whose files are links out of the run
    pdir = root / "a" / "plattli"
    secret = outside / "secret" / "plattli"
    os.symlink(secret / "loss.f32", pdir / "leak.f32")
    os.symlink(secret / "loss.indices", pdir / "leak.indices")
    manifest = json.loads((pdir / "plattli.json").read_text())
    manifest["leak"] = {"indices": "indices", "dtype": "f32"}
    (pdir / "plattli.json").write_text(json.dumps(manifest))
    with client(root) as c:
        runs = runs_by_name(c)
        assert set(runs) == {"a"}
        rid = runs["a"]["id"]
        for url in [
            "/static/../pyproject.toml",
            "/static/%2e%2e/_app.py",
            "/static/..%2f_app.py",
            "/static//etc/passwd",
            "/static/%2fetc%2fpasswd",
            "/api/runs/..%2f..%2fetc/metrics",
            "/api/runs/r99/metrics",
            f"/api/runs/{rid}/series?metric=leak",
            f"/api/runs/{rid}/series?metric=..%2F..%2Foutside%2Fsecret%2Fplattli%2Floss",
            f"/api/runs/{rid}/series?metric=%2Fetc%2Fpasswd",
            f"/api/runs/{rid}/series?metric=nope",
            f"/api/runs/{rid}/series?metric=loss&x=..%2Fx",
            "/nothing",
        ]:
            assert c.get(url).status_code == 404, url
        assert c.get(f"/api/runs/{rid}/series?metric=loss").status_code == 200


def test_bad_parameters_are_400_and_writes_are_refused(tree):
    root, _w = tree
    with client(root) as c:
        rid = runs_by_name(c)["a"]["id"]
        url = f"/api/runs/{rid}/series"
        assert c.get(url).status_code == 400
        assert c.get(url, params={"metric": "loss", "width": "wide"}).status_code == 400
        assert c.get(url, params={"metric": "loss", "smooth": "1.5"}).status_code == 400
        assert c.get(url, params={"metric": ["loss", "acc"], "after": 3}).status_code == 400
        assert c.post("/api/runs").status_code == 405
        assert c.put(f"/api/runs/{rid}/config", json={}).status_code == 405


def test_the_page_and_its_vendored_assets_are_served(tmp_path):
    with client(tmp_path) as c:
        page = c.get("/")
        assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
        js = c.get("/static/uPlot.iife.min.js")
        assert js.status_code == 200 and "v1.6.32" in js.text[:100]
        for module in ("app.js", "table.js", "charts.js", "util.js"):
            assert c.get(f"/static/{module}").status_code == 200
        assert c.get("/static/uPlot.LICENSE").text.startswith("The MIT License")
        assert c.get("/api/runs").json()["runs"] == []


def test_listing_many_runs_reads_few_columns(tmp_path, monkeypatch):
    names = [f"m{k:03d}" for k in range(60)]
    for i in range(25):
        raw_run(
            tmp_path / f"run{i:02d}", {n: (np.arange(50), np.ones(50, np.float32)) for n in names}
        )
    touched: set[str] = set()
    real_open = _source.Folder.open

    def counting_open(self, path, **kw):
        touched.add(os.fspath(path))
        return real_open(self, path, **kw)

    monkeypatch.setattr(_source.Folder, "open", counting_open)
    with client(tmp_path) as c:
        runs = runs_by_name(c)
        assert len(runs) == 25 and all(r["last_step"] == 49 for r in runs.values())
        columns = [p for p in touched if p.endswith((".f32", ".indices"))]
        assert 0 < len(columns) <= 25 * 2 * 16  # at most 16 probes of the 60 metrics per run
        before = len(touched)
        runs_by_name(c)  # a second poll reads one column per run again, nothing new
        assert len(touched) == before


def test_chute_does_not_import_the_dashboard():
    code = (
        "import sys, chute, chute.metrics, chute.metrics._cli; "
        "bad = [m for m in sys.modules if 'dashboard' in m or m.split('.')[0] in "
        "('starlette', 'uvicorn')]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_allowed_hosts_refuse_a_rebound_name(tmp_path):
    app = create_app([str(tmp_path)], allowed_hosts=["127.0.0.1", "localhost"])
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/api/runs").status_code == 200
    with TestClient(app, base_url="http://attacker.example:8000") as c:
        assert c.get("/api/runs").status_code == 400


def test_missing_paths_are_run_not_found(tmp_path):
    from chute.errors import RunNotFoundError

    with pytest.raises(RunNotFoundError, match="no such run or folder"):
        create_app([str(tmp_path / "nope")])
    with pytest.raises(FileNotFoundError):
        create_app([])
