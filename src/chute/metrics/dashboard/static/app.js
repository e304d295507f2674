// chute metrics dashboard: runs table, one chart per metric, live by polling.
import { $, ELAPSED, debounce, el, getJSON, state } from "./util.js";
import { addColumn, listedRuns, runsQuery, selectedRuns, showDiff, table, update } from "./table.js";
import {
  Chart, charts, groups, refreshGroups, reloadAll, requestTails, resizeAll,
} from "./charts.js";

const POLL_MS = 1000;
const DEFAULT_SELECTED = 8;
let first = true, polling = false;

async function loadMetrics(run) {
  const key = JSON.stringify(run.info.version ? run.info.version[0] : null);
  if (run.metricsKey === key) return false;
  const res = await getJSON(`api/runs/${run.id}/metrics`);
  run.metrics = res.metrics || [];
  run.metricsKey = key;
  return true;
}

async function selectionChanged(run) {
  for (const r of run ? [run] : selectedRuns()) {
    if (!r.selected) continue;
    r.version = JSON.stringify(r.info.version);
    try { await loadMetrics(r); } catch (e) { r.metrics = []; }
  }
  rebuildCharts();
}

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
  updateMetricList(numeric);
  const match = matcher();
  const names = [...numeric.keys()].filter(match).sort();
  const wanted = new Set(names);
  for (const [name, chart] of charts) {
    if (!wanted.has(name)) { chart.destroy(); charts.delete(name); }
  }
  const box = $("charts");
  for (const name of names) {
    let chart = charts.get(name);
    if (!chart) { chart = new Chart(name); charts.set(name, chart); }
    box.append(chart.card); // re-appending keeps them sorted
    chart.dropMissing();
    chart.draw();
    chart.ensureLoaded();
  }
  const textNote = text.size ? `; ${text.size} text metric(s) not charted` : "";
  const groupNote = state.groupBy.length ? `; ${groups().length} group(s) of ${selectedRuns().length} runs` : "";
  $("charts-note").textContent = selectedRuns().length
    ? `${names.length} of ${numeric.size} metrics shown${textNote}${groupNote}`
    : "Select runs in the table to chart their metrics.";
}

function updateXChoices(numeric) {
  const sel = $("xaxis");
  const mono = [...numeric.values()].filter((m) => m.monotonic === "inc").map((m) => m.name).sort();
  const other = [...numeric.keys()].filter((n) => !mono.includes(n)).sort();
  const key = JSON.stringify([mono, other]);
  if (sel.dataset.key === key) return;
  sel.dataset.key = key;
  const label = (n) => (n === ELAPSED ? "elapsed time (clock/elapsed)" : n);
  const opts = [el("option", { value: "step", textContent: "step" })];
  for (const n of mono) opts.push(el("option", { value: n, textContent: label(n) }));
  if (other.length) {
    const group = el("optgroup", { label: "other (must increase)" });
    for (const n of other) group.append(el("option", { value: n, textContent: label(n) }));
    opts.push(group);
  }
  sel.replaceChildren(...opts);
  if (state.x !== "step" && !numeric.has(state.x)) {
    sel.append(el("option", { value: state.x, textContent: state.x }));
  }
  sel.value = state.x;
}

let autoLast = true; // until the user picks metric columns, the table shows up to two losses

function updateMetricList(numeric) {
  const names = [...numeric.keys()].sort();
  const list = $("metric-names");
  if (list.dataset.key === names.join("\n")) return;
  list.dataset.key = names.join("\n");
  list.replaceChildren(...names.map((n) => el("option", { value: n })));
  if (autoLast && names.length) {
    autoLast = false;
    const losses = names.filter((n) => /loss/i.test(n)).slice(0, 2);
    if (losses.length) { table.last.push(...losses); table.changed(); }
  }
}

// -- polling ---------------------------------------------------------------------------------
async function poll() {
  if (polling) return;
  polling = true;
  const live = $("live");
  try {
    let answer;
    try {
      answer = await getJSON(`api/runs?${runsQuery()}`);
      $("where-error").textContent = "";
    } catch (e) {
      if (e.status !== 400) throw e;
      $("where-error").textContent = e.message; // a bad query: keep the last good list
      return;
    }
    const before = new Set(selectedRuns().map((r) => r.id));
    update(answer);
    let changed = selectedRuns().some((r) => !before.has(r.id)) || before.size !== selectedRuns().length;
    if (first) {
      first = false;
      const pick = listedRuns().filter((r) => !r.info.error)
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
    refreshGroups();
    $("runs-note").textContent = answer.total ? "" : "No runs found yet under the given paths.";
    live.className = "ok";
  } catch (e) {
    live.className = "err";
    live.title = String(e.message || e);
  } finally {
    polling = false;
  }
}

table.onSelect = (run) => selectionChanged(run);
table.changed = () => { poll(); };

// -- controls --------------------------------------------------------------------------------
$("filter").addEventListener("input", debounce(() => { state.filter = $("filter").value; rebuildCharts(); }, 150));
$("where").addEventListener("input", debounce(() => { state.where = $("where").value; poll(); }, 300));
$("xaxis").addEventListener("change", () => { state.x = $("xaxis").value; reloadAll(); });
$("logy").addEventListener("change", () => {
  state.logy = $("logy").checked;
  for (const chart of charts.values()) chart.draw();
});
const applySmooth = debounce(() => { state.smooth = +$("smooth").value; reloadAll(); }, 200);
$("smooth").addEventListener("input", () => {
  const v = +$("smooth").value;
  $("smooth-value").textContent = v > 0 ? v.toFixed(2) : "off";
  applySmooth();
});
$("group").addEventListener("change", async () => {
  state.groupBy = $("group").value.split(",").map((k) => k.trim()).filter(Boolean);
  await poll(); // rows now carry the group keys' values
  for (const chart of charts.values()) chart.dropMissing();
  reloadAll();
  rebuildCharts();
});
for (const [id, isMetric] of [["add-column", false], ["add-metric", true]]) {
  $(id).addEventListener("change", () => {
    const name = $(id).value.trim();
    $(id).value = "";
    if (isMetric) autoLast = false;
    if (name) addColumn(name, isMetric);
  });
}
$("compare").addEventListener("click", showDiff);
window.addEventListener("resize", debounce(resizeAll, 150));

poll();
setInterval(poll, POLL_MS);
