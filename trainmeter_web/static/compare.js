// Runs side by side (tm view A B, tm compare -o FILE): what differs first, then the headline numbers against the first
// run, then the runs' curves overlaid on one x axis, drawn by the dashboard's own chart code. The numbers are the runs'
// engines' (the FLOPs axis and the MFU curve under the comparison's one convention, each MFU against its own run's
// peak). Strings from the runs go on the page as text only; an absent number reads "n/a" with its reason.

import { Chart, palette } from "./chart.js";
import { axisValue, byUnit, clock, percent, si, sig } from "./format.js";
import { $, el, hideTip, showChartTip } from "./page.js";
import { remember, remembered } from "./prefs.js";
import { carried, getJson, pointsOn } from "./source.js";
import { setupTheme } from "./theme.js";

const FRACTIONS = new Set(["mfu", "mfu_avg", "ofu", "goodput"]);
const AXES = ["step", "tokens", "flop", "wall"];

// One chart per curve; a chart no run has data for is left out.
const CHARTS = [
  { id: "chart-train-loss", title: "Train loss", series: "train_loss", format: (v) => sig(v), robust: true, logToggle: true },
  { id: "chart-val-loss", title: "Validation loss", series: "val_loss", format: (v) => sig(v) },
  { id: "chart-tokens-per-s", title: "Tokens/s", series: "tm:tokens_per_s", format: (v) => si(v), sub: "EMA over steps" },
  { id: "chart-step-time", title: "Step time", series: "tm:step_time_s", format: (v) => byUnit(v, "s"), sub: "EMA" },
  { id: "chart-mfu", title: "MFU", series: "mfu", format: percent, missing: "mfu" },
  { id: "chart-ofu", title: "OFU", series: "tm:ofu", format: percent, sub: "from counters" },
  { id: "chart-goodput", title: "Goodput", series: "tm:goodput", format: percent },
  { id: "chart-lr", title: "Learning rate", series: "lr", format: (v) => sig(v) },
  { id: "chart-grad-norm", title: "Gradient norm", series: "grad_norm", format: (v) => sig(v) },
];

const view = { data: null, axis: remembered("tm-compare-axis") || "step", charts: new Map() };

const comparison = () => view.data.comparison;
const convention = () => comparison().convention.name;

