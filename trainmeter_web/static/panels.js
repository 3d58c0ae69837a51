// The lower parts of the page: GPU efficiency, the node, the GPUs, alerts, run details and the model card.
// Strings from the run (facts, the command, alert messages) go in as text nodes only.

import { attemptBars, BUCKET_WORDS, BUCKETS, bucketColor } from "./badput.js";
import { palette } from "./chart.js";
import { byUnit, clock, duration, factText, finite, metricText, percent, si } from "./format.js";
import { profiledMarks } from "./profile.js";
import { $, card, catalog, charts, clearEmpty, el, emptyLine, explainOf, GPU_COUNTERS, metric, meterRow, plot, setText, stat, state } from "./page.js";

export function renderEfficiency() {
  const root = $("efficiency-cards");
  const ladder = card(root, "ladder-card", "Utilization ladder", "GPU-Util ≥ SM active ≥ tensor active ≥ OFU ≥ MFU, now");
  const mfuConv = (metric("mfu") || {}).convention;
  const mfuName = `MFU (${mfuConv || "range"})`;
  const rows = [["GPU-Util", "util_gpu"], ["SM active", "sm_active"], ["Tensor active", "tensor_active"], ["OFU", "ofu"], [mfuName, "mfu"]];
  const grid = el("div", { class: "ladder" });
  for (const [label, key] of rows) grid.append(...meterRow(label, key));
  ladder.replaceChildren(grid);
  plot(root, "chart-ladder", "Utilization over time", "the ladder's rungs per tick", [
    { name: "tm:util_gpu", label: "GPU-Util" }, { name: "tm:sm_active", label: "SM active" },
    { name: "tm:tensor_active", label: "tensor active" }, { name: "tm:ofu", label: "OFU" },
    { name: "tm:mfu", label: mfuName }, { name: "tm:mfu.high", label: `${mfuName}, highest convention` },
  ], percent);
  renderRoofline(root);
  const ai = metric("arithmetic_intensity");
  plot(root, "chart-intensity", "Arithmetic intensity", ai && ai.label ? ai.label : "FLOP per byte of memory traffic",
    [{ name: "tm:arithmetic_intensity", label: "FLOP/B" }], (v) => byUnit(v, "FLOP/byte"));
  const modeled = card(root, "flops-card", "FLOPs modeled and observed", "modeled from the convention, observed from counters (approximate)");
  const spent = metric("spent_flop");
  modeled.replaceChildren(el("div", { class: "stats" },
    stat("modeled (FLOPs spent)", "spent_flop", metricText(spent, "spent_flop"), spent && spent.convention ? spent.convention : "range over the conventions"),
    stat("observed", "observed_flop", metricText(metric("observed_flop"), "observed_flop"), "counters, approximate"),
    stat("OFU − MFU", "mfu_ofu_gap", metricText(metric("mfu_ofu_gap"), "mfu_ofu_gap"),
      (metric("mfu_ofu_gap") || {}).convention || "MFU's convention range"),
  ));
}

export function renderRoofline(root) {
  const ai = metric("arithmetic_intensity");
  const mfu = metric("mfu");
  const ex = explainOf("arithmetic_intensity");
  const ridge = ex && ex.inputs && ex.inputs.ridge_flop_per_byte ? ex.inputs.ridge_flop_per_byte.value : null;
  const body = card(root, "roofline-card", "Roofline point", ai && ai.label ? ai.label : "aggregate over the window, not per kernel");
  const x = ai && (finite(ai.value) ? ai.value : finite(ai.low) ? Math.sqrt(ai.low * ai.high) : null);
  const y = mfu && (finite(mfu.value) ? mfu.value : finite(mfu.low) ? (mfu.low + mfu.high) / 2 : null);
  if (!finite(x) || !finite(y) || !finite(ridge)) {
    body.replaceChildren(el("p", { class: "empty", "data-explain": "arithmetic_intensity", tabindex: 0 },
      `No roofline point: ${(ai && ai.absent) || "needs MFU, DRAM activity (GPM) and the device's memory bandwidth"}.`));
    return;
  }
  let canvas = body.querySelector("canvas");
  if (!canvas) {
    canvas = el("canvas", { class: "roofline", role: "img", "aria-label": "roofline" });
    canvas.style.width = "100%";
    canvas.style.height = "150px";
    body.replaceChildren(canvas, el("p", { class: "sub num" }));
  }
  const conv = mfu.convention || "middle of the conventions' range";
  setText(body.querySelector("p"), `${byUnit(x, "FLOP/byte")} at ${percent(y)} of the dense peak (MFU, ${conv}) · ridge ${byUnit(ridge, "FLOP/byte")}`);
  drawRoofline(canvas, x, y, ridge);
}

