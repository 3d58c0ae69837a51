// The Profile part: where each profiled step's GPU time went, from the profiler traces tm imported (tm import, or the
// run's own torch.profiler traces at its end). One stacked bar per rank, the profiled steps, the top kernels, what the
// profiled window achieved next to the run's MFU, HTA's breakdown and the spread between ranks. Every string from a
// trace (kernel names, file names) goes in as text only.

import { palette } from "./chart.js";
import { byUnit, finite, metricText, percent } from "./format.js";
import { $, card, el, emptyLine, clearEmpty, metric, stat, state } from "./page.js";

export const PROFILE_PARTS = ["gemm", "attention", "other_compute", "communication", "memory", "idle"];
const PART_NAMES = {
  gemm: "GEMM", attention: "attention", other_compute: "other compute",
  communication: "communication (exposed)", memory: "memory copies", idle: "idle",
};

export function partColor(part) {
  return part === "idle" ? "var(--meter-track)" : palette(PROFILE_PARTS.indexOf(part));
}

function ms(seconds) {
  return finite(seconds) ? byUnit(seconds, "s") : "n/a";
}

function who(record) {
  return record.rank !== undefined && record.rank !== null ? `rank ${record.rank}` : "the process";
}

// A stacked bar of one window's split, and its legend (shares of the window).
function splitBar(record, withLegend) {
  const window = record.window_s;
  const split = record.split_s || {};
  const bar = el("div", { class: "split", role: "img", "aria-label": `${who(record)} time split` });
  const legend = el("div", { class: "legend" });
  for (const part of PROFILE_PARTS) {
    const v = split[part];
    if (!finite(v) || !finite(window) || window <= 0) continue;
    const seg = el("span", { title: `${PART_NAMES[part]} ${ms(v)}` });
    seg.style.width = `${(v / window) * 100}%`;
    seg.style.background = partColor(part);
    bar.append(seg);
    if (withLegend && v > 0) {
      const key = el("span", { class: "key", "data-part": part }, `${PART_NAMES[part]} ${percent(v / window)}`);
      key.style.setProperty("--swatch", partColor(part));
      legend.append(key);
    }
  }
  return withLegend ? [bar, legend] : [bar];
}

export function renderProfile() {
  const root = $("profile-cards");
  const view = state.doc.snapshot.profile;
  if (!view || !view.traces || !view.traces.length) {
    root.replaceChildren();
    emptyLine(root, "profile-empty",
      "No profile imported: run torch.profiler inside tm (its traces are imported when the run ends), or tm import RUN TRACE.");
    return;
  }
  clearEmpty("profile-empty");
  renderRanks(root, view);
  renderAchieved(root, view);
  renderSteps(root, view);
  renderKernels(root, view);
}

function renderRanks(root, view) {
  const sub = view.traces.length > 1
    ? "the latest trace of each rank: one bar each, over its profiled window"
    : "over the profiled window: compute first, then communication no compute hides, copies, idle";
  const body = card(root, "profile-split", "Where the GPU time went", sub);
  const rows = [];
  for (const trace of view.traces) {
    const steps = trace.steps && trace.steps.length
      ? `steps ${trace.steps[0]}–${trace.steps[trace.steps.length - 1]}`
      : trace.profiler_steps && trace.profiler_steps.length
        ? `profiler steps ${trace.profiler_steps[0]}–${trace.profiler_steps[trace.profiler_steps.length - 1]}`
        : "the whole trace";
    const head = el("div", { class: "profile-rank-head" },
      el("strong", {}, who(trace)), ` · ${steps} · ${ms(trace.window_s)} · ${trace.profiler}`);
    const row = el("div", { class: "profile-rank", "data-rank": trace.rank ?? "" }, head);
    if (trace.split_s && Object.keys(trace.split_s).length) row.append(...splitBar(trace, true));
    else row.append(el("p", { class: "empty" }, (trace.absent && trace.absent.split_s) || "no GPU time in the trace"));
    for (const hint of trace.hints || []) row.append(el("p", { class: "sub hint" }, hint));
    rows.push(row);
  }
  if (view.straggler) rows.push(el("p", { class: "sub straggler" }, view.straggler));
  body.replaceChildren(...rows);
}

