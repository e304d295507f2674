// The runs table: one row per listed run, sortable by any column, config columns, selection.
import { $, PALETTE, ago, el, fmtCell, fmtValue, getJSON, state } from "./util.js";

const FIXED = [ // the run's own columns: [key, header, class]
  ["name", "run", "name"], ["status", "status", "status"], ["step", "step", "num step"],
  ["written", "written", "num when"],
];

export const table = {
  runs: new Map(), // id -> run record (see addRun)
  order: [], // every run seen, in discovery order
  listed: new Set(), // ids the last answer listed
  differ: [], // config keys differing among the listed runs (the server's)
  keys: [], // every config key of the listed runs
  added: [], // config columns the user added
  removed: new Set(), // differing columns the user removed
  last: [], // metrics whose last value is a column
  sort: null, // {col, dir}
  colKey: null,
  onSelect: () => {},
};

/** The columns shown: [id, header], config columns as "c:key", metric values as "m:name". */
function columns() {
  const cfg = [...new Set([...table.differ.filter((k) => !table.removed.has(k)), ...table.added])];
  return [...FIXED.map(([k, h]) => [k, h]), ...table.last.map((m) => [`m:${m}`, m]),
    ...cfg.map((k) => [`c:${k}`, k])];
}

function valueOf(run, col) {
  const i = run.info;
  if (col === "name") return i.name;
  if (col === "status") return i.status;
  if (col === "step") return i.last_step;
  if (col === "written") return i.last_write;
  if (col.startsWith("m:")) return (i.last || {})[col.slice(2)];
  return (i.config || {})[col.slice(2)];
}

function compare(a, b) {
  const rank = (v) => (v == null ? 2 : typeof v === "number" ? 0 : 1);
  const ra = rank(a), rb = rank(b);
  if (ra !== rb) return ra - rb;
  if (ra === 0) return a - b;
  if (ra === 2) return 0;
  return String(typeof a === "object" ? JSON.stringify(a) : a)
    .localeCompare(String(typeof b === "object" ? JSON.stringify(b) : b), undefined, { numeric: true });
}

function renderHead() {
  const cols = columns();
  const key = JSON.stringify([cols, table.sort]);
  if (key === table.colKey) return false;
  table.colKey = key;
  const all = el("input", { type: "checkbox", title: "select every listed run" });
  all.addEventListener("change", () => {
    for (const run of listedRuns()) if (!run.info.error) { run.selected = all.checked; run.box.checked = all.checked; }
    table.onSelect(null);
  });
  const ths = [el("th", {}, all)];
  for (const [col, header] of cols) {
    const th = el("th", { title: col.startsWith("m:") ? `last value of ${header}` : header });
    th.dataset.col = col;
    const arrow = table.sort && table.sort.col === col ? (table.sort.dir > 0 ? " ▲" : " ▼") : "";
    const label = el("button", { className: "sort", textContent: header + arrow });
    label.addEventListener("click", () => {
      const dir = table.sort && table.sort.col === col ? -table.sort.dir : 1;
      table.sort = { col, dir };
      refresh();
    });
    th.append(label);
    if (col.startsWith("c:") || col.startsWith("m:")) {
      const x = el("button", { className: "drop", textContent: "×", title: `hide ${header}` });
      x.addEventListener("click", () => dropColumn(col));
      th.append(x);
    }
    ths.push(th);
  }
  ths.push(el("th"));
  $("runs").tHead.replaceChildren(el("tr", {}, ...ths));
  return true;
}

function dropColumn(col) {
  const key = col.slice(2);
  if (col.startsWith("m:")) table.last = table.last.filter((m) => m !== key);
  else { table.added = table.added.filter((k) => k !== key); table.removed.add(key); }
  table.changed();
}

/** Show a config key or a metric's last value as a column. */
export function addColumn(name, isMetric) {
  if (isMetric) { if (!table.last.includes(name)) table.last.push(name); }
  else { table.removed.delete(name); if (!table.added.includes(name)) table.added.push(name); }
  table.changed();
}

function addRun(info) {
  const run = {
    id: info.id, info, selected: false, color: PALETTE[table.order.length % PALETTE.length],
    metrics: null, metricsKey: null, version: null, cells: new Map(), cellKey: null,
  };
  const box = el("input", { type: "checkbox" });
  box.addEventListener("change", () => { run.selected = box.checked; table.onSelect(run); });
  const cfgButton = el("button", { className: "link", textContent: "config" });
  run.cfgRow = el("tr", { hidden: true, className: "config" }, el("td", {}, el("pre", { className: "config" })));
  cfgButton.addEventListener("click", async () => {
    run.cfgRow.hidden = !run.cfgRow.hidden;
    if (!run.cfgRow.hidden) {
      const pre = run.cfgRow.querySelector("pre");
      try { pre.textContent = JSON.stringify(await getJSON(`api/runs/${run.id}/config`), null, 2); }
      catch (e) { pre.textContent = String(e.message || e); }
    }
  });
  run.box = box;
  run.lead = el("td", {}, box);
  run.tail = el("td", {}, cfgButton);
  run.row = el("tr", {});
  run.row.dataset.run = run.id;
  run.errRow = el("tr", { className: "error", hidden: true }, el("td", { className: "err" }));
  table.runs.set(run.id, run);
  table.order.push(run);
  return run;
}