export function drawRoofline(canvas, x, y, ridge) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 300;
  const h = canvas.clientHeight || 150;
  canvas.width = w * dpr;
  canvas.height = h * dpr;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  const lx0 = Math.log10(Math.min(x, ridge) / 10);
  const lx1 = Math.log10(Math.max(x, ridge) * 10);
  const ly0 = Math.log10(Math.min(y, 0.01) / 2);
  const sx = (v) => 8 + ((Math.log10(v) - lx0) / (lx1 - lx0)) * (w - 16);
  const sy = (v) => 8 + (1 - (Math.log10(v) - ly0) / (0 - ly0)) * (h - 16);
  const color = palette(0);
  ctx.strokeStyle = color;
  ctx.lineWidth = 2;
  ctx.beginPath();
  const xa = 10 ** lx0;
  ctx.moveTo(sx(xa), sy(Math.max(xa / ridge, 10 ** ly0)));
  ctx.lineTo(sx(ridge), sy(1));
  ctx.lineTo(sx(10 ** lx1), sy(1));
  ctx.stroke();
  ctx.fillStyle = palette(1);
  ctx.beginPath();
  ctx.arc(sx(x), sy(Math.max(y, 10 ** ly0)), 5, 0, Math.PI * 2);
  ctx.fill();
}

export const SPLIT_ORDER = BUCKETS;

const PROBE_PARTS = { compile: "compile", data_wait: "data wait", checkpoint: "checkpoints", eval: "eval" };

// A part's name as a person reads it (the badput buckets' words).
export function splitName(name) {
  return BUCKET_WORDS[name] || name.replaceAll("_", " ");
}

// The parts the time split cannot see, as the engine decides it (a part with a phase, or an attached probe, is
// measured): {part: why}. They stay inside compute.
export function unmeasured() {
  const seen = state.doc.phases_seen || {};
  const facts = state.doc.snapshot.facts || {};
  const out = {};
  for (const part of Object.keys(PROBE_PARTS)) {
    const fact = facts[`probe.${part}`];
    const status = fact ? fact.value : undefined;
    if (seen[part] || status === "attached") continue;
    out[part] = typeof status === "string" ? status.replace(/^not attached: /, "") : "no probe reported";
  }
  return out;
}

// The time split's caption: said plainly, where the engine's note says "stays in compute, its probe never attached".
export function unmeasuredCaption() {
  if (!state.doc.phases_seen) {
    const ex = explainOf("time_split");
    return ex && ex.note ? ex.note : "where the elapsed time went";
  }
  const missing = Object.entries(unmeasured()).map(([part, why]) => `${PROBE_PARTS[part]} (${why})`);
  if (!missing.length) return "where the elapsed time went; every part was measured";
  return `where the elapsed time went. Not measured, so counted as compute: ${missing.join("; ")}`;
}