function valueText(value) {
  if (value === null || value === undefined) return "(not given)";
  if (value === true) return "(given)";
  if (Array.isArray(value)) return value.map(valueText).join(" ");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function numberText(value, row) {
  return FRACTIONS.has(row.key) ? percent(value) : byUnit(value, row.unit || "", row.key);
}

function differenceText(value, row) {
  if (value === null || value === undefined) return "";
  if (FRACTIONS.has(row.key)) return `${value < 0 ? "−" : "+"}${sig(Math.abs(value) * 100)} pp`;
  return `${value < 0 ? "−" : "+"}${numberText(Math.abs(value), row)}`;
}

function renderRuns() {
  const runs = comparison().runs;
  $("run-keys").replaceChildren(...runs.map((r, i) => {
    const key = el("span", { class: "key", "data-run": r.label }, r.label);
    key.style.setProperty("--swatch", palette(i));
    return key;
  }));
  const rows = runs.map((r, i) => {
    const key = el("span", { class: "key" }, r.label);
    key.style.setProperty("--swatch", palette(i));
    return el("tr", {}, el("td", { class: "legend" }, key), el("td", {}, r.name), el("td", {}, r.state),
      el("td", {}, r.devices), el("td", { class: "muted" }, r.convention ? `its FLOPs under ${r.convention}` : "its FLOPs a range over the conventions"),
      el("td", { class: "muted num" }, r.start_wall ? `started ${clock(r.start_wall)}` : ""));
  });
  $("run-list").replaceChildren(el("table", { id: "run-table" }, ...rows));
}

function renderDifferences() {
  const { runs, differences } = comparison();
  const body = $("difference-list");
  if (!differences.length) {
    body.replaceChildren(el("p", { class: "empty" },
      "Nothing differs in the command lines, environment, declared values, model shape, parallelism, hardware or versions."));
    return;
  }
  const head = el("tr", {}, el("th", {}, ""), el("th", {}, "what"), ...runs.map((r) => el("th", {}, r.label)));
  const rows = differences.map((d) => el("tr", {}, el("td", { class: "muted" }, d.category), el("td", {}, el("code", {}, d.name)),
    ...d.values.map((v) => el("td", { class: v === null ? "muted" : "" }, valueText(v)))));
  body.replaceChildren(el("table", { id: "difference-table" }, head, ...rows));
}

function renderHeadline() {
  const c = comparison();
  const base = c.baseline;
  $("headline-sub").textContent = c.convention.name
    ? `Against ${base}. FLOPs and MFU under ${c.convention.name}, each MFU against its own run's peak.`
    : `Against ${base}. FLOPs and MFU are not compared: ${c.convention.why}.`;
  const head = el("tr", {}, el("th", {}, ""), ...c.runs.map((r, i) => el("th", {}, i ? `${r.label} (against ${base})` : r.label)));
  const rows = c.headline.map((row) => el("tr", { "data-key": row.key },
    el("td", {}, row.title, row.convention ? el("span", { class: "muted" }, ` · ${row.convention}`) : null),
    ...row.values.map((v, i) => {
      if (v === null) return el("td", { class: "num muted", title: row.absent[i] || "" }, "n/a");
      const ratio = row.ratio[i];
      const against = i && row.difference[i] !== null
        ? el("div", { class: "muted" }, `${differenceText(row.difference[i], row)}${ratio ? ` · ×${sig(ratio)}` : ""}`)
        : null;
      return el("td", { class: "num" }, numberText(v, row), against);
    })));
  $("headline-table").replaceChildren(el("table", { id: "headline-numbers" }, head, ...rows));
  // Each reason a number is absent once, with the rows and runs it holds for.
  const absent = new Map();
  for (const row of c.headline) {
    row.absent.forEach((why, i) => {
      if (!why) return;
      const entry = absent.get(why) || { titles: new Set(), runs: new Set() };
      entry.titles.add(row.title);
      entry.runs.add(c.runs[i].label);
      absent.set(why, entry);
    });
  }
  const notes = [...c.notes, ...[...absent].map(([why, e]) => `${[...e.titles].join("; ")} (${[...e.runs].join(", ")}): n/a, ${why}`)];
  $("notes").replaceChildren(...notes.map((n) => el("li", {}, n)));
}

function pointsOf(run, series) {
  const entry = run.series[series];
  return entry ? pointsOn(entry, view.axis) : null;
}

function axisMissing(axis) {
  // An axis no run has a point on cannot be chosen; say why from the first run that lacks it.
  const runs = view.data.runs;
  if (runs.some((run) => Object.values(run.series).some((entry) => pointsOn(entry, axis)))) return null;
  const why = runs.map((run) => run.missing[axis]).find(Boolean);
  return why || `no run has points on ${axis}`;
}

function xLabel() {
  if (view.axis === "flop") return `FLOPs spent (${convention() || "no convention"})`;
  if (view.axis === "wall") return "time since each run's start";
  return view.axis;
}

function renderAxisButtons() {
  for (const button of document.querySelectorAll("#x-axis button")) {
    const axis = button.dataset.axis;
    const why = axisMissing(axis);
    button.disabled = Boolean(why) && axis !== view.axis;
    button.title = why || `every curve against ${axis === "flop" ? xLabel() : button.textContent}`;
    button.setAttribute("aria-pressed", axis === view.axis ? "true" : "false");
    if (axis === "flop" && convention()) button.textContent = `FLOPs spent (${convention()})`;
  }
}

function renderCharts() {
  const root = $("compare-charts");
  const runs = view.data.runs;
  for (const spec of CHARTS) {
    const lines = [];
    const notes = [];
    runs.forEach((run, i) => {
      const points = pointsOf(run, spec.series);
      if (points && points.length) {
        lines.push({ name: `${run.label}:${spec.series}`, label: run.label, color: palette(i), points });
      } else {
        const why = (spec.missing && run.missing[spec.missing]) || run.missing[view.axis];
        notes.push(`${run.label}: no ${spec.title.toLowerCase()} on this axis${why ? ` (${why})` : ""}`);
      }
    });
    let chart = view.charts.get(spec.id);
    if (!lines.length) {
      if (chart) {
        chart.remove();
        view.charts.delete(spec.id);
      }
      continue;
    }
    const sub = spec.series === "mfu" ? `under ${convention()}, each run against its own peak` : spec.sub || "";
    if (!chart) {
      chart = new Chart(root, { id: spec.id, title: spec.title, sub, yFormat: spec.format, robust: spec.robust, logToggle: spec.logToggle });
      chart.onHover = showChartTip;
      view.charts.set(spec.id, chart);
    }
    chart.setText(spec.title, sub);
    chart.set({
      lines,
      xAxis: view.axis,
      xLabel: xLabel(),
      xFormat: (v) => axisValue(v, view.axis, 0),
      notes: lines.length < runs.length ? notes : [],
    });
  }
  if (!view.charts.size) {
    root.replaceChildren(el("p", { class: "empty" }, "No run has a curve on this axis."));
  }
}

function render() {
  renderRuns();
  renderDifferences();
  renderHeadline();
  renderAxisButtons();
  renderCharts();
}

async function init() {
  view.data = carried() || (await getJson("/api/compare"));
  const file = Boolean(document.getElementById("tm-data"));
  $("conn").textContent = `${file ? "written" : "as of"} ${clock(view.data.written_wall)}`;
  if (file) {
    $("footer").textContent = `trainmeter comparison · written ${clock(view.data.written_wall)} by tm ${view.data.tm_version} `
      + `from each run's log · curves hold up to ${view.data.points} points a run`;
  }
  if (!AXES.includes(view.axis) || axisMissing(view.axis)) view.axis = "step";
  setupTheme($("theme-toggle"), () => {
    for (const chart of view.charts.values()) chart.draw();
    if (view.data) renderRuns();
  });
  for (const button of document.querySelectorAll("#x-axis button")) {
    button.addEventListener("click", () => {
      if (button.dataset.axis === view.axis) return;
      view.axis = button.dataset.axis;
      remember("tm-compare-axis", view.axis);
      renderAxisButtons();
      renderCharts();
    });
  }
  document.addEventListener("scroll", hideTip, { passive: true });
  render();
}

init();
