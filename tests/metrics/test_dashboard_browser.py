"""The dashboard page in a real headless Chromium: charts, live tails, controls, refusals."""

from __future__ import annotations

import http.client
import os
import re
import shutil
from urllib.parse import urlparse

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("playwright.sync_api")

import chute.metrics as cm

from .browser_util import dashboard, open_page
from .dashboard_util import write_run

ALPHA, BETA = (31, 119, 180), (214, 39, 40)  # the page's first two run colours
NUMERIC = ["acc", "loss", "lr", "walltime"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_run(root / "alpha", steps=2000, finish=True, warmup=400)
    beta = write_run(root / "beta", steps=300, scale=100, seed=1)
    broken = root / "broken" / "plattli"
    broken.mkdir(parents=True)
    (broken / "plattli.json").write_text("{not json")
    try:
        with dashboard(root) as url:
            yield url, beta, root
    finally:
        beta.close()


@pytest.fixture
def page(browser, served, tmp_path):
    with open_page(browser, served[0], height=1000) as pg:
        pg.wait_for_function(  # every chart drawn with both runs' curves
            """names => names.every(n => {
                const card = document.querySelector(`.chart[data-metric='${n}']`);
                const drawn = card && card.querySelector('canvas') && card.dataset.lastX;
                const last = drawn && JSON.parse(card.dataset.lastX);
                return last && 'alpha' in last && 'beta' in last;
            })""",
            arg=NUMERIC,
            timeout=15000,
        )
        yield pg


def last_x(metric):
    """A JS expression: {run name: last x drawn} of a chart, {} before it is drawn."""
    card = f"document.querySelector(`.chart[data-metric='{metric}']`)"
    return f"JSON.parse({card}?.dataset.lastX || '{{}}')"


def legend(pg, metric):
    return pg.eval_on_selector_all(
        f".chart[data-metric='{metric}'] .u-legend .u-series:not(.raw) .u-label",
        "els => els.slice(1).map(e => e.textContent)",
    )


def colour_rows(pg, metric, rgb):
    """Canvas rows (as fractions of the height) holding pixels of about the colour `rgb`."""
    return pg.evaluate(
        """([metric, rgb]) => {
            const c = document.querySelector(`.chart[data-metric='${metric}'] canvas`);
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            const rows = [];
            for (let i = 0; i < d.length; i += 4) {
                const dist = Math.abs(d[i] - rgb[0]) + Math.abs(d[i + 1] - rgb[1])
                    + Math.abs(d[i + 2] - rgb[2]);
                if (dist < 60 && d[i + 3] > 200) rows.push(Math.floor(i / 4 / c.width) / c.height);
            }
            return rows;
        }""",
        [metric, list(rgb)],
    )


def test_two_runs_one_drawn_chart_per_metric_and_an_error_row(page):
    names = page.eval_on_selector_all(".chart", "els => els.map(e => e.dataset.metric)")
    assert names == NUMERIC  # the text metric 'note' gets no chart
    assert "1 text metric(s) not charted" in page.text_content("#charts-note")
    rows = page.eval_on_selector_all(
        "#runs tbody tr[data-run] td.name", "els => els.map(e => e.title)"
    )
    assert rows == ["alpha", "beta", "broken"]
    err = page.text_content("#runs tr.error:not([hidden]) td")
    assert "corrupt" in err
    for metric in NUMERIC:
        assert legend(page, metric) == ["alpha", "beta"]
        assert len(colour_rows(page, metric, ALPHA)) > 100, metric
    for metric in ("loss", "acc", "lr"):
        assert len(colour_rows(page, metric, BETA)) > 100, metric
    assert page.text_content("#runs tr[data-run] td.status") == "finished"


def test_toggling_a_run_changes_legend_and_canvas(page):
    box = page.locator("#runs tr[data-run]").filter(has_text="alpha").locator("input")
    box.uncheck()
    page.wait_for_function(
        "document.querySelectorAll(`.chart[data-metric='loss'] .u-legend .u-series`).length === 2"
    )
    assert legend(page, "loss") == ["beta"]
    assert len(colour_rows(page, "loss", ALPHA)) < 5 and len(colour_rows(page, "loss", BETA)) > 100
    box.check()
    page.wait_for_function(
        "document.querySelectorAll(`.chart[data-metric='loss'] .u-legend .u-series`).length === 3"
    )
    assert legend(page, "loss") == ["alpha", "beta"]


def test_a_step_appended_to_a_live_run_shows_within_two_seconds(page, served):
    """Within two seconds: the page polls every second (read from the script it is served,
    not timed: a loaded machine would make a stopwatch flaky) and one poll shows the step."""
    url, beta, _root = served
    script = page.request.get(url + "static/app.js").text()
    poll_ms = int(re.search(r"const POLL_MS = (\d+);", script).group(1))
    assert poll_ms <= 1000
    page.evaluate("window.__canvas = document.querySelector(`.chart[data-metric='loss'] canvas`)")
    step = beta.step
    beta.write(loss=0.75, walltime=100.0 + step, lr=1.0)
    beta.end_step()
    beta.flush()
    page.wait_for_function(f"{last_x('loss')}.beta === {step}", timeout=30_000)
    beta_row = page.locator("#runs tr[data-run]").filter(has_text="beta")
    page.wait_for_function(
        f"[...document.querySelectorAll('#runs td.step')].some(e => e.textContent === '{step}')",
        timeout=30_000,
    )
    assert beta_row.locator("td.status").text_content() == "live"
    # updated in place: the same chart canvas, not a page reload or a new chart
    assert page.evaluate(
        "window.__canvas === document.querySelector(`.chart[data-metric='loss'] canvas`)"
    )


def test_a_group_of_a_live_run_is_read_again_when_it_moves_on(page, served):
    _url, beta, _root = served
    page.fill("#group", "seed")
    page.dispatch_event("#group", "change")
    page.wait_for_function(f"'seed=1' in {last_x('loss')}")
    step = beta.step
    beta.write(loss=0.5, walltime=100.0 + step, lr=1.0)
    beta.end_step()
    beta.flush()
    page.wait_for_function(f"{last_x('loss')}['seed=1'] === {step}", timeout=10000)
    assert 1990 <= page.evaluate(f"{last_x('loss')}['seed=0']") <= 1999  # a bucket's mean step


def test_log_y_redraws_on_a_log_scale(page):
    before = colour_rows(page, "loss", ALPHA)
    page.check("#logy")
    page.wait_for_function(
        "document.querySelector(`.chart[data-metric='loss']`).dataset.logy === '1'"
    )
    after = colour_rows(page, "loss", ALPHA)
    assert len(after) > 100
    # exp decay hugs the bottom on a linear axis and becomes a straight diagonal on a log one
    assert np.mean(after) < np.mean(before) - 0.1
    page.uncheck("#logy")
    page.wait_for_function(
        "document.querySelector(`.chart[data-metric='loss']`).dataset.logy === '0'"
    )


def test_smoothing_filter_and_x_axis_controls(page):
    page.eval_on_selector(
        "#smooth", "e => { e.value = '0.9'; e.dispatchEvent(new Event('input')); }"
    )
    page.wait_for_function(
        "document.querySelectorAll(`.chart[data-metric='loss'] .u-series.raw`).length === 2"
    )
    assert page.text_content("#smooth-value") == "0.90"
    assert legend(page, "loss") == ["alpha", "beta"]
    page.fill("#filter", "^lo")
    page.wait_for_function("document.querySelectorAll('.chart').length === 1")
    assert page.eval_on_selector(".chart", "e => e.dataset.metric") == "loss"
    page.fill("#filter", "")
    page.wait_for_function("document.querySelectorAll('.chart').length === 4")
    page.select_option("#xaxis", "walltime")
    page.wait_for_function(f"{last_x('acc')}.alpha === 2090")
    labels = page.eval_on_selector_all(
        ".chart[data-metric='acc'] .u-legend .u-series .u-label",
        "els => els.map(e => e.textContent)",
    )
    assert labels[0] == "walltime"


def test_hover_shows_exact_values(page, served):
    box = page.locator(".chart[data-metric='loss'] .u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "[...document.querySelectorAll(`.chart[data-metric='loss'] .u-legend .u-value`)]"
        ".every(e => e.textContent !== '—' && e.textContent !== '--')"
    )
    values = page.eval_on_selector_all(
        ".chart[data-metric='loss'] .u-legend .u-value", "els => els.map(e => e.textContent)"
    )
    with cm.Reader(served[2] / "alpha") as r:
        loss = r.metric_values("loss")
    step = int(values[0])
    assert 0 < step < 2000
    shown = float(values[1])
    # a real row's value, as stored (to the digits shown), not an interpolation between rows
    assert np.isclose(loss, shown, rtol=1e-9, atol=0).any()


def test_traversal_urls_are_404(page, served):
    url = urlparse(served[0])
    for path in [
        "/static/../pyproject.toml",
        "/static/%2e%2e/_app.py",
        "/static/..%2f..%2fetc/passwd",
        "//etc/passwd",
        "/static//etc/passwd",
        "/api/runs/..%2f..%2f/metrics",
        "/api/runs/r0/series?metric=..%2F..%2Fbeta%2Fplattli%2Floss",
        "/api/runs/r0/series?metric=%2Fetc%2Fpasswd",
    ]:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        conn.request("GET", path)
        res = conn.getresponse()
        assert res.status == 404, path
        conn.close()
    assert page.goto(served[0] + "static/%2e%2e/%2e%2e/_runs.py").status == 404


def test_screenshot(page, tmp_path):
    out = tmp_path / "dashboard.png"
    page.screenshot(path=str(out), full_page=True)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    keep = os.environ.get("CHUTE_SCREENSHOT")
    if keep:
        shutil.copyfile(out, keep)