export function renderNode() {
  const root = $("node-cards");
  const phases = state.doc.snapshot.phases_s || {};
  const total = Object.values(phases).reduce((a, b) => a + (finite(b) ? b : 0), 0);
  const body = card(root, "split-card", "Time split", unmeasuredCaption());
  if (!total) {
    body.replaceChildren(el("p", { class: "empty" }, "No time split yet: it starts with the run's first step."));
  } else {
    const bar = el("div", { class: "split", role: "img", "aria-label": "time split" });
    const legend = el("div", { class: "legend" });
    const names = Object.keys(phases).sort((a, b) => {
      const ia = SPLIT_ORDER.indexOf(a);
      const ib = SPLIT_ORDER.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib);
    });
    const none = [];
    const blind = state.doc.phases_seen ? unmeasured() : {};
    names.forEach((name) => {
      const v = phases[name];
      if (!finite(v)) return;
      if (Math.abs(v) < 1e-9 && name in blind) return; // not measured: the caption says so, and "no time" would be untrue
      if (Math.abs(v) < 1e-9) {
        none.push(splitName(name)); // no time went there: one line below instead of a row of "0 ms (0%)"
        return;
      }
      if (v < 0) {
        // a part the engine computed below zero has no width to draw: its number is still shown, as it came
        legend.append(el("span", { class: "key", "data-part": name }, `${splitName(name)} ${duration(v)}`));
        return;
      }
      const seg = el("span");
      seg.style.width = `${(v / total) * 100}%`;
      seg.style.background = bucketColor(name);
      bar.append(seg);
      const key = el("span", { class: "key", "data-part": name }, `${splitName(name)} ${duration(v)} (${percent(v / total)})`);
      key.style.setProperty("--swatch", bucketColor(name));
      legend.append(key);
    });
    const rest = none.length ? el("p", { class: "sub", id: "split-none" }, `No time in: ${none.join(", ")}.`) : "";
    body.replaceChildren(bar, legend, rest, attemptBars(state));
  }
  const host = card(root, "host-card", "Host", "the run's process tree and the node, latest sample");
  const cores = metric("host_cpu_cores");
  host.replaceChildren(el("div", { class: "stats" },
    stat("process tree CPU", "host_cpu_cores", metricText(cores, "host_cpu_cores")),
    stat("process tree memory", "host_rss_b", metricText(metric("host_rss_b"), "host_rss_b")),
    stat("node iowait", "node_cpu_iowait", metricText(metric("node_cpu_iowait"), "node_cpu_iowait")),
    stat("node memory available", "node_mem_available_b", metricText(metric("node_mem_available_b"), "node_mem_available_b")),
    stat("energy", "energy_j", metricText(metric("energy_j"), "energy_j")),
  ));
}

export function renderGpus() {
  const root = $("gpu-charts");
  const byCounter = {};
  const ranks = [];
  for (const [name, entry] of Object.entries(catalog())) {
    if (entry.group === "gpu") (byCounter[entry.counter] = byCounter[entry.counter] || []).push([entry.device, name]);
    if (entry.group === "rank") ranks.push([entry.rank, name]);
  }
  let drawn = false;
  for (const [counter, [title, fmt]] of Object.entries(GPU_COUNTERS)) {
    const lines = (byCounter[counter] || []).sort().map(([device, name], i) => ({ name, label: device, color: palette(i) }));
    drawn = plot(root, `chart-gpu-${counter}`, title, "one line per GPU", lines, fmt) || drawn;
  }
  ranks.sort((a, b) => a[0] - b[0]);
  const marks = profiledMarks(state.axis);
  drawn = plot(root, "chart-rank-step-time", "Step time per rank",
    `seconds per step, one line per rank${marks.length ? "; profiled steps shaded" : ""}`,
    ranks.map(([rank, name], i) => ({ name, label: `rank ${rank}`, color: palette(i) })), (v) => byUnit(v, "s"), null,
    { marks }) || drawn;
  if (!drawn) {
    emptyLine(root, "gpus-empty", "No GPU samples and no per-rank step times: NVML sees no GPU of this run, and the agent saw no step yet.");
  } else clearEmpty("gpus-empty");
}

// A run that ended (or was lost) fires nothing any more: an episode it left open is said as such, not as "firing".
function runOver() {
  return Boolean(state.doc && state.doc.status && ["finished", "lost"].includes(state.doc.status.state));
}

