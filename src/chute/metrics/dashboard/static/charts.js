// One uPlot chart per metric: a curve per selected run, or per group of runs a mean line
// with a min-max band; enlarge, CSV export, live tails.
import {
  $, ELAPSED, PALETTE, csvField, debounce, download, el, fmtDuration, fmtTick, fmtValue,
  getJSON, state,
} from "./util.js";
import { selectedRuns } from "./table.js";

const HEIGHT = 230, WIDE_HEIGHT = 520;
const GROUP_REFRESH_MS = 5000; // a group of live runs is read again at most this often
const REFETCH_FACTOR = 8; // refetch a thinned curve once tails grew it past 8 points per pixel
const PER_REQUEST = 128; // metrics per series request (the server takes at most 256)
export const charts = new Map(); // metric name -> Chart

const observer = new IntersectionObserver((entries) => {
  for (const e of entries) {
    const chart = e.target.chart;
    if (chart) { chart.visible = e.isIntersecting; if (chart.visible) chart.ensureLoaded(); }
  }
}, { rootMargin: "300px" });

function plotWidth(card) {
  const box = card ? card.querySelector(".plot") : document.querySelector(".chart:not(.wide) .plot");
  return Math.max(200, Math.round(box ? box.clientWidth : 600));
}

/** The groups of the selected runs by the group-by keys: [{key, label, ids, color}]. */
export function groups() {
  const by = new Map();
  for (const run of selectedRuns()) {
    const values = state.groupBy.map((k) => (run.info.config || {})[k]);
    const key = JSON.stringify(values);
    if (!by.has(key)) {
      const label = state.groupBy.map((k, i) => `${k}=${values[i] === undefined ? "(absent)" : JSON.stringify(values[i])}`).join(", ");
      by.set(key, { key, label, ids: [] });
    }
    by.get(key).ids.push(run.id);
  }
  const out = [...by.values()].sort((a, b) => a.label.localeCompare(b.label, undefined, { numeric: true }));
  out.forEach((g, i) => { g.color = PALETTE[i % PALETTE.length]; g.idsKey = g.ids.join(","); });
  return out;
}

const grouped = () => state.groupBy.length > 0;

export class Chart {
  constructor(name) {
    this.name = name;
    this.curves = new Map(); // run id (or group key) -> curve
    this.pending = new Set(); // run ids / group keys with a full load in flight
    this.plot = null; this.key = null; this.visible = false; this.errors = [];
    this.errEl = el("div", { className: "errors" });
    this.plotEl = el("div", { className: "plot" });
    const wide = el("button", { className: "tool wide-toggle", textContent: "⤢", title: "enlarge" });
    wide.addEventListener("click", () => this.toggleWide());
    const csv = el("button", { className: "tool csv", textContent: "CSV", title: "download what this chart shows" });
    csv.addEventListener("click", () => this.exportCSV());
    const title = el("h2", {}, el("span", { className: "title", textContent: name }), el("span", { className: "tools" }, csv, wide));
    this.card = el("div", { className: "chart" }, title, this.errEl, this.plotEl);
    this.card.dataset.metric = name;
    this.card.chart = this;
    observer.observe(this.card);
  }

  toggleWide() {
    this.card.classList.toggle("wide");
    if (this.plot) this.plot.setSize({ width: plotWidth(this.card), height: this.height() });
    this.card.scrollIntoView({ block: "nearest" });
  }

  height() { return this.card.classList.contains("wide") ? WIDE_HEIGHT : HEIGHT; }

  ensureLoaded() {
    if (!this.visible) return;
    if (grouped()) {
      for (const g of groups()) {
        const c = this.curves.get(g.key);
        const due = c && c.stale && Date.now() - c.at > GROUP_REFRESH_MS;
        if ((!c || c.gen !== state.gen || c.ids !== g.idsKey || due) && !this.pending.has(g.key)) {
          this.pending.add(g.key);
          fetchGroup(this, g);
        }
      }
      return;
    }
    for (const run of selectedRuns()) {
      const c = this.curves.get(run.id);
      if ((!c || c.gen !== state.gen) && !this.pending.has(run.id) && hasMetric(run, this.name)) {
        this.pending.add(run.id);
        want(run, this, null);
      }
    }
  }

  /** A run's curves are out of date (it wrote rows): refetch the groups holding it. */
  staleRun(run) {
    if (!grouped()) return;
    for (const c of this.curves.values()) if (c.ids && c.ids.split(",").includes(run.id)) c.stale = true;
    this.ensureLoaded();
  }

  setCurve(id, res, gen, extra = {}) {
    this.pending.delete(id);
    if (gen !== state.gen) return;
    this.curves.set(id, res.error ? { error: res.error, gen, ...extra } : { ...res, gen, ...extra });
  }