function renderAchieved(root, view) {
  const body = card(root, "profile-achieved", "In the profiled window",
    "FLOPs of the ops the profiler counted, and HTA's breakdown (its rules: the last profiler step left out)");
  const run = metric("mfu_avg") || metric("mfu");
  const stats = [
    stat("MFU in the window", "profile_mfu", metricText(metric("profile_mfu"), "profile_mfu"), "profiled window"),
    stat("run's MFU", run === metric("mfu_avg") ? "mfu_avg" : "mfu", metricText(run, "mfu"), (run && run.convention) || "range over the conventions"),
    stat("FLOP/s in the window", "profile_flop_per_s", metricText(metric("profile_flop_per_s"), "profile_flop_per_s")),
  ];
  const rows = [el("div", { class: "stats" }, ...stats)];
  const table = el("table", { class: "profile-hta" },
    el("tr", {}, el("th", {}, ""), el("th", {}, "idle"), el("th", {}, "compute"), el("th", {}, "non-compute"), el("th", {}, "span")));
  for (const trace of view.traces) {
    const h = trace.hta;
    if (!h) continue;
    table.append(el("tr", {}, el("td", {}, who(trace)),
      el("td", { class: "num" }, finite(h.idle_pct) ? `${h.idle_pct.toFixed(2)}%` : "n/a"),
      el("td", { class: "num" }, finite(h.compute_pct) ? `${h.compute_pct.toFixed(2)}%` : "n/a"),
      el("td", { class: "num" }, finite(h.non_compute_pct) ? `${h.non_compute_pct.toFixed(2)}%` : "n/a"),
      el("td", { class: "num" }, ms(h.span_s))));
  }
  if (table.rows.length > 1) rows.push(table);
  const spread = Object.entries(view.spread || {}).filter(([, v]) => finite(v) && v >= 0.005);
  if (spread.length) {
    rows.push(el("p", { class: "sub" }, `Spread between ranks (largest share of a window minus the smallest): ${spread.map(([k, v]) => `${PART_NAMES[k] || k} ${percent(v)}`).join(", ")}`));
  }
  body.replaceChildren(...rows);
}

function renderSteps(root, view) {
  const steps = view.steps || [];
  const body = card(root, "profile-steps", "Profiled steps", "each profiler step, the run's step it maps to (by wall time), and its split");
  if (!steps.length) {
    body.replaceChildren(el("p", { class: "empty" }, "The traces hold no ProfilerStep annotation: the whole trace is one window."));
    return;
  }
  const table = el("table", { class: "profile-steps" },
    el("tr", {}, el("th", {}, "rank"), el("th", {}, "profiler step"), el("th", {}, "run step"), el("th", {}, "window"), el("th", {}, "split")));
  for (const s of steps.slice(-40)) {
    const runStep = finite(s.step) ? String(s.step) : "n/a";
    const cell = el("td", { class: "bar-cell" });
    if (s.split_s && Object.keys(s.split_s).length) cell.append(...splitBar(s, false));
    else cell.append("no GPU time");
    table.append(el("tr", { title: s.absent && s.absent.step ? s.absent.step : "" },
      el("td", {}, s.rank ?? "–"), el("td", { class: "num" }, `#${s.profiler_step}`),
      el("td", { class: "num" }, runStep), el("td", { class: "num" }, ms(s.window_s)), cell));
  }
  body.replaceChildren(table);
}

function renderKernels(root, view) {
  const body = card(root, "profile-kernels", "Top kernels", "by total time in the trace, with how often they ran and their mean");
  const rows = [];
  for (const trace of view.traces.slice(0, 4)) {
    if (!trace.top_kernels || !trace.top_kernels.length) continue;
    const table = el("table", { class: "profile-kernels" },
      el("tr", {}, el("th", {}, `${who(trace)}: kernel`), el("th", {}, "class"), el("th", {}, "count"), el("th", {}, "total"), el("th", {}, "mean")));
    for (const k of trace.top_kernels) {
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = partColor(k.category === "mixed" ? "other_compute" : k.category);
      table.append(el("tr", {},
        el("td", { class: "kernel-name", title: k.name }, k.name),
        el("td", {}, swatch, (PART_NAMES[k.category] || k.category).replace(" (exposed)", "")),
        el("td", { class: "num" }, String(k.count)),
        el("td", { class: "num" }, ms(k.total_s)),
        el("td", { class: "num" }, k.count ? ms(k.total_s / k.count) : "n/a")));
    }
    rows.push(table);
  }
  if (!rows.length) rows.push(el("p", { class: "empty" }, "No GPU kernel in the traces."));
  body.replaceChildren(...rows);
}

// The profiled steps as marks on a chart of steps (the step-time chart): on the step axis, or in wall time.
export function profiledMarks(axis) {
  const view = state.doc && state.doc.snapshot && state.doc.snapshot.profile;
  if (!view || !view.steps) return [];
  const marks = [];
  const color = getComputedStyle(document.documentElement).getPropertyValue("--accent").trim() || "#2563eb";
  for (const s of view.steps) {
    let from = null;
    let to = null;
    if (axis === "step" && finite(s.step)) {
      from = s.step - 0.5;
      to = s.step + 0.5;
    } else if (axis === "wall" && finite(s.window_start_wall)) {
      from = s.window_start_wall;
      to = s.window_end_wall;
    }
    if (from !== null) marks.push({ from, to, label: marks.length ? "" : "profiled", color });
  }
  return marks;
}
