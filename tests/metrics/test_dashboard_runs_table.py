"""The dashboard's runs table, grouping, chart tools and layout in a real headless Chromium.

`CHUTE_SCREENSHOT_DIR=docs/img pytest -k layout` keeps the screenshots at 1280, 1400 and
1920 px that the dashboard docs show.
"""

from __future__ import annotations

import csv
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("playwright.sync_api")

import chute.metrics as cm

from .browser_util import dashboard, open_page

LONG = "sweep-with-a-rather-long-name/lr{lr}-depth{depth}-seed{seed}"
GROUPS = ["lr=0.001, model.depth=6", "lr=0.001, model.depth=12", "lr=0.003, model.depth=6"]


def _sweep(root):
    """Nine finished runs (lr x depth x seed, three groups of three) and one live run with
    the writer's clock but no `walltime`, so an x axis of walltime fails for it alone."""
    k = 0
    for lr, depth in [(1e-3, 6), (1e-3, 12), (3e-3, 6)]:
        for seed in range(3):
            w = cm.DirectWriter(root / LONG.format(lr=lr, depth=depth, seed=seed))
            w.set_config(
                {"lr": lr, "model": {"depth": depth, "act": "gelu"}, "seed": seed, "wd": 0.1}
            )
            rng = np.random.default_rng(k)
            for s in range(300):
                loss = np.exp(-s * lr * 5) * (1 + depth / 12) + rng.normal(0, 0.05)
                w.write(loss=float(loss), walltime=1000.0 + s, acc=float(1 - np.exp(-s / 90)))
                w.end_step()
            w.finish()
            k += 1
    w = cm.DirectWriter(root / "clocked", clock=True)
    w.set_config({"lr": 1e-2, "model": {"depth": 2, "act": "gelu"}, "seed": 0, "wd": 0.1})
    for s in range(50):
        w.write(loss=1.0 / (s + 1), acc=0.5)
        w.end_step()
    w.close()


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    _sweep(root)
    with dashboard(root) as u:
        yield u


def _ready(pg):
    """Wait for the sweep's ten rows and the loss chart."""
    pg.wait_for_function(
        "document.querySelectorAll('#runs tbody tr[data-run]').length === 10"
        " && document.querySelector(`.chart[data-metric='loss'] canvas`)"
    )


@pytest.fixture
def page(browser, url):
    with open_page(browser, url, accept_downloads=True) as pg:
        _ready(pg)
        yield pg


def names(pg):
    return pg.eval_on_selector_all(
        "#runs tbody tr[data-run] td.name", "els => els.map(e => e.title)"
    )


def headers(pg):
    return pg.eval_on_selector_all("#runs thead th[data-col]", "els => els.map(e => e.dataset.col)")


def column(pg, col):
    i = headers(pg).index(col) + 2  # after the checkbox cell; nth-child counts from 1
    return pg.eval_on_selector_all(
        f"#runs tbody tr[data-run] td:nth-child({i})", "els => els.map(e => e.textContent)"
    )


def select_only(pg, wanted):
    for row in pg.locator("#runs tbody tr[data-run]").all():
        box = row.locator("input")
        if box.is_disabled():
            continue
        name = row.locator("td.name").get_attribute("title")
        box.set_checked(name in wanted)


def test_config_columns_are_the_keys_that_differ_and_sort_by_click(page):
    cols = headers(page)
    assert [c for c in cols if c.startswith("c:")] == ["c:lr", "c:model.depth", "c:seed"]
    page.wait_for_selector("#runs th[data-col='m:loss']")  # a loss's last value, by default
    page.click("#runs th[data-col='c:seed'] button.sort")
    page.wait_for_function(
        "document.querySelector(`#runs th[data-col='c:seed']`).textContent.includes('▲')"
    )
    seeds = column(page, "c:seed")
    assert seeds == sorted(seeds)
    page.click("#runs th[data-col='c:seed'] button.sort")
    page.wait_for_function(
        "document.querySelector(`#runs th[data-col='c:seed']`).textContent.includes('▼')"
    )
    assert column(page, "c:seed") == sorted(seeds, reverse=True)
    page.click("#runs th[data-col='step'] button.sort")
    steps = [int(s) for s in column(page, "step")]
    assert steps == sorted(steps) and steps[0] == 49
    page.fill("#add-column", "model.act")
    page.dispatch_event("#add-column", "change")
    page.wait_for_function("document.querySelector(`#runs th[data-col='c:model.act']`)")
    page.wait_for_function("document.querySelector(`#runs tbody td.cfg`) !== null")
    page.wait_for_function(
        "[...document.querySelectorAll('#runs tbody tr[data-run]')].every(tr =>"
        " tr.textContent.includes('gelu'))"
    )
    page.click("#runs th[data-col='c:seed'] button.drop")
    page.wait_for_function("!document.querySelector(`#runs th[data-col='c:seed']`)")


