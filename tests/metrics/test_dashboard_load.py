"""What one request may cost the dashboard: parameters read once and bounded, a run list that
never waits on a chart's read, and curves read a slice at a time. Asserted by structure
(calls counted, an event held, array sizes), never by time."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("starlette")

from chute.metrics import _source
from chute.metrics._smooth import ema, thin
from chute.metrics.dashboard import _app, _runs, _series

from .dashboard_util import client, raw_run, write_run

WAIT_S = 30  # only a hang reaches it


def run_id(c, name):
    return {r["name"]: r for r in c.get("/api/runs").json()["runs"]}[name]["id"]


def test_a_metric_named_many_times_is_read_once(tmp_path, monkeypatch):
    write_run(tmp_path / "r", steps=50).close()
    calls: list[tuple[str, int]] = []
    real = _app.read_series

    def counting(r, name, **kw):
        calls.append((name, kw["after"]))
        return real(r, name, **kw)

    monkeypatch.setattr(_app, "read_series", counting)
    with client(tmp_path) as c:
        url = f"/api/runs/{run_id(c, 'r')}/series"
        res = c.get(url, params={"metric": ["loss"] * 100})
        assert res.status_code == 200 and list(res.json()["series"]) == ["loss"]
        assert calls == [("loss", -1)]
        calls.clear()
        res = c.get(url, params={"metric": ["loss", "lr", "loss"], "after": [40, 45, 30]})
        assert sorted(calls) == [("loss", 30), ("lr", 45)]  # the earliest 'after' covers both
        assert res.json()["series"]["loss"]["x"] == list(range(31, 50))


def test_series_parameters_are_bounded(tmp_path):
    write_run(tmp_path / "r", steps=5).close()
    with client(tmp_path) as c:
        url = f"/api/runs/{run_id(c, 'r')}/series"
        # at most 256 metrics of at most 4096 characters, refused before any is looked up
        assert c.get(url, params={"metric": [f"m{k}" for k in range(257)]}).status_code == 400
        assert c.get(url, params={"metric": ["loss"] * 257}).status_code == 400
        assert c.get(url, params={"metric": "a" * 4097}).status_code == 400
        assert c.get(url, params={"metric": "loss", "x": "a" * 4097}).status_code == 400
        assert c.get(url, params={"metric": "loss", "after": "9" * 5000}).status_code == 400
        assert c.get(url, params={"metric": ["loss"] * 256}).status_code == 200


def test_the_run_list_answers_while_a_series_read_of_its_run_is_held(tmp_path, monkeypatch):
    write_run(tmp_path / "r", steps=50).close()
    inside, release = threading.Event(), threading.Event()
    real = _app.read_series

    def held(r, name, **kw):
        inside.set()
        release.wait(WAIT_S)
        return real(r, name, **kw)

    monkeypatch.setattr(_app, "read_series", held)
    with client(tmp_path) as c:
        rid = run_id(c, "r")
        chart = threading.Thread(target=lambda: c.get(f"/api/runs/{rid}/series?metric=loss"))
        chart.start()
        try:
            assert inside.wait(WAIT_S)
            listed: list[dict] = []
            poll = threading.Thread(target=lambda: listed.extend(c.get("/api/runs").json()["runs"]))
            poll.start()
            poll.join(WAIT_S)
            answered = not poll.is_alive()
        finally:
            release.set()
            chart.join()
        poll.join()
        assert answered, "the run list waited for the series read"
        assert [(r["name"], r["last_step"]) for r in listed] == [("r", 49)]


def test_a_long_column_is_read_a_slice_at_a_time(tmp_path, monkeypatch):
    n, chunk = 20_000, 1000
    rng = np.random.default_rng(4)
    steps = np.cumsum(rng.integers(1, 3, n))  # irregular: an explicit index file
    y = rng.normal(0, 1, n)
    y[7777], y[15_000] = 50.0, -50.0
    raw_run(tmp_path / "big", {"loss": (steps, y), "wall": (steps, np.arange(n) * 0.5)})
    monkeypatch.setattr(_series, "CHUNK", chunk, raising=False)
    sizes: list[int] = []
    real_array, real_read = _source.DirSource.array, _source.DirSource.read

    def array(self, rel, dtype, start, count):
        out = real_array(self, rel, dtype, start, count)
        sizes.append(len(out))
        return out

    def read(self, rel, offset=0, length=-1):
        out = real_read(self, rel, offset, length)
        if not rel.endswith(".json"):
            sizes.append(len(out or b"") // 8)
        return out

    monkeypatch.setattr(_source.DirSource, "array", array)
    monkeypatch.setattr(_source.DirSource, "read", read)
    width = 300
    with client(tmp_path) as c:
        url = f"/api/runs/{run_id(c, 'big')}/series"
        sizes.clear()
        got = c.get(url, params={"metric": "loss", "width": width, "smooth": 0.9}).json()
        assert sizes and max(sizes) <= chunk  # never the whole column or its index
        s = got["series"]["loss"]
        keep = thin(steps, y, width)  # what thinning the whole column keeps
        assert set(steps[keep].tolist()) <= set(s["x"]) and len(s["x"]) <= 4 * width
        pos = np.searchsorted(steps, s["x"])
        assert np.array_equal(s["y"], y[pos])  # every point a real row
        smooth, acc, weight = ema(y, 0.9)
        assert np.allclose(s["s"], smooth[pos]) and np.allclose(s["ema"], [acc, weight])
        assert s["rows"] == n and s["last_step"] == int(steps[-1])
        sizes.clear()
        tail = c.get(url, params={"metric": "loss", "after": int(steps[-4])}).json()
        assert tail["series"]["loss"]["x"] == steps[-3:].tolist() and max(sizes) <= chunk
        sizes.clear()
        on_x = c.get(url, params={"metric": "loss", "x": "wall", "width": width}).json()
        assert max(sizes) <= chunk
        xs = on_x["series"]["loss"]["x"]
        assert 7777 * 0.5 in xs and 15_000 * 0.5 in xs and len(xs) <= 4 * width


def test_an_unchanged_run_is_listed_without_reading_it_again(tmp_path, monkeypatch):
    w = write_run(tmp_path / "r", steps=20)
    opened: list[str] = []
    real_open, real_folder_open = _source.open_regular, _source.Folder.open

    def counting_open(path, root):
        opened.append(str(path))
        return real_open(path, root)

    def counting_folder_open(self, path, **kw):
        opened.append(str(path))
        return real_folder_open(self, path, **kw)

    monkeypatch.setattr(_source, "open_regular", counting_open)
    monkeypatch.setattr(_source.Folder, "open", counting_folder_open)
    try:
        with client(tmp_path) as c:
            c.get("/api/runs")
            reading_polls = 0
            for _ in range(_runs._REPROBE):  # a live run is probed in full once in so many
                opened.clear()
                assert c.get("/api/runs").json()["runs"][0]["last_step"] == 19
                reading_polls += bool(opened)
            assert reading_polls == 1
            w.write(loss=0.1)
            w.end_step()
            w.flush()
            assert c.get("/api/runs").json()["runs"][0]["last_step"] == 20
    finally:
        w.close()