function renderRow(run, cols, now) {
  const info = run.info;
  const key = JSON.stringify(cols);
  if (run.cellKey !== key) {
    run.cellKey = key;
    run.cells = new Map();
    for (const [col] of cols) {
      const cls = (FIXED.find(([k]) => k === col) || [0, 0, col.startsWith("c:") ? "cfg" : "num"])[2];
      run.cells.set(col, el("td", { className: cls }));
    }
    run.row.replaceChildren(run.lead, ...run.cells.values(), run.tail);
    const span = cols.length + 2;
    run.errRow.firstChild.colSpan = span;
    run.cfgRow.firstChild.colSpan = span;
  }
  for (const [col, td] of run.cells) {
    if (col === "name") {
      if (td.title !== info.name) {
        td.replaceChildren(el("span", { className: "swatch", style: `background:${run.color}` }), info.name);
        td.title = info.name;
      }
      continue;
    }
    const v = valueOf(run, col);
    const text = col === "written" ? ago(v, now) : col === "step" ? (v == null ? "—" : String(v))
      : fmtCell(v);
    if (col.startsWith("m:") || col.startsWith("c:")) td.title = v === undefined ? "" : fmtValue(v);
    if (td.textContent !== text) td.textContent = text;
    if (col === "status") td.className = `status status-${info.status}`;
  }
  const err = info.error || (info.config_error ? `config: ${info.config_error}` : "");
  run.errRow.hidden = !err;
  if (run.errRow.firstChild.textContent !== err) run.errRow.firstChild.textContent = err;
  run.box.disabled = !!info.error && !run.selected;
}

let lastNow = 0;

/** Lay the table out again from what the last answer said (columns, sort, rows). */
function refresh() {
  renderHead();
  const cols = columns();
  const rows = listedRuns();
  for (const run of rows) renderRow(run, cols, lastNow);
  if (table.sort) {
    const { col, dir } = table.sort;
    rows.sort((a, b) => dir * compare(valueOf(a, col), valueOf(b, col)));
  }
  const body = $("runs").tBodies[0];
  const want = rows.flatMap((r) => [r.row, r.errRow, r.cfgRow]);
  const have = body.children;
  if (want.length !== have.length || want.some((tr, i) => have[i] !== tr)) body.replaceChildren(...want);
  $("runs-count").textContent = `${rows.length} of ${table.total ?? rows.length} runs`;
}

/** Take a `/api/runs` answer: new runs get rows, every listed row is updated in place. */
export function update(answer) {
  lastNow = answer.now;
  table.total = answer.total;
  table.differ = answer.differ || [];
  table.keys = answer.keys || [];
  table.listed = new Set(answer.runs.map((r) => r.id));
  for (const info of answer.runs) {
    const run = table.runs.get(info.id) || addRun(info);
    run.info = info;
  }
  refresh();
  const list = $("column-keys");
  const opts = table.keys.join("\n");
  if (list.dataset.key !== opts) {
    list.dataset.key = opts;
    list.replaceChildren(...table.keys.map((k) => el("option", { value: k })));
  }
}

export function listedRuns() { return table.order.filter((r) => table.listed.has(r.id)); }

/** The runs the charts draw: selected, listed, and readable. */
export function selectedRuns() { return listedRuns().filter((r) => r.selected && !r.info.error); }

/** The query string of a runs request: the filter and what the columns need. */
export function runsQuery() {
  const p = new URLSearchParams();
  if (state.where.trim()) p.set("where", state.where);
  for (const k of new Set([...table.added, ...state.groupBy])) p.append("column", k);
  for (const m of table.last) p.append("last", m);
  return p.toString();
}

/** The config diff of the selected runs, as a table under the runs. */
export async function showDiff() {
  const box = $("diff");
  const runs = selectedRuns();
  if (runs.length < 2) { box.hidden = false; box.replaceChildren(el("p", { textContent: "Select two or more runs to compare their configs." })); return; }
  const p = new URLSearchParams();
  runs.forEach((r) => p.append("run", r.id));
  let res;
  try { res = await getJSON(`api/diff?${p}`); }
  catch (e) { box.hidden = false; box.replaceChildren(el("p", { className: "err", textContent: String(e.message || e) })); return; }
  const close = el("button", { className: "link", textContent: "close" });
  close.addEventListener("click", () => { box.hidden = true; });
  const head = el("tr", {}, el("th", { textContent: "config key" }),
    ...res.runs.map((n) => el("th", { textContent: n, title: n })));
  const rows = res.keys.map((k) => el("tr", {}, el("td", { className: "key", textContent: k.key }),
    ...k.values.map((v, i) => k.unreadable[i]
      ? el("td", { textContent: "(unreadable)", className: "absent", title: res.config_errors[i] })
      : el("td", { textContent: k.present[i] ? fmtCell(v) : "(absent)",
        className: k.present[i] ? "" : "absent" }))));
  box.hidden = false;
  box.replaceChildren(
    el("p", {}, `${res.keys.length} config key(s) differ among ${res.runs.length} runs `, close),
    el("table", { className: "diff" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}