def test_a_query_lists_the_matching_runs_and_a_bad_one_says_why(page):
    page.fill("#where", "lr > 2e-3 and model.depth == 6 and seed != 1")
    page.wait_for_function("document.querySelectorAll('#runs tbody tr[data-run]').length === 2")
    assert names(page) == [LONG.format(lr=3e-3, depth=6, seed=s) for s in (0, 2)]
    assert page.text_content("#runs-count") == "2 of 10 runs"
    page.fill("#where", "lr >")
    page.wait_for_function("document.querySelector('#where-error').textContent !== ''")
    assert "value" in page.text_content("#where-error")
    assert len(names(page)) == 2  # the last good list stays
    page.fill("#where", "")
    page.wait_for_function("document.querySelectorAll('#runs tbody tr[data-run]').length === 10")


def test_compare_configs_of_the_selected_runs(page):
    a, b = LONG.format(lr=1e-3, depth=6, seed=0), LONG.format(lr=3e-3, depth=6, seed=2)
    select_only(page, {a, b})
    page.click("#compare")
    page.wait_for_selector("#diff table.diff")
    rows = page.eval_on_selector_all(
        "#diff tbody tr", "els => els.map(tr => [...tr.children].map(td => td.textContent))"
    )
    assert rows == [["lr", "0.001", "0.003"], ["seed", "0", "2"]]


def test_grouping_draws_one_mean_with_a_band_per_group(page):
    select_only(
        page,
        {
            LONG.format(lr=lr, depth=d, seed=s)
            for lr, d in [(1e-3, 6), (1e-3, 12), (3e-3, 6)]
            for s in range(3)
        },
    )
    page.fill("#group", "lr, model.depth")
    page.dispatch_event("#group", "change")
    page.wait_for_function(
        "document.querySelectorAll(`.chart[data-metric='loss'] .u-legend .u-series:not(.band)`)"
        ".length === 4"
    )
    labels = page.eval_on_selector_all(
        ".chart[data-metric='loss'] .u-legend .u-series:not(.band) .u-label",
        "els => els.slice(1).map(e => e.textContent)",
    )
    assert sorted(labels) == sorted(f"{g} (3 runs)" for g in GROUPS)
    plot = page.evaluate(
        """() => { const u = document.querySelector(`.chart[data-metric='loss']`).chart.plot;
            return { bands: u.bands.length, series: u.series.length }; }"""
    )
    assert plot["bands"] == 3 and plot["series"] == 1 + 3 * 3
    # the band of the first group is painted: its colour at the band's alpha (0x2e)
    tint = page.evaluate(
        """() => {
            const c = document.querySelector(`.chart[data-metric='loss'] canvas`);
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0;
            for (let i = 0; i < d.length; i += 4) {
                const r = d[i] - 31, g = d[i + 1] - 119, b = d[i + 2] - 180;
                const a = d[i + 3] - 46;
                if (Math.abs(r) + Math.abs(g) + Math.abs(b) < 12 && Math.abs(a) < 4) n++;
            }
            return n;
        }"""
    )
    assert tint > 200
    page.fill("#group", "")
    page.dispatch_event("#group", "change")
    page.wait_for_function(
        "document.querySelectorAll(`.chart[data-metric='loss'] .u-legend .u-series`).length === 10"
    )


def test_enlarge_a_chart_and_export_what_it_shows_as_csv(page):
    card = ".chart[data-metric='acc']"
    before = page.eval_on_selector(f"{card} canvas", "c => c.getBoundingClientRect().width")
    page.click(f"{card} button.wide-toggle")
    page.wait_for_function(f"document.querySelector(`{card}`).classList.contains('wide')")
    # the chart is drawn anew at its new size: its canvas may be swapped in after the class
    page.wait_for_function(
        f"document.querySelector(`{card} canvas`).getBoundingClientRect().width > {1.8 * before}"
    )
    after = page.eval_on_selector(f"{card} canvas", "c => c.getBoundingClientRect()")
    assert after["width"] > 1.8 * before and after["height"] > 400
    with page.expect_download() as dl:
        page.click(f"{card} button.csv")
    download = dl.value
    assert download.suggested_filename == "acc.csv"
    with open(download.path(), newline="") as f:
        rows = list(csv.reader(f))
    shown = page.evaluate(
        f"""() => {{ const u = document.querySelector(`{card}`).chart.plot;
            return {{ labels: u.series.map(s => s.label), n: u.data[0].length }}; }}"""
    )
    assert rows[0] == shown["labels"] and rows[0][0] == "step"
    assert len(rows) - 1 == shown["n"]
    run = next(label for label in rows[0][1:] if label != "clocked")
    col = rows[0].index(run)
    got = [(int(r[0]), float(r[col])) for r in rows[1:] if r[col]]
    assert len(got) == 300  # every row of a 300-step run fits the wide chart
    assert np.allclose([v for _, v in got], [1 - np.exp(-s / 90) for s, _ in got], rtol=1e-6)


