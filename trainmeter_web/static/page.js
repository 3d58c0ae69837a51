// What every part of the page shares: the live state, safe DOM helpers (strings always become text nodes), the
// metric lookups, chart placement, and the tooltip that shows a number's formula and inputs from the engine's explain.
// Nothing here builds HTML from data.

import { attemptMarks } from "./attempts.js";
import { Chart } from "./chart.js";
import { axisValue, byUnit, clock, factText, finite, metricText, percent } from "./format.js";
import { remembered } from "./prefs.js";

export const POINTS = 600;

export const AXES = { step: "step", tokens: "tokens", flop: "FLOPs spent", wall: "wall time" };

export const LOOP_KNOWN = new Set(["train_loss", "val_loss", "lr", "grad_norm"]);

export const TITLES = {
  tokens_per_s: "Tokens/s", step_time_s: "Step time", mfu: "MFU", mfu_avg: "MFU (training-window average)",
  ofu: "OFU", goodput: "Goodput", flop_per_token: "FLOPs per token", progress: "Progress", eta_s: "ETA",
  spent_flop: "FLOPs spent", required_flop: "FLOPs required", tokens: "Tokens seen", gpu_hours: "GPU-hours",
  util_gpu: "GPU-Util", sm_active: "SM active", tensor_active: "Tensor active", dram_active: "DRAM active",
  arithmetic_intensity: "Arithmetic intensity", observed_flop: "Observed FLOPs", mfu_ofu_gap: "OFU − MFU",
  straggler_spread: "Straggler spread", plan_mfu: "Planned MFU", plan_hours: "Planned hours",
  projected_hours: "Projected hours", energy_j: "Energy", host_cpu_cores: "Process tree CPU",
  host_rss_b: "Process tree memory", node_cpu_iowait: "Node iowait", node_mem_available_b: "Node memory available",
  profile_mfu: "MFU in the profiled window", profile_flop_per_s: "FLOP/s in the profiled window",
  profile_idle: "GPU idle in the profiled window", profile_exposed_communication: "Exposed communication (profiled)",
};

export const GPU_COUNTERS = {
  util_gpu: ["GPU-Util", (v) => percent(v)], sm_active: ["SM active", (v) => percent(v)],
  tensor_active: ["Tensor active", (v) => percent(v)], dram_active: ["DRAM active", (v) => percent(v)],
  power_w: ["Power", (v) => byUnit(v, "W")], clock_sm_mhz: ["SM clock", (v) => byUnit(v, "MHz")],
};

export const state = {
  doc: null, // the live document: snapshot, status, overhead, alerts, catalog
  series: {}, // name -> [[x, value, min, max, count], ...] on state.axis
  axis: ({ flops: "flop" })[remembered("tm-axis")] || remembered("tm-axis") || "step",
  run: null, // /api/run
  passport: null,
  source: null,
  connected: false,
  asOf: null, // a report file: when it was written (it is not live)
  renderQueued: false,
  dirty: new Set(),
};

export const charts = new Map();

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, String(v));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function setText(node, text) {
  const value = String(text ?? "");
  if (node.textContent !== value) node.textContent = value;
}

export const $ = (id) => document.getElementById(id);

export function metric(key) {
  const snap = state.doc && state.doc.snapshot;
  return snap && snap.metrics ? snap.metrics[key] : undefined;
}

export function explainOf(key) {
  const snap = state.doc && state.doc.snapshot;
  return snap && snap.explain ? snap.explain[key] : undefined;
}

export function titleOf(key) {
  if (TITLES[key]) return TITLES[key];
  if (key.startsWith("flop_per_token.")) return `FLOPs per token (${key.slice(16)})`;
  return key;
}

export function catalog() {
  return (state.doc && state.doc.catalog) || {};
}

export function rawKeyNote(name) {
  const entry = catalog()[name];
  return entry && entry.raw_key ? `${name} ← raw key ${entry.raw_key}` : name;
}

export function numberFormat(v) {
  return byUnit(v, "");
}

export function stat(label, key, text, extra) {
  const box = el("div", { class: "stat" }, el("div", { class: "label" }, label));
  box.append(el("div", { class: "v num", "data-explain": key, tabindex: 0 }, text));
  if (extra) box.append(el("div", { class: "label" }, extra));
  return box;
}

export function card(parent, id, title, sub) {
  let node = document.getElementById(id);
  if (!node) {
    node = el("div", { class: "card", id }, el("h3", {}, title), el("p", { class: "sub" }), el("div", { class: "body" }));
    parent.append(node);
  }
  setText(node.querySelector(".sub"), sub);
  return node.querySelector(".body");
}

export function meterRow(label, key) {
  const m = metric(key);
  const v = m && finite(m.value) ? m.value : m && finite(m.high) ? m.high : null;
  const bar = el("span");
  bar.style.width = `${v === null ? 0 : Math.max(0, Math.min(1, v)) * 100}%`;
  return [
    el("div", {}, label),
    el("div", { class: "meter" }, bar),
    el("div", { class: "v num", "data-explain": key, tabindex: 0 }, metricText(m, key)),
  ];
}

export function emptyLine(parent, id, text) {
  let line = document.getElementById(id);
  if (!line) {
    line = el("p", { class: "empty", id });
    parent.append(line);
  }
  setText(line, text);
  return line;
}

export function clearEmpty(id) {
  const line = document.getElementById(id);
  if (line) line.remove();
}

export function axisAvailable(axis) {
  const snap = state.doc.snapshot;
  if (axis === "tokens") return snap.tokens !== undefined && snap.tokens !== null ? null : "tokens per step unknown: pass --tokens-per-step";
  if (axis === "flop") {
    const spent = metric("spent_flop");
    if (spent && finite(spent.value) && spent.convention) return null;
    return spent && spent.absent ? spent.absent : "the FLOPs axis needs one convention: pass --convention";
  }
  return null;
}

