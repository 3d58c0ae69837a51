// The top of the page: the header, progress, tiles and the training charts with their x-axis selector.
// Every MFU and FLOPs number names its convention; an absent number reads "n/a" with the input it lacks.

import { attemptsText, attemptsTitle } from "./attempts.js";
import { palette } from "./chart.js";
import { byUnit, clock, duration, finite, metricText, percent, si } from "./format.js";
import { nanMarks } from "./nan.js";
import { spark } from "./spark.js";
import { $, AXES, axisAvailable, card, catalog, charts, clearEmpty, el, emptyLine, LOOP_KNOWN, metric, numberFormat, plot, rawKeyNote, setText, stat, state, titleOf } from "./page.js";

export function renderConnection() {
  // A report says when it was written. A page says "live" only while the run runs: a finished (or lost) run is read
  // from its log, and its badge says so.
  if (state.asOf) return setText($("conn"), state.asOf);
  const over = state.doc && state.doc.status && ["finished", "lost"].includes(state.doc.status.state);
  setText($("conn"), over ? "" : state.connected ? "live" : "reconnecting…");
}

export function finished() {
  return Boolean(state.doc && state.doc.status && state.doc.status.state === "finished");
}

// A finished run leads with the number its summary line gave: the MFU averaged over its training window.
export function leadingMfuKey() {
  const avg = metric("mfu_avg");
  return finished() && avg && (finite(avg.value) || finite(avg.low)) ? "mfu_avg" : "mfu";
}

// The window a number covers, from the snapshot's window_start_t/window_end_t (monotonic, as wall clock times).
export function windowText(m) {
  const snap = state.doc && state.doc.snapshot;
  if (!m || !finite(m.window_start_t) || !finite(m.window_end_t) || !snap || !finite(snap.wall) || !finite(snap.t)) return "";
  const offset = snap.wall - snap.t;
  const start = clock(m.window_start_t + offset).split(", ").pop();
  const end = clock(m.window_end_t + offset).split(", ").pop();
  return `${start}–${end}, ${duration(m.window_end_t - m.window_start_t)}`;
}

export function rigText() {
  const facts = (state.doc && state.doc.snapshot.facts) || {};
  const gpus = Object.values(facts).filter((f) => f.name === "gpu" && f.value && typeof f.value === "object");
  if (gpus.length) {
    const names = {};
    for (const g of gpus) {
      const name = g.value.display_name || g.value.name || "GPU";
      names[name] = (names[name] || 0) + 1;
    }
    return Object.entries(names).map(([n, c]) => `${c} × ${n}`).join(", ");
  }
  const devices = Object.values(facts).filter((f) => f.name === "device" && f.value && typeof f.value === "object");
  if (devices.length) {
    const cpu = devices.filter((d) => d.value.type === "cpu").length;
    return cpu === devices.length ? `${cpu} × CPU` : `${devices.length} devices`;
  }
  return "no device reported";
}

// A resumed run's attempts, after the state badge; nothing for a run started once.
function renderAttempts() {
  let node = $("attempts");
  const text = attemptsText(state);
  if (!node) {
    if (!text) return;
    node = el("span", { id: "attempts", class: "muted" });
    $("run-state").after(node);
  }
  setText(node, text);
  node.title = attemptsTitle(state);
}

export function renderHeader() {
  if (!state.doc) return;
  const status = state.doc.status || {};
  const badge = $("run-state");
  let text = status.state || "starting";
  let cls = status.state || "starting";
  if (status.state === "finished") {
    text = `finished · exit ${status.exit_status}${status.signal_name ? ` (${status.signal_name})` : ""}`;
    if (status.exit_status !== 0) cls = "failed";
  }
  setText(badge, text);
  badge.className = `badge ${cls}`;
  renderAttempts();
  const run = state.run || {};
  setText($("run-name"), run.name ? `· ${run.name}` : "");
  document.title = run.name ? `${run.name} · trainmeter` : "trainmeter";
  setText($("rig"), rigText());
  const o = state.doc.overhead || {};
  const agent = finite(o.agent_us_per_step) ? `agent ${byUnit(o.agent_us_per_step, "")} µs/step` : "agent n/a";
  const drops = finite(o.dropped_total) ? `${o.dropped_total} dropped` : "drops n/a";
  setText($("overhead"), `tm overhead: ${agent} · ${drops}`);
}