def test_elapsed_time_is_an_x_axis_with_clock_ticks(page):
    select_only(page, {"clocked"})
    page.wait_for_function(
        "[...document.querySelectorAll('#xaxis option')].some(o => o.value === 'clock/elapsed')"
    )
    label = page.eval_on_selector("#xaxis option[value='clock/elapsed']", "o => o.textContent")
    assert label == "elapsed time (clock/elapsed)"
    page.select_option("#xaxis", "clock/elapsed")
    page.wait_for_function(
        "(() => { const c = document.querySelector(`.chart[data-metric='loss']`);"
        " return c && c.dataset.lastX && 'clocked' in JSON.parse(c.dataset.lastX); })()"
    )
    last = page.evaluate(
        "JSON.parse(document.querySelector(`.chart[data-metric='loss']`).dataset.lastX).clocked"
    )
    assert 0 <= last < 600


def test_an_error_shared_by_charts_is_said_once(page):
    select_only(page, {"clocked", LONG.format(lr=1e-3, depth=6, seed=0)})
    page.select_option("#xaxis", "walltime")
    page.wait_for_function("!document.querySelector('#chart-errors').hidden")
    text = page.text_content("#chart-errors")
    assert text.count("clocked") == 1 and "walltime" in text and "(on 4 charts)" in text
    per_chart = page.eval_on_selector_all(".chart .errors", "els => els.map(e => e.textContent)")
    assert not any("clocked" in t for t in per_chart)


@pytest.mark.parametrize("width", [1280, 1400, 1920])
def test_layout_nothing_clipped_or_covered(browser, url, width, tmp_path):
    with open_page(browser, url, width=width) as pg:
        _ready(pg)
        _check_layout(pg, width, tmp_path)


def _check_layout(pg, width, tmp_path):
    problems = pg.evaluate(
        """() => {
            const out = [];
            const header = document.querySelector('header').getBoundingClientRect();
            for (const sel of ['#where', '#runs thead', '#charts-note', '.chart h2']) {
                const el = document.querySelector(sel);
                const r = el.getBoundingClientRect();
                const hit = document.elementFromPoint(r.left + 4, r.top + r.height / 2);
                const seen = el === hit || el.contains(hit);
                if (r.top < header.bottom || !seen) out.push(`${sel} covered`);
            }
            const cut = '#runs th, #runs td.name, .chart h2 .title';
            for (const el of document.querySelectorAll(cut)) {
                if (el.scrollWidth > el.clientWidth + 1) out.push(`clipped: ${el.textContent}`);
            }
            return out;
        }"""
    )
    assert problems == []
    if width == 1400:  # the docs show groups at this width
        pg.fill("#group", "lr, model.depth")
        pg.dispatch_event("#group", "change")
        pg.wait_for_function(
            "document.querySelectorAll(`.chart[data-metric='loss'] .u-legend .u-series.band`)"
            ".length >= 4"
        )
    shot = tmp_path / f"dashboard-{width}.png"
    pg.screenshot(path=str(shot))
    keep = os.environ.get("CHUTE_SCREENSHOT_DIR")
    if keep:
        shutil.copyfile(shot, os.path.join(keep, f"dashboard-{width}.png"))


HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def test_markup_in_every_name_and_value_stays_text(browser, tmp_path):
    """Run names, config keys and values, metric names and text values holding markup are
    shown as text in the table, the config diff, group labels and charts: none runs."""
    for seed in (0, 1):
        with cm.DirectWriter(tmp_path / f"{HOSTILE.replace('/', '_')}{seed}") as w:
            w.set_config({HOSTILE: HOSTILE + str(seed), "seed": seed, "note": {HOSTILE: 1}})
            for s in range(20):
                w.write({f"x{HOSTILE}".replace("/", "_"): float(s), "loss": 1.0, "t": HOSTILE})
                w.end_step()
    with dashboard(tmp_path) as url, open_page(browser, url) as pg:
        pg.wait_for_function("document.querySelectorAll('#runs tbody tr[data-run]').length === 2")
        pg.wait_for_function("document.querySelectorAll('.chart canvas').length >= 2")
        pg.fill("#add-column", f"note.{HOSTILE}")
        pg.dispatch_event("#add-column", "change")
        pg.click("#compare")
        pg.wait_for_selector("#diff table.diff")
        pg.fill("#group", HOSTILE)
        pg.dispatch_event("#group", "change")
        pg.wait_for_function(
            "document.querySelector('.chart .u-legend')?.textContent.includes('onerror')"
        )
        pg.fill("#where", f"`{HOSTILE}` ~ 'script'")
        pg.wait_for_function("document.querySelector('#runs-count').textContent.startsWith('2 of')")
        assert pg.evaluate("window.__xss") is None
        assert pg.evaluate("document.querySelectorAll('img, script:not([src])').length") == 0
        assert HOSTILE in pg.text_content("#runs")