export function xLabel() {
  if (state.axis === "flop") {
    const spent = metric("spent_flop");
    return `FLOPs spent (${(spent && spent.convention) || "no convention"})`;
  }
  if (state.axis === "wall") return "wall time (since the start)";
  return AXES[state.axis];
}

export function chartIn(parent, id, title, sub, yFormat, options = {}) {
  let chart = charts.get(id);
  if (!chart) {
    chart = new Chart(parent, { id, title, sub, yFormat, robust: options.robust, logToggle: options.logToggle });
    chart.onHover = showChartTip;
    charts.set(id, chart);
  } else chart.setText(title, sub);
  if (chart.root.parentElement !== parent) parent.append(chart.root);
  return chart;
}

// options: robust (the y range follows the bulk of the values), logToggle, marks and notes (see Chart.set)
export function plot(parent, id, title, sub, lines, yFormat, hline, options = {}) {
  const drawn = lines.filter((l) => state.series[l.name] && state.series[l.name].length);
  if (!drawn.length) {
    // a chart with no data is left out
    const existing = charts.get(id);
    if (existing) {
      existing.remove();
      charts.delete(id);
    }
    return false;
  }
  const chart = chartIn(parent, id, title, sub, yFormat, options);
  chart.set({
    lines: drawn.map((l) => ({ ...l, points: state.series[l.name] })),
    xAxis: state.axis,
    xLabel: xLabel(),
    xFormat: (v) => axisValue(v, state.axis, state.run && state.run.start_wall),
    hline,
    marks: [...(options.marks || []), ...attemptMarks(state)],
    notes: options.notes,
  });
  return true;
}

export const tip = () => $("tooltip");

export function showTip(rows, x, y) {
  const node = tip();
  node.replaceChildren(...rows);
  node.hidden = false;
  const w = node.offsetWidth;
  const h = node.offsetHeight;
  node.style.left = `${Math.max(8, Math.min(window.innerWidth - w - 8, x + 14))}px`;
  node.style.top = `${Math.max(8, Math.min(window.innerHeight - h - 8, y + 14))}px`;
}

export function hideTip() {
  tip().hidden = true;
}

export function showChartTip(lines, x, y) {
  if (!lines) return hideTip();
  showTip(lines.map((t, i) => el("div", { class: i ? "" : "t-title" }, t)), x, y);
}

export function explainRows(key) {
  if (key === "overhead") {
    const o = (state.doc && state.doc.overhead) || {};
    return [el("div", { class: "t-title" }, "tm's own overhead"),
      el("div", {}, finite(o.agent_us_per_step)
        ? `the agent spent ${byUnit(o.agent_us_per_step, "")} µs per step on average over the ${o.agent_steps} steps it timed (one in 16)`
        : o.agent_absent || "n/a"),
      el("div", {}, finite(o.dropped_total) ? `${o.dropped_total} records dropped on the bus` : o.drops_absent || "")];
  }
  if (key.startsWith("money.")) {
    // Money's figures are the server's overlay (model/money.py), not the engine's: their formula and the price.
    const doc = (state.doc && state.doc.money) || {};
    const f = (doc.figures || {})[key.slice("money.".length)];
    if (!f) return [el("div", {}, doc.absent || "n/a")];
    return [el("div", { class: "t-title" }, key.slice("money.".length).replaceAll("_", " ")),
      el("div", { class: "t-formula" }, f.formula),
      ...Object.entries(f.inputs || {}).map(([name, value]) => el("div", {}, `${name} = ${value}`)),
      f.absent ? el("div", { class: "t-absent" }, `n/a: ${f.absent}`) : null,
      el("div", { class: "muted" }, doc.price.words)].filter(Boolean);
  }
  if (key === "elapsed" || key === "steps") {
    return [el("div", { class: "t-title" }, key), el("div", {}, "from the engine's clock: the hub's ticks")];
  }
  const m = metric(key);
  const ex = explainOf(key);
  const rows = [el("div", { class: "t-title" }, `${titleOf(key)}: ${metricText(m, key)}`)];
  if (m) {
    const labels = [m.convention && `convention ${m.convention}`, m.label, m.unit && `unit ${m.unit}`].filter(Boolean);
    if (labels.length) rows.push(el("div", { class: "muted" }, labels.join(" · ")));
    if (m.absent) rows.push(el("div", { class: "t-absent" }, `n/a: ${m.absent}`));
  }
  if (ex) {
    rows.push(el("div", { class: "t-formula" }, ex.formula));
    for (const [name, input] of Object.entries(ex.inputs || {})) {
      const value = typeof input.value === "number" ? byUnit(input.value, input.unit || "", "") : factText({ value: input.value, unit: input.unit });
      rows.push(el("div", {}, `${name} = ${value}${input.source ? ` (${input.source})` : ""}`));
    }
    if (ex.note) rows.push(el("div", { class: "muted" }, ex.note));
  }
  return rows;
}

export function onPointer(e) {
  const target = e.target.closest ? e.target.closest("[data-explain]") : null;
  if (!target) {
    if (!e.target.closest || !e.target.closest("canvas")) hideTip();
    return;
  }
  showTip(explainRows(target.dataset.explain), e.clientX, e.clientY);
}

export function onFocus(e) {
  const target = e.target.closest ? e.target.closest("[data-explain]") : null;
  if (!target) return;
  const rect = target.getBoundingClientRect();
  showTip(explainRows(target.dataset.explain), rect.left, rect.bottom);
}