export function renderProgress() {
  const progress = metric("progress");
  const bar = $("progress-bar");
  const value = progress && finite(progress.value) ? Math.max(0, Math.min(1, progress.value)) : 0;
  bar.style.width = `${(value * 100).toFixed(2)}%`;
  const sub = progress && finite(progress.value)
    ? `${percent(progress.value)} of the budget`
    : (progress && progress.absent) || "budget not declared: pass --budget-tokens";
  setText($("progress-sub"), `Is the run on plan? ${sub}`);
  const snap = state.doc.snapshot;
  const spent = metric("spent_flop");
  const required = metric("required_flop");
  const conv = (spent && spent.convention) || (required && required.convention);
  const tokensMetric = metric("tokens");
  const budget = (snap.facts || {}).budget_tokens;
  const stats = [
    stat("tokens", "tokens", metricText(tokensMetric, "tokens"),
      budget && finite(budget.value) ? `of ${si(budget.value)}` : "no token budget"),
    stat("FLOPs spent", "spent_flop", metricText(spent, "spent_flop"),
      `of ${metricText(required, "required_flop")}${conv ? ` · ${conv}` : " · range over conventions"}`),
    stat("ETA", "eta_s", metricText(metric("eta_s"), "eta_s")),
    stat("elapsed", "elapsed", duration(snap.elapsed_s)),
    stat("GPU-hours", "gpu_hours", metricText(metric("gpu_hours"), "gpu_hours")),
    stat("steps", "steps", String(snap.steps ?? 0)),
  ];
  $("progress-stats").replaceChildren(...stats);
}

export const TILES = [
  ["tokens_per_s", "tm:tokens_per_s"],
  ["step_time_s", "tm:step_time_s"],
  ["mfu", "tm:mfu"],
  ["ofu", "tm:ofu"],
  ["goodput", "tm:goodput"],
  ["flop_per_token", null],
];

export function tileLine(key, m) {
  if (!m) return "not computed yet";
  if (m.absent && !finite(m.value) && !finite(m.low)) {
    // one short line: the first missing input; the tooltip names them all
    const reasons = m.absent.split("; ");
    return reasons.length > 1 ? `${reasons[0]} (and ${reasons.length - 1} more)` : reasons[0];
  }
  const parts = [];
  if (key === "mfu_avg") {
    const window = windowText(m);
    parts.push(`average over the training window${window ? ` (${window})` : ""}, as in the summary`);
  }
  if (key === "mfu" || key === "mfu_avg" || key === "flop_per_token") {
    parts.push(...conventionWords(m, key));
  } else if (m.convention) parts.push(m.convention);
  if (m.label) parts.push(key.startsWith("mfu") && PEAK_LABELS.has(m.label) ? `${m.label} peak` : m.label);
  if (key === "mfu") {
    const avg = metric("mfu_avg");
    if (avg && (finite(avg.value) || finite(avg.low))) parts.push(`avg ${metricText(avg, "mfu_avg")}`);
  } else if (key === "mfu_avg") {
    const ema = metric("mfu");
    if (ema && (finite(ema.value) || finite(ema.low))) parts.push(`latest EMA ${metricText(ema, "mfu")}`);
  }
  return parts.join(" · ");
}

const CONVENTIONS = ["titan", "megatron", "hf", "all_params"];

// Which of the four conventions the run computed, and what each other one lacks (from flop_per_token.<convention>);
// null where the snapshot has no per-convention figures.
export function conventionsBasis() {
  const computed = [];
  const missing = {};
  for (const c of CONVENTIONS) {
    const m = metric(`flop_per_token.${c}`);
    if (!m) return null;
    if (finite(m.value)) computed.push(c);
    else missing[c] = m.absent || "not computed";
  }
  return { computed, missing };
}

// What a FLOPs or MFU number is under, in words: its convention and the conventions the run could not compute with
// what each lacks; or the conventions a range is over (or that agree on one number).
function conventionWords(m, key) {
  const basis = conventionsBasis();
  if (!m.convention) {
    const names = basis && basis.computed.length > 1 ? ` ${basis.computed.join(", ")}` : "";
    const one = finite(m.low) && !metricText(m, key).includes(" – "); // both ends read the same
    return [one && names ? `${names.trim()} agree (pass --convention)` : `range over the conventions${names} (pass --convention)`];
  }
  const words = [m.convention];
  if (basis && CONVENTIONS.includes(m.convention)) {
    const byReason = {};
    for (const [c, reason] of Object.entries(basis.missing)) (byReason[reason] = byReason[reason] || []).push(c);
    for (const [reason, convs] of Object.entries(byReason)) words.push(`${convs.join(", ")} not computed: ${reason}`);
  }
  return words;
}

// Labels that name where an MFU's peak came from (anything else is said as the engine wrote it).
const PEAK_LABELS = new Set(["datasheet", "declared", "measured"]);

export function renderTiles() {
  const root = $("tiles");
  for (const [key, seriesName] of TILES) {
    let tile = document.getElementById(`tile-${key}`);
    if (!tile) {
      tile = el("div", { class: "card tile", id: `tile-${key}` },
        el("h3", {}, titleOf(key)),
        el("div", { class: "value num", "data-explain": key, "data-metric": key, tabindex: 0 }),
        el("div", { class: "line" }));
      if (seriesName) tile.append(el("canvas", { class: "spark", "aria-hidden": "true" }));
      root.append(tile);
    }
    const shown = key === "mfu" ? leadingMfuKey() : key;
    const m = metric(shown);
    const valueEl = tile.querySelector(".value");
    setText(valueEl, metricText(m, shown));
    valueEl.dataset.value = m && finite(m.value) ? String(m.value) : m && finite(m.low) ? `${m.low},${m.high}` : "";
    valueEl.dataset.explain = shown;
    valueEl.dataset.metric = shown;
    setText(tile.querySelector(".line"), tileLine(shown, m));
    const canvas = tile.querySelector("canvas");
    if (canvas) {
      let points = state.series[seriesName];
      if (!points && key === "mfu") points = state.series["tm:mfu.high"];
      spark(canvas, points || [], palette(TILES.findIndex((t) => t[0] === key)));
    }
  }
}

