// Shared state and small helpers of the dashboard page.

export const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
  "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
export const ELAPSED = "clock/elapsed"; // written by a writer opened with clock=True

export const state = {
  x: "step", logy: false, smooth: 0, filter: "",
  where: "", // the runs query, as last sent
  groupBy: [], // config keys runs are grouped by (empty: one curve per run)
  gen: 0, // bumped when x or smoothing change: answers to older requests are dropped
};

export const $ = (id) => document.getElementById(id);

export function el(tag, props = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

export async function getJSON(url) {
  const res = await fetch(url, { cache: "no-store" });
  if (!res.ok) {
    const err = new Error((await res.text()) || `${res.status} for ${url}`);
    err.status = res.status;
    throw err;
  }
  return res.json();
}

export function fmtValue(v, dtype) {
  if (v == null) return "—";
  if (typeof v === "number" && dtype === "f32") { // the shortest decimal that reads back as the same float32
    for (let p = 6; p <= 9; p++) {
      const s = +v.toPrecision(p);
      if (Math.fround(s) === Math.fround(v)) return String(s);
    }
  }
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

/** A cell's text: numbers to 6 significant digits, everything else as JSON would write it. */
export function fmtCell(v) {
  if (v === undefined) return "";
  if (typeof v === "number") return fmtTick(v);
  if (typeof v === "string") return v;
  return JSON.stringify(v);
}

export function fmtTick(v) {
  if (v == null) return "";
  const s = +v.toPrecision(6);
  const a = Math.abs(s);
  return a !== 0 && (a >= 1e6 || a < 1e-3) ? s.toExponential() : String(s);
}

/** Seconds as h:mm:ss (or m:ss under an hour). */
export function fmtDuration(v) {
  if (v == null) return "";
  const sign = v < 0 ? "-" : "";
  let s = Math.abs(v);
  if (s < 60 && s !== Math.round(s)) return `${sign}${+s.toPrecision(3)} s`;
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  const two = (n) => String(n).padStart(2, "0");
  return h ? `${sign}${h}:${two(m)}:${two(sec)}` : `${sign}${m}:${two(sec)}`;
}

export function ago(t, now) {
  if (t == null) return "—";
  const s = Math.max(0, now - t);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return new Date(t * 1000).toISOString().slice(0, 10);
}

export function debounce(fn, ms) {
  let t = null;
  return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
}

/** One CSV field: quoted when it holds a comma, quote or line break. */
export function csvField(v) {
  const s = v == null ? "" : String(v);
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function download(name, text, type = "text/csv") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = el("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