  appendTail(run, res, gen) {
    const c = this.curves.get(run.id);
    if (!c || c.error || c.gen !== gen || gen !== state.gen || res.error || !res.x.length) return;
    c.x.push(...res.x); c.y.push(...res.y); c.last_step = res.last_step;
    if (c.s && c.ema) { // continue the server's EMA over the new rows
      const f = state.smooth;
      let [acc, w] = c.ema;
      for (const v of res.y) {
        if (v != null) { acc = f * acc + (1 - f) * v; w = f * w + (1 - f); }
        c.s.push(w ? acc / w : null);
      }
      c.ema = [acc, w];
    }
    if (c.x.length > REFETCH_FACTOR * plotWidth(this.card)) { c.gen = -1; this.ensureLoaded(); }
  }

  dropMissing() {
    const keep = new Set(grouped() ? groups().map((g) => g.key) : selectedRuns().map((r) => r.id));
    for (const id of this.curves.keys()) if (!keep.has(id)) this.curves.delete(id);
  }

  layers() { // [tables, series, bands, lastX, errors] of what this chart draws now
    const tables = [], series = [{ label: state.x }], bands = [], errors = [], lastX = {};
    const clean = (a) => (state.logy ? a.map((v) => (v > 0 ? v : null)) : a);
    const noValues = state.logy ? "no positive values for a log axis" : "no finite values";
    if (grouped()) {
      for (const g of groups()) {
        const c = this.curves.get(g.key);
        if (!c) continue;
        if (c.error) { errors.push(`${g.label}: ${c.error}`); continue; }
        for (const [run, msg] of Object.entries(c.errors || {})) errors.push(`${run}: ${msg}`);
        if (!c.x.length) continue;
        const label = `${g.label} (${c.runs} run${c.runs === 1 ? "" : "s"})`;
        const at = series.length;
        tables.push([c.x, clean(c.mean), clean(c.min), clean(c.max)]);
        series.push({ label, stroke: g.color, width: 1.6, spanGaps: true },
          { label: `${label} min`, stroke: g.color + "55", width: 0.5, class: "band", spanGaps: true },
          { label: `${label} max`, stroke: g.color + "55", width: 0.5, class: "band", spanGaps: true });
        bands.push({ series: [at + 2, at + 1], fill: g.color + "2e" });
        lastX[g.label] = c.x[c.x.length - 1];
      }
      return [tables, series, bands, lastX, errors];
    }
    for (const run of selectedRuns()) {
      const c = this.curves.get(run.id);
      if (!c) continue;
      if (c.error) { errors.push(`${run.info.name}: ${c.error}`); continue; }
      if (!c.x.length) continue;
      const y = clean(c.y);
      if (!y.some((v) => v != null)) errors.push(`${run.info.name}: ${noValues}`);
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
    return [tables, series, bands, lastX, errors];
  }

  draw() {
    const [tables, series, bands, lastX, errors] = this.layers();
    this.errors = errors;
    showErrors();
    if (!tables.length) {
      if (this.plot) { this.plot.destroy(); this.plot = null; this.key = null; }
      return;
    }
    const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
    const key = JSON.stringify([series.map((s) => s.label + s.stroke), state.logy, state.x]);
    if (this.plot && this.key === key) {
      // keep a zoom the user dragged; otherwise rescale to take in the new rows
      const prev = this.plot.data[0], sx = this.plot.scales.x;
      const whole = !prev.length || (sx.min <= prev[0] && sx.max >= prev[prev.length - 1]);
      this.plot.setData(data, whole);
    } else {
      if (this.plot) this.plot.destroy();
      this.plot = new uPlot(plotOptions(series, bands, this), data, this.plotEl);
      this.key = key;
    }
    this.card.dataset.logy = this.plot.scales.y.distr === 3 ? "1" : "0";
    this.card.dataset.lastX = JSON.stringify(lastX);
    this.card.dataset.points = String(data[0].length);
  }

  /** The rows this chart shows (inside a dragged zoom, if any) as CSV text. */
  csv() {
    if (!this.plot) return "";
    const { data, series } = this.plot, sx = this.plot.scales.x;
    const lines = [series.map((s) => csvField(s.label)).join(",")];
    for (let i = 0; i < data[0].length; i++) {
      const x = data[0][i];
      if (sx.min != null && (x < sx.min || x > sx.max)) continue;
      lines.push(data.map((col) => csvField(col[i])).join(","));
    }
    return lines.join("\n") + "\n";
  }

  exportCSV() {
    const text = this.csv();
    if (text) download(`${this.name.replace(/[^\w.-]+/g, "_")}.csv`, text);
  }

  destroy() {
    observer.unobserve(this.card);
    if (this.plot) this.plot.destroy();
    this.card.remove();
  }
}

/** Errors said by more than one chart are shown once above the charts, with a count. */
const showErrors = debounce(() => {
  const count = new Map();
  for (const chart of charts.values()) for (const e of new Set(chart.errors)) count.set(e, (count.get(e) || 0) + 1);
  const common = [...count].filter(([, n]) => n > 1);
  $("chart-errors").replaceChildren(...common.map(([e, n]) => el("div", { textContent: `${e} (on ${n} charts)` })));
  $("chart-errors").hidden = !common.length;
  for (const chart of charts.values()) {
    chart.errEl.textContent = chart.errors.filter((e) => !(count.get(e) > 1)).join("\n");
  }
}, 50);

function yAxisSize(u, values) { // wide enough for the longest tick label
  const longest = values ? Math.max(0, ...values.map((v) => String(v).length)) : 0;
  return Math.max(40, 7 * longest + 18);
}

function plotOptions(series, bands, chart) {
  const xFmt = state.x === ELAPSED ? fmtDuration : fmtTick;
  return {
    width: plotWidth(chart.card), height: chart.height(), series, bands,
    scales: { x: { time: false }, y: { distr: state.logy ? 3 : 1 } },
    axes: [{ values: (u, splits) => splits.map(xFmt) },
      { size: yAxisSize, values: (u, splits) => splits.map(fmtTick) }],
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
  };
}

export function hasMetric(run, name) { return !!run.metrics && run.metrics.some((m) => m.name === name); }

// -- requests --------------------------------------------------------------------------------
let queue = new Map(); // run id -> {run, full: Set(Chart), tails: Map(Chart, after)}
let flushTimer = null;

export function want(run, chart, after) {
  let q = queue.get(run.id);
  if (!q) { q = { run, full: new Set(), tails: new Map() }; queue.set(run.id, q); }
  if (after == null) { q.full.add(chart); q.tails.delete(chart); }
  else if (!q.full.has(chart)) q.tails.set(chart, after);
  if (!flushTimer) flushTimer = setTimeout(flush, 0);
}

function commonParams() {
  return new URLSearchParams({ x: state.x, width: String(plotWidth()), smooth: String(state.smooth) });
}

async function fetchSeries(run, list, afters) {
  const gen = state.gen;
  const p = commonParams();
  list.forEach((c) => p.append("metric", c.name));
  if (afters) afters.forEach((a) => p.append("after", String(a)));
  let res;
  try { res = await getJSON(`api/runs/${run.id}/series?${p}`); }
  catch (e) { res = { error: String(e.message || e) }; }
  for (const chart of list) {
    const one = res.error ? { error: res.error } : res.series[chart.name];
    if (afters) chart.appendTail(run, one, gen); else chart.setCurve(run.id, one, gen);
    chart.draw();
  }
}

async function fetchGroup(chart, g) {
  const gen = state.gen;
  const p = commonParams();
  p.set("width", String(plotWidth(chart.card)));
  p.append("metric", chart.name);
  g.ids.forEach((id) => p.append("run", id));
  let res;
  try { res = await getJSON(`api/group?${p}`); }
  catch (e) { res = { error: String(e.message || e) }; }
  const one = res.error ? { error: res.error } : res.series[chart.name];
  chart.setCurve(g.key, one, gen, { ids: g.idsKey, stale: false, at: Date.now() });
  chart.draw();
}

function flush() {
  flushTimer = null;
  const jobs = queue;
  queue = new Map();
  for (const { run, full, tails } of jobs.values()) {
    const list = [...full], tailCharts = [...tails.keys()], afters = [...tails.values()];
    for (let i = 0; i < list.length; i += PER_REQUEST) fetchSeries(run, list.slice(i, i + PER_REQUEST), null);
    for (let i = 0; i < tailCharts.length; i += PER_REQUEST) {
      fetchSeries(run, tailCharts.slice(i, i + PER_REQUEST), afters.slice(i, i + PER_REQUEST));
    }
  }
}

/** A selected run wrote rows: fetch them for every chart holding its curve. */
export function requestTails(run) {
  for (const chart of charts.values()) {
    if (grouped()) { chart.staleRun(run); continue; }
    const c = chart.curves.get(run.id);
    if (c && !c.error && c.gen === state.gen) want(run, chart, c.last_step);
    else if (chart.visible) chart.ensureLoaded();
  }
}

/** Groups whose runs wrote rows are read again once they are due (called every poll). */
export function refreshGroups() {
  if (grouped()) for (const chart of charts.values()) chart.ensureLoaded();
}

/** Everything is drawn anew (x, smoothing or grouping changed). */
export function reloadAll() {
  state.gen += 1;
  for (const chart of charts.values()) { chart.pending.clear(); chart.draw(); chart.ensureLoaded(); }
}

export function resizeAll() {
  for (const chart of charts.values()) {
    if (chart.plot) chart.plot.setSize({ width: plotWidth(chart.card), height: chart.height() });
  }
}