export function renderAxisButtons() {
  for (const button of document.querySelectorAll("#x-axis button")) {
    const axis = button.dataset.axis;
    const why = axisAvailable(axis);
    button.disabled = Boolean(why) && axis !== state.axis;
    button.title = why || `every chart against ${AXES[axis]}`;
    button.setAttribute("aria-pressed", axis === state.axis ? "true" : "false");
  }
}

export function renderTraining() {
  const root = $("training-charts");
  const drawn = [];
  const lossLines = [
    { name: "train_loss", label: "train loss", color: palette(0) },
    { name: "val_loss", label: "val loss", color: palette(1) },
  ];
  const lossSub = ["train_loss", "val_loss"].filter((n) => catalog()[n]).map(rawKeyNote).join(" · ");
  const nan = nanMarks(lossLines, () => renderTraining());
  drawn.push(plot(root, "chart-loss", "Loss", lossSub, lossLines, numberFormat, null,
    { robust: true, logToggle: true, marks: nan.marks, notes: nan.notes }));
  const tps = metric("tokens_per_s");
  drawn.push(plot(root, "chart-tokens-per-s", "Tokens/s", tps && tps.label ? `${tps.label} over steps` : "",
    [{ name: "tm:tokens_per_s", label: "tokens/s" }], (v) => si(v)));
  const mfu = metric("mfu");
  const plan = metric("plan_mfu");
  const mfuSub = mfu
    ? `MFU ${mfu.convention || "range over the conventions"}${mfu.label ? ` · ${mfu.label} peak` : ""} · OFU from counters`
    : "";
  drawn.push(plot(root, "chart-mfu-ofu", "MFU against OFU", mfuSub, [
    { name: "tm:mfu", label: `MFU (${(mfu && mfu.convention) || "convention"})`, color: palette(0) },
    { name: "tm:mfu.low", label: "MFU, lowest convention", color: palette(0) },
    { name: "tm:mfu.high", label: "MFU, highest convention", color: palette(2) },
    { name: "tm:ofu", label: "OFU (counters)", color: palette(1) },
  ], percent, plan && finite(plan.value) ? { value: plan.value, label: `plan ${percent(plan.value)}` } : null));
  drawn.push(plot(root, "chart-lr", "Learning rate", catalog().lr ? rawKeyNote("lr") : "",
    [{ name: "lr", label: "lr" }], numberFormat));
  drawn.push(plot(root, "chart-grad-norm", "Gradient norm", catalog().grad_norm ? rawKeyNote("grad_norm") : "",
    [{ name: "grad_norm", label: "grad norm" }], numberFormat));
  const custom = Object.entries(catalog()).filter(([n, e]) => e.group === "loop" && !LOOP_KNOWN.has(n)).map(([n]) => n).sort();
  const keep = new Set(custom.map((n) => `chart-series-${n}`));
  for (const [id, chart] of charts) {
    if (id.startsWith("chart-series-") && !keep.has(id)) {
      chart.remove();
      charts.delete(id);
    }
  }
  for (const name of custom) {
    drawn.push(plot(root, `chart-series-${name}`, name, `custom series ${rawKeyNote(name)}`,
      [{ name, label: name }], numberFormat));
  }
  renderPlanCard(root);
  if (!drawn.some(Boolean)) {
    emptyLine(root, "training-empty", "Nothing to draw yet: steps and emit(train_loss=...) fill this part.");
  } else clearEmpty("training-empty");
}

export function renderPlanCard(root) {
  let card = $("plan-card");
  const planMfu = metric("plan_mfu");
  const planHours = metric("plan_hours");
  const declared = (planMfu && finite(planMfu.value)) || (planHours && finite(planHours.value));
  if (!declared) {
    if (card) card.remove();
    return;
  }
  if (!card) {
    card = el("div", { class: "card", id: "plan-card" }, el("h3", {}, "Plan against actual"),
      el("p", { class: "sub" }, "declared with --plan-mfu and --plan-hours"), el("div", { class: "stats" }));
    root.append(card);
  }
  card.querySelector(".stats").replaceChildren(
    stat("planned MFU", "plan_mfu", metricText(planMfu, "plan_mfu")),
    stat("measured MFU", "mfu", metricText(metric("mfu"), "mfu"), (metric("mfu") || {}).convention || ""),
    stat("planned hours", "plan_hours", metricText(planHours, "plan_hours")),
    stat("projected hours", "projected_hours", metricText(metric("projected_hours"), "projected_hours")),
  );
}