export function renderAlerts() {
  const root = $("alert-list");
  const alerts = Object.values(state.doc.alerts || {});
  if (!alerts.length) {
    root.replaceChildren(el("p", { class: "empty" }, "No alert fired."));
    return;
  }
  alerts.sort((a, b) => (b.fired_wall || 0) - (a.fired_wall || 0));
  root.replaceChildren(...alerts.map((a) => el("div", { class: `alert ${a.severity} ${a.state}` },
    el("span", { class: "dot" }),
    el("div", {}, el("strong", {}, a.rule), " ", a.message, a.subject ? el("div", { class: "muted" }, a.subject) : null),
    el("div", { class: "muted num" },
      a.state === "cleared" ? `cleared ${a.cleared_wall ? clock(a.cleared_wall) : ""}` : runOver() ? "still firing when the run ended" : "firing",
      el("br"), a.fired_wall ? `fired ${clock(a.fired_wall)}` : ""))));
}

export function renderDetails() {
  const run = state.run;
  if (!run) return;
  const body = $("details-body");
  const kv = el("div", { class: "kv" });
  const rows = [
    ["command", el("code", { id: "run-command" }, (run.command || []).join(" "))],
    ["directory", run.run_dir], ["cwd", run.cwd], ["host", run.host],
    ["started", run.start_wall ? clock(run.start_wall) : "n/a"],
    ["versions", `tm ${run.tm_version || "?"} · Python ${run.python || "?"} · ${run.platform || ""}`],
  ];
  for (const [k, v] of rows) kv.append(el("div", {}, k), el("div", {}, v ?? "n/a"));
  const facts = el("table", { id: "facts" }, el("tr", {}, ...["fact", "value", "provenance", "origin", "note"].map((h) => el("th", {}, h))));
  for (const f of run.facts || []) {
    const scope = f.device || (f.rank !== undefined && f.rank !== null ? `rank ${f.rank}` : null);
    facts.append(el("tr", {}, el("td", {}, scope ? `${f.name} (${scope})` : f.name),
      el("td", { class: "num" }, factText(f)), el("td", {}, f.provenance),
      el("td", {}, f.origin), el("td", {}, [f.note, f.warning].filter(Boolean).join(" · "))));
  }
  const conv = el("table", { id: "flops-conventions" }, el("tr", {}, el("th", {}, "convention"), el("th", {}, "FLOPs per token"), el("th", {}, "")));
  for (const name of ["titan", "megatron", "hf", "all_params", "counted"]) {
    const m = metric(`flop_per_token.${name}`);
    conv.append(el("tr", {}, el("td", {}, name),
      el("td", { class: "num", "data-explain": `flop_per_token.${name}`, tabindex: 0 }, metricText(m, "flop_per_token")),
      el("td", { class: "muted" }, m && m.absent ? m.absent : "")));
  }
  const hardware = el("table", { id: "hardware" }, el("tr", {}, ...["device", "model", "dense peak", "tensor clock", "memory bandwidth"].map((h) => el("th", {}, h))));
  for (const f of run.facts || []) {
    if (f.name !== "gpu" || !f.value || typeof f.value !== "object") continue;
    const g = f.value;
    hardware.append(el("tr", {}, el("td", {}, f.device || `gpu${g.index}`),
      el("td", {}, g.display_name || g.name || "unknown"),
      el("td", {}, finite(g.dense_bf16_flop_per_s) ? `${si(g.dense_bf16_flop_per_s, "FLOP/s")} (BF16, datasheet)` : `n/a: ${g.peak_absent || "no datasheet figure"}`),
      el("td", {}, finite(g.tensor_clock_mhz) ? `${g.tensor_clock_mhz} MHz` : "n/a"),
      el("td", {}, finite(g.memory_bandwidth_bps) ? `${si(g.memory_bandwidth_bps)}B/s` : "n/a")));
  }
  for (const f of run.facts || []) {
    if (f.name !== "device" || !f.value || typeof f.value !== "object" || f.value.type === "cuda") continue;
    // A CPU (or other non-GPU) device of a rank: its peak is a declared or measured one (no datasheet gives it).
    const peak = devicePeak(run.facts, f.host, f.value.type, f.value);
    hardware.append(el("tr", {}, el("td", {}, `${f.host ? `${f.host}/` : ""}${f.value.type}, rank ${f.rank ?? 0}`),
      el("td", {}, `${f.value.type === "cpu" ? "CPU" : f.value.type} of the rank`),
      el("td", { title: peak && peak.source ? peak.source : "" }, peak
        ? `${si(peak.flop_per_s, "FLOP/s")} (${peak.label})`
        : `n/a: no datasheet gives a CPU's peak: measure one with ${peakCommand(f.value)}, or pass --peak-tflops X --peak-source TEXT`),
      el("td", {}, "n/a"), el("td", {}, "n/a")));
  }
  const plugins = el("table", {}, el("tr", {}, el("th", {}, "plugin"), el("th", {}, "distribution"), el("th", {}, "provides")));
  for (const p of run.plugins || []) {
    plugins.append(el("tr", {}, el("td", {}, p.name), el("td", {}, `${p.distribution || "?"} ${p.version || ""}`),
      el("td", {}, p.error ? `failed: ${p.error}` : (p.provides || []).join(", "))));
  }
  const warnings = (run.warnings || []).length
    ? el("ul", { class: "warning-list" }, ...run.warnings.map((w) => el("li", {}, w)))
    : null;
  const notices = (run.notices || []).length
    ? el("ul", { id: "notices" }, ...run.notices.map((n) => el("li", {}, `${n.level} · ${n.topic}: ${n.message}`)))
    : null;
  body.replaceChildren(kv, warnings || "", notices ? el("h3", {}, "Notices from the run's processes") : "", notices || "",
    el("h3", {}, "Facts"), facts, el("h3", {}, "FLOPs per token under every convention"),
    conv, el("h3", {}, "Hardware"), hardware, el("h3", {}, "Plugins"), plugins);
}

