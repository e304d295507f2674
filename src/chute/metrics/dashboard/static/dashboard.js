// chute metrics dashboard: runs table, one uPlot chart per metric, live by polling.
"use strict";
(() => {
  const POLL_MS = 1000;
  const HEIGHT = 230;
  const DEFAULT_SELECTED = 8;
  const REFETCH_FACTOR = 8; // refetch a thinned curve once tails grew it past 8 points per pixel
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  const $ = (id) => document.getElementById(id);

  const state = {
    runs: new Map(), // id -> run record (see addRun)
    order: [],
    charts: new Map(), // metric name -> Chart
    x: "step", logy: false, smooth: 0, filter: "",
    gen: 0, // bumped when x or smoothing change: answers to older requests are dropped
    first: true, polling: false,
  };

  function el(tag, props = {}, ...children) {
    const node = Object.assign(document.createElement(tag), props);
    node.append(...children);
    return node;
  }

  async function getJSON(url) {
    const res = await fetch(url, { cache: "no-store" });
    if (!res.ok) throw new Error(`${res.status} for ${url}`);
    return res.json();
  }

  function fmtValue(v, dtype) {
    if (v == null) return "—";
    if (dtype === "f32") { // the shortest decimal that reads back as the same float32
      for (let p = 6; p <= 9; p++) {
        const s = +v.toPrecision(p);
        if (Math.fround(s) === Math.fround(v)) return String(s);
      }
    }
    return String(v);
  }

  function fmtTick(v) {
    if (v == null) return "";
    const s = +v.toPrecision(6);
    const a = Math.abs(s);
    return a !== 0 && (a >= 1e6 || a < 1e-3) ? s.toExponential() : String(s);
  }

  function ago(t, now) {
    if (t == null) return "—";
    const s = Math.max(0, now - t);
    if (s < 90) return `${Math.round(s)} s ago`;
    if (s < 5400) return `${Math.round(s / 60)} min ago`;
    if (s < 172800) return `${Math.round(s / 3600)} h ago`;
    return new Date(t * 1000).toISOString().slice(0, 10);
  }

  // -- runs table ---------------------------------------------------------------------------
  function addRun(info) {
    const run = {
      id: info.id, info, selected: false, color: PALETTE[state.order.length % PALETTE.length],
      metrics: null, metricsKey: null, version: null,
    };
    const box = el("input", { type: "checkbox" });
    box.addEventListener("change", () => { run.selected = box.checked; selectionChanged(run); });
    const cfgButton = el("button", { className: "link", textContent: "config" });
    const cfgRow = el("tr", { hidden: true }, el("td", { colSpan: 6 }, el("pre", { className: "config" })));
    cfgButton.addEventListener("click", async () => {
      cfgRow.hidden = !cfgRow.hidden;
      if (!cfgRow.hidden) {
        const pre = cfgRow.querySelector("pre");
        try { pre.textContent = JSON.stringify(await getJSON(`api/runs/${run.id}/config`), null, 2); }
        catch (e) { pre.textContent = String(e); }
      }
    });
    run.cells = {
      name: el("td", { className: "name" }), status: el("td", { className: "status" }),
      step: el("td", { className: "num step" }), when: el("td", { className: "num when" }),
    };
    run.box = box;
    run.row = el("tr", {}, el("td", {}, box), run.cells.name, run.cells.status, run.cells.step,
      run.cells.when, el("td", {}, cfgButton));
    run.row.dataset.run = run.id;
    run.errRow = el("tr", { className: "error", hidden: true }, el("td", { colSpan: 6, className: "err" }));
    $("runs").tBodies[0].append(run.row, run.errRow, cfgRow);
    state.runs.set(run.id, run);
    state.order.push(run);
    return run;
  }

  function updateRun(run, info, now) {
    run.info = info;
    const c = run.cells;
    c.name.replaceChildren(el("span", { className: "swatch", style: `background:${run.color}` }), info.name);
    c.name.title = info.name;
    c.status.textContent = info.status;
    c.status.className = `status status-${info.status}`;
    c.step.textContent = info.last_step == null ? "—" : String(info.last_step);
    c.when.textContent = ago(info.last_write, now);
    run.errRow.hidden = !info.error;
    run.errRow.firstChild.textContent = info.error || "";
    run.box.disabled = !!info.error && !run.selected;
  }

  function selectedRuns() { return state.order.filter((r) => r.selected && !r.info.error); }

  async function loadMetrics(run) {
    const key = JSON.stringify(run.info.version ? run.info.version[0] : null);
    if (run.metricsKey === key) return false;
    const res = await getJSON(`api/runs/${run.id}/metrics`);
    run.metrics = res.metrics || [];
    run.metricsKey = key;
    return true;
  }

  async function selectionChanged(run) {
    if (run.selected) {
      run.version = JSON.stringify(run.info.version);
      try { await loadMetrics(run); } catch (e) { run.metrics = []; }
    }
    rebuildCharts();
  }

  // -- charts --------------------------------------------------------------------------------
  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) {
      const chart = e.target.chart;
      if (chart) { chart.visible = e.isIntersecting; if (chart.visible) chart.ensureLoaded(); }
    }
  }, { rootMargin: "300px" });

  function plotWidth() {
    const any = document.querySelector(".chart .plot");
    return Math.max(200, Math.round(any ? any.clientWidth : 600));
  }

  class Chart {
    constructor(name) {
      this.name = name;
      this.curves = new Map(); // run id -> {x, y, s, ema, last, dtype, error, gen}
      this.pending = new Set(); // run ids with a full load in flight
      this.plot = null; this.key = null; this.visible = false;
      this.errEl = el("div", { className: "errors" });
      this.plotEl = el("div", { className: "plot" });
      this.card = el("div", { className: "chart" }, el("h2", { textContent: name }), this.errEl, this.plotEl);
      this.card.dataset.metric = name;
      this.card.chart = this;
      observer.observe(this.card);
    }

    ensureLoaded() {
      if (!this.visible) return;
      for (const run of selectedRuns()) {
        const c = this.curves.get(run.id);
        if ((!c || c.gen !== state.gen) && !this.pending.has(run.id) && hasMetric(run, this.name)) {
          this.pending.add(run.id);
          want(run, this, null);
        }
      }
    }

    setCurve(run, res, gen) {
      this.pending.delete(run.id);
      if (gen !== state.gen) return;
      if (res.error) { this.curves.set(run.id, { error: res.error, gen }); return; }
      this.curves.set(run.id, { x: res.x, y: res.y, s: res.s || null, ema: res.ema || null,
        last: res.last_step, dtype: res.dtype, rows: res.rows, gen });
    }

    appendTail(run, res, gen) {
      const c = this.curves.get(run.id);
      if (!c || c.error || c.gen !== gen || gen !== state.gen || res.error || !res.x.length) return;
      c.x.push(...res.x); c.y.push(...res.y); c.last = res.last_step;
      if (c.s && c.ema) { // continue the server's EMA over the new rows
        const f = state.smooth;
        let [acc, w] = c.ema;
        for (const v of res.y) {
          if (v != null) { acc = f * acc + (1 - f) * v; w = f * w + (1 - f); }
          c.s.push(w ? acc / w : null);
        }
        c.ema = [acc, w];
      }
      if (c.x.length > REFETCH_FACTOR * plotWidth()) { c.gen = -1; this.ensureLoaded(); }
    }

    dropMissing() {
      const keep = new Set(selectedRuns().map((r) => r.id));
      for (const id of this.curves.keys()) if (!keep.has(id)) this.curves.delete(id);
    }

    draw() {
      const tables = [], series = [{ label: state.x }], errors = [];
      const lastX = {}; // run name -> last x drawn
      const clean = (a) => (state.logy ? a.map((v) => (v > 0 ? v : null)) : a);
      for (const run of selectedRuns()) {
        const c = this.curves.get(run.id);
        if (!c) continue;
        if (c.error) { errors.push(`${run.info.name}: ${c.error}`); continue; }
        if (!c.x.length) continue;
        const y = clean(c.y);
        if (!y.some((v) => v != null)) {
          errors.push(`${run.info.name}: ${state.logy ? "no positive values for a log axis" : "no finite values"}`);
        }
        const value = (u, v) => fmtValue(v, c.dtype);
        const name = run.info.name;
        if (state.smooth > 0 && c.s) {
          tables.push([c.x, y, clean(c.s)]);
          series.push({ label: `${name} (raw)`, stroke: run.color + "40", width: 1, class: "raw", value },
            { label: name, stroke: run.color, width: 1.6, value });
        } else {
          tables.push([c.x, y]);
          series.push({ label: name, stroke: run.color, width: 1.3, value });
        }
        lastX[name] = c.x[c.x.length - 1];
      }
      this.errEl.textContent = errors.join("\n");
      if (!tables.length) {
        if (this.plot) { this.plot.destroy(); this.plot = null; this.key = null; }
        return;
      }
      const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
      const key = JSON.stringify([series.map((s) => s.label + s.stroke), state.logy]);
      if (this.plot && this.key === key) {
        // keep a zoom the user dragged; otherwise rescale to take in the new rows
        const prev = this.plot.data[0], sx = this.plot.scales.x;
        const whole = !prev.length || (sx.min <= prev[0] && sx.max >= prev[prev.length - 1]);
        this.plot.setData(data, whole);
      } else {
        if (this.plot) this.plot.destroy();
        this.plot = new uPlot(plotOptions(series), data, this.plotEl);
        this.key = key;
      }
      this.card.dataset.logy = this.plot.scales.y.distr === 3 ? "1" : "0";
      this.card.dataset.lastX = JSON.stringify(lastX);
      this.card.dataset.points = String(data[0].length);
    }

    destroy() {
      observer.unobserve(this.card);
      if (this.plot) this.plot.destroy();
      this.card.remove();
    }
  }

  function yAxisSize(u, values) { // wide enough for the longest tick label
    const longest = values ? Math.max(0, ...values.map((v) => String(v).length)) : 0;
    return Math.max(40, 7 * longest + 18);
  }

  function plotOptions(series) {
    return {
      width: plotWidth(), height: HEIGHT, series,
      scales: { x: { time: false }, y: { distr: state.logy ? 3 : 1 } },
      axes: [{ values: (u, splits) => splits.map(fmtTick) },
        { size: yAxisSize, values: (u, splits) => splits.map(fmtTick) }],
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
    };
  }

  function hasMetric(run, name) { return !!run.metrics && run.metrics.some((m) => m.name === name); }

  function matcher() {
    const f = state.filter.trim();
    if (!f) return () => true;
    try { const re = new RegExp(f, "i"); return (n) => re.test(n); }
    catch (e) { const low = f.toLowerCase(); return (n) => n.toLowerCase().includes(low); }
  }

  function rebuildCharts() {
    const numeric = new Map(), text = new Set();
    for (const run of selectedRuns()) {
      for (const m of run.metrics || []) {
        if (m.dtype === "jsonl") text.add(m.name);
        else if (!numeric.has(m.name) || m.monotonic) numeric.set(m.name, m);
      }
    }
    updateXChoices(numeric);
    const match = matcher();
    const names = [...numeric.keys()].filter(match).sort();
    const wanted = new Set(names);
    for (const [name, chart] of state.charts) {
      if (!wanted.has(name)) { chart.destroy(); state.charts.delete(name); }
    }
    const box = $("charts");
    for (const name of names) {
      let chart = state.charts.get(name);
      if (!chart) { chart = new Chart(name); state.charts.set(name, chart); }
      box.append(chart.card); // re-appending keeps them sorted
      chart.dropMissing();
      chart.draw();
      chart.ensureLoaded();
    }
    const textNote = text.size ? `; ${text.size} text metric(s) not charted` : "";
    $("charts-note").textContent = selectedRuns().length
      ? `${names.length} of ${numeric.size} metrics shown${textNote}`
      : "Select runs on the left to chart their metrics.";
  }

  function updateXChoices(numeric) {
    const sel = $("xaxis");
    const mono = [...numeric.values()].filter((m) => m.monotonic === "inc").map((m) => m.name).sort();
    const other = [...numeric.keys()].filter((n) => !mono.includes(n)).sort();
    const key = JSON.stringify([mono, other]);
    if (sel.dataset.key === key) return;
    sel.dataset.key = key;
    const opts = [el("option", { value: "step", textContent: "step" })];
    for (const n of mono) opts.push(el("option", { value: n, textContent: n }));
    if (other.length) {
      const group = el("optgroup", { label: "other (must increase)" });
      for (const n of other) group.append(el("option", { value: n, textContent: n }));
      opts.push(group);
    }
    sel.replaceChildren(...opts);
    if (state.x !== "step" && !numeric.has(state.x)) {
      sel.append(el("option", { value: state.x, textContent: state.x }));
    }
    sel.value = state.x;
  }

  // -- requests, batched per run -------------------------------------------------------------
  const PER_REQUEST = 128; // metrics per series request (the server takes at most 256)
  let queue = new Map(); // run id -> {run, full: Set(Chart), tails: Map(Chart, after)}
  let flushTimer = null;

  function want(run, chart, after) {
    let q = queue.get(run.id);
    if (!q) { q = { run, full: new Set(), tails: new Map() }; queue.set(run.id, q); }
    if (after == null) { q.full.add(chart); q.tails.delete(chart); }
    else if (!q.full.has(chart)) q.tails.set(chart, after);
    if (!flushTimer) flushTimer = setTimeout(flush, 0);
  }

  function seriesURL(run, metrics, afters) {
    const p = new URLSearchParams({ x: state.x, width: String(plotWidth()), smooth: String(state.smooth) });
    metrics.forEach((m) => p.append("metric", m));
    if (afters) afters.forEach((a) => p.append("after", String(a)));
    return `api/runs/${run.id}/series?${p}`;
  }

  async function fetchSeries(run, charts, afters) {
    const gen = state.gen;
    const names = charts.map((c) => c.name);
    let res;
    try { res = await getJSON(seriesURL(run, names, afters)); }
    catch (e) { res = { error: String(e) }; }
    charts.forEach((chart) => {
      const one = res.error ? { error: res.error } : res.series[chart.name];
      if (afters) chart.appendTail(run, one, gen); else chart.setCurve(run, one, gen);
      chart.draw();
    });
  }

  function flush() {
    flushTimer = null;
    const jobs = queue;
    queue = new Map();
    for (const { run, full, tails } of jobs.values()) {
      const charts = [...full], tailCharts = [...tails.keys()], afters = [...tails.values()];
      for (let i = 0; i < charts.length; i += PER_REQUEST) {
        fetchSeries(run, charts.slice(i, i + PER_REQUEST), null);
      }
      for (let i = 0; i < tailCharts.length; i += PER_REQUEST) {
        fetchSeries(run, tailCharts.slice(i, i + PER_REQUEST), afters.slice(i, i + PER_REQUEST));
      }
    }
  }

  function requestTails(run) {
    for (const chart of state.charts.values()) {
      const c = chart.curves.get(run.id);
      if (c && !c.error && c.gen === state.gen) want(run, chart, c.last);
      else if (chart.visible) chart.ensureLoaded();
    }
  }

  // -- polling ---------------------------------------------------------------------------------
  async function poll() {
    if (state.polling) return;
    state.polling = true;
    const live = $("live");
    try {
      const { runs, now } = await getJSON("api/runs");
      for (const info of runs) updateRun(state.runs.get(info.id) || addRun(info), info, now);
      let changed = false;
      if (state.first) {
        state.first = false;
        const pick = state.order.filter((r) => !r.info.error)
          .sort((a, b) => (b.info.last_write || 0) - (a.info.last_write || 0))
          .slice(0, DEFAULT_SELECTED);
        for (const run of pick) { run.selected = true; run.box.checked = true; }
        changed = true;
      }
      for (const run of selectedRuns()) {
        const v = JSON.stringify(run.info.version);
        if (run.version === v && run.metrics) continue;
        if (await loadMetrics(run)) changed = true;
        if (run.version !== null && run.version !== v) requestTails(run);
        run.version = v;
      }
      if (changed) rebuildCharts();
      $("runs-note").textContent = runs.length ? "" : "No runs found yet under the given paths.";
      live.className = "ok";
    } catch (e) {
      live.className = "err";
      live.title = String(e);
    } finally {
      state.polling = false;
    }
  }

  // -- controls --------------------------------------------------------------------------------
  function debounce(fn, ms) {
    let t = null;
    return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
  }

  function reloadAll() {
    state.gen += 1;
    for (const chart of state.charts.values()) { chart.pending.clear(); chart.ensureLoaded(); }
  }

  $("filter").addEventListener("input", debounce(() => { state.filter = $("filter").value; rebuildCharts(); }, 150));
  $("xaxis").addEventListener("change", () => { state.x = $("xaxis").value; reloadAll(); });
  $("logy").addEventListener("change", () => {
    state.logy = $("logy").checked;
    for (const chart of state.charts.values()) chart.draw();
  });
  const applySmooth = debounce(() => { state.smooth = +$("smooth").value; reloadAll(); }, 200);
  $("smooth").addEventListener("input", () => {
    const v = +$("smooth").value;
    $("smooth-value").textContent = v > 0 ? v.toFixed(2) : "off";
    applySmooth();
  });
  window.addEventListener("resize", debounce(() => {
    for (const chart of state.charts.values()) {
      if (chart.plot) chart.plot.setSize({ width: plotWidth(), height: HEIGHT });
    }
  }, 150));

  poll();
  setInterval(poll, POLL_MS);
})();