// The peak tm uses for a non-GPU device, as the engine resolves it: declared before measured, the device's own
// (host/type) before one for every device of that type; a measured one only if it was measured with the dtype and
// threads the device's rank computes with (``device``, its device fact's value).
export function devicePeak(facts, host, type, device) {
  const peaks = (facts || []).filter((f) => f.name === "peak" && f.value && typeof f.value === "object"
    && (f.device === `${host}/${type}` || (!f.device && [undefined, null, type].includes(f.value.device_type))));
  const rate = (f) => (finite(f.value.flop_per_s) ? f.value.flop_per_s : f.value.flops);
  const same = (a, b) => (a ?? null) === (b ?? null);
  const matches = (f) => !device || (same(f.value.dtype, device.dtype) && (type !== "cpu" || same(f.value.threads, device.threads)));
  for (const label of ["declared", "measured"]) {
    const found = peaks.filter((f) => (f.value.label || (f.provenance === "declared" ? "declared" : "measured")) === label
      && finite(rate(f)) && (label === "declared" || matches(f)));
    found.sort((a, b) => (a.device ? 0 : 1) - (b.device ? 0 : 1));
    if (found.length) return { flop_per_s: rate(found[0]), label, source: found[0].value.source || found[0].origin };
  }
  return null;
}

// The tm peak that measures the peak a device's rank needs: its threads on a CPU, its dtype where not the default.
function peakCommand(device) {
  const words = ["tm peak"];
  if (device && device.type === "cpu" && Number.isInteger(device.threads)) words.push(`--threads ${device.threads}`);
  if (device && device.dtype && device.dtype !== "float32") words.push(`--dtype ${device.dtype}`);
  return words.join(" ");
}

export function renderPassport() {
  const p = state.passport || {};
  setText($("passport"), p.markdown || `Not available: ${p.absent || "no passport yet"}.`);
  $("copy-passport").disabled = !p.markdown;
}
